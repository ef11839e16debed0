"""Mapped reads (`native.map_file`, `native.resident`, `Segment.mapped`) against the real kernel:
a mapping shows the file's bytes (and writes made after it), never lets a write through, stays
valid after its file is closed while a view of it is alive, and mincore says which pages may be
touched: cached ones, not pages evicted or past the file's end."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

import pytest

from broker.storage.fdcache import FdCache
from broker.storage.fileio import SyncFileIO
from broker.storage.segment import Extent, Segment
from native import map_file, probe, resident

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring bindings unavailable: {probe()}")

PAGE = os.sysconf("SC_PAGESIZE")


def test_a_mapping_shows_the_file_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * PAGE + b"b" * 10)
    fd = os.open(path, os.O_RDWR)
    try:
        view = map_file(fd, 4 * PAGE)  # longer than the file: allowed, untouched past its end
        assert bytes(view[PAGE - 2 : PAGE + 2]) == b"aabb"
        os.pwrite(fd, b"XY", 1)  # a write after the mapping is seen through it (one page cache)
        assert bytes(view[:4]) == b"aXYa"
        assert view.readonly
        with pytest.raises(TypeError):
            view[0] = 1  # type: ignore[index]
    finally:
        os.close(fd)
    assert bytes(view[PAGE : PAGE + 10]) == b"b" * 10  # the mapping needs no descriptor


def test_resident_says_no_past_the_end_and_for_evicted_pages(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(8 * PAGE))
    fd = os.open(path, os.O_RDWR)
    try:
        view = map_file(fd, 16 * PAGE)
        assert resident(view[: 8 * PAGE])  # just written: in the page cache
        assert not resident(view[7 * PAGE : 9 * PAGE])  # its second page is past the end
        assert not resident(view[12 * PAGE : 13 * PAGE])
        os.fsync(fd)  # clean pages can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not resident(view[: 8 * PAGE])
        os.pread(fd, 8 * PAGE, 0)  # read back in
        assert resident(view[: 8 * PAGE])
        assert resident(view[3:5])  # unaligned starts and lengths are rounded out to pages
    finally:
        os.close(fd)


def test_the_mapping_is_released_with_its_last_view(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"z" * PAGE)
    fd = os.open(path, os.O_RDONLY)
    try:
        view = map_file(fd, PAGE)
    finally:
        os.close(fd)
    part = view[10:20]
    obj = weakref.ref(view.obj)  # the buffer that owns the mapping
    del view
    gc.collect()
    assert obj() is not None and bytes(part) == b"z" * 10  # a slice keeps it mapped
    del part
    gc.collect()
    assert obj() is None


def test_a_segment_maps_its_store_once_and_remaps_when_it_grew(tmp_path: Path) -> None:
    cache = FdCache(16)
    seg = Segment.create(str(tmp_path), 0, SyncFileIO(), cache)
    try:
        os.pwrite(seg.store_fd, b"0123456789", 0)
        seg.allocated = 10
        maps: list[int] = []

        def counting_map(fd: int, length: int) -> memoryview:
            maps.append(length)
            return map_file(fd, length)

        first = seg.mapped(Extent(seg, 2, 4, 0), counting_map)
        assert bytes(first) == b"2345"
        assert bytes(seg.mapped(Extent(seg, 0, 10, 0), counting_map)) == b"0123456789"
        assert maps == [10]  # the same mapping
        os.pwrite(seg.store_fd, b"abcdef", 10)
        seg.allocated = 16
        assert bytes(seg.mapped(Extent(seg, 8, 8, 0), counting_map)) == b"89abcdef"
        assert maps == [10, 16]  # grown past the mapping: mapped again
        seg.close_files()  # the descriptor cache evicting: the views made before stay readable
        assert bytes(first) == b"2345"
        assert bytes(seg.mapped(Extent(seg, 0, 2, 0), counting_map)) == b"01"
        assert maps == [10, 16, 16]  # reopened and mapped afresh
    finally:
        seg.close()
