"""A data dir written by ringlog's record batch format 1 (before Kafka's RecordBatch v2) is refused
with a clear message, and left exactly as it was: never taken for a torn tail and cut."""

from __future__ import annotations

from pathlib import Path

import pytest
from legacy_format import legacy_store

from broker.cli import main
from broker.storage import layout
from broker.storage.dataformat import check_data_format, find_legacy_store
from broker.storage.errors import LegacyFormatError
from broker.storage.index import encode_header
from broker.storage.log import Log
from ringlog_proto.batch import encode_batch


def plant_legacy_partition(directory: Path, bases: tuple[int, ...] = (0,)) -> dict[Path, bytes]:
    """Segments of format 1 as the old broker left them (an index with only its header: the old
    index format is the same), and the bytes of every file, to check nothing changed."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for base in bases:
        store = directory / layout.store_file_name(base)
        store.write_bytes(legacy_store([[b"a", b"bb"], [b"ccc"]], base_offset=base))
        index = directory / layout.index_file_name(base)
        index.write_bytes(encode_header(base))
        files[store] = store.read_bytes()
        files[index] = index.read_bytes()
    return files


@pytest.mark.parametrize("bases", [(0,), (0, 3)])
def test_opening_a_format_1_log_raises_and_changes_nothing(tmp_path: Path, bases: tuple[int, ...]) -> None:
    """Whether the format-1 segment is the active one (always recovered) or a closed one (its tail
    check fails, then recovery): the error comes before anything is cut or rewritten."""
    d = tmp_path / "p"
    files = plant_legacy_partition(d, bases)
    with pytest.raises(LegacyFormatError, match=r"format 1.*RecordBatch v2"):
        Log.open(str(d))
    assert {p: p.read_bytes() for p in files} == files
    assert sorted(p.name for p in d.iterdir()) == sorted(p.name for p in files)


def test_the_data_dir_check_finds_a_format_1_partition_among_new_ones(tmp_path: Path) -> None:
    data = tmp_path / "data"
    new = Log.open(layout.partition_dir(str(data), 1, 0))
    new.append(encode_batch([b"x"]))
    new.close()
    assert find_legacy_store(str(data)) is None
    check_data_format(str(data))
    files = plant_legacy_partition(Path(layout.partition_dir(str(data), 2, 1)))
    found = find_legacy_store(str(data))
    assert found is not None and Path(found) in files
    with pytest.raises(LegacyFormatError, match="does not convert old data dirs"):
        check_data_format(str(data))


def test_broker_dump_names_a_format_1_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "p"
    plant_legacy_partition(d)
    assert main(["dump", str(d)]) == 1
    out = capsys.readouterr().out
    assert "format 1" in out and "not damaged" in out
