"""`broker dump` on real damaged partition directories: every kind of damage is named and makes the
exit status 1, including what the crc cannot see (base offsets) and index damage; a healthy
directory exits 0."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.cli import main
from broker.storage.index import ENTRY_SIZE, INDEX_HEADER_SIZE, encode_entry
from broker.storage.log import Log, LogConfig
from labkit.poison_batches import poison_batch
from ringlog_proto.batch import encode_batch, read_header

SEG0 = "00000000000000000000"
SEG1 = "00000000000000000008"  # 4 batches of 2 records per segment (segment_bytes below)
BATCH_SIZE = len(encode_batch([b"x" * 40, b"y" * 40], timestamp=1000))  # every batch of make_log


def make_log(path: Path, *, poison: bool = False) -> None:
    batch = encode_batch([b"x" * 40, b"y" * 40], timestamp=1000)
    config = LogConfig(segment_bytes=4 * len(batch), max_batch_bytes=len(batch))
    if poison:  # the only way to plant one through the engine: switch the walk off
        config = LogConfig(segment_bytes=4 * len(batch), max_batch_bytes=len(batch), check_records=False)
    log = Log.open(str(path), config)
    try:
        for i in range(8):
            if poison and i == 2:
                log.append(poison_batch("count_below_records"))  # 3 records framed, 2 counted
            else:
                log.append(encode_batch([b"x" * 40, b"y" * 40], timestamp=1000 + i))
    finally:
        log.close()


def dump(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["dump", str(path)])
    return rc, capsys.readouterr().out


def batch_positions(store: Path) -> list[int]:
    data = store.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += read_header(data, pos).size
    return out


def patch(path: Path, pos: int, raw: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(raw)


def base_offset_backwards(d: Path) -> None:
    store = d / f"{SEG0}.log"
    patch(store, batch_positions(store)[2], struct.pack(">q", 1))  # outside the crc


def base_offset_off_name(d: Path) -> None:
    store = d / f"{SEG1}.log"
    patch(store, 0, struct.pack(">q", 9))


def segment_renamed(d: Path) -> None:  # the name disagrees with the batches inside
    os.rename(d / f"{SEG1}.log", d / "00000000000000000006.log")
    os.rename(d / f"{SEG1}.index", d / "00000000000000000006.index")


def index_entry_bit_flip(d: Path) -> None:
    index = d / f"{SEG0}.index"
    raw = bytearray(index.read_bytes())
    raw[INDEX_HEADER_SIZE + ENTRY_SIZE + 5] ^= 0x10
    index.write_bytes(bytes(raw))


def index_truncated_mid_entry(d: Path) -> None:
    index = d / f"{SEG0}.index"
    os.truncate(index, os.path.getsize(index) - 10)


def index_missing_last_entry(d: Path) -> None:
    index = d / f"{SEG1}.index"
    os.truncate(index, os.path.getsize(index) - ENTRY_SIZE)


def index_entry_wrong_position(d: Path) -> None:  # a valid crc over a wrong position
    index = d / f"{SEG0}.index"
    patch(index, INDEX_HEADER_SIZE + 2 * ENTRY_SIZE, encode_entry(4, 2 * BATCH_SIZE + 6, 1002, 0))


def index_header_wrong_base(d: Path) -> None:
    patch(d / f"{SEG1}.index", 8, struct.pack(">q", 3))


def index_deleted(d: Path) -> None:
    os.unlink(d / f"{SEG0}.index")


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "base_offset_backwards": (base_offset_backwards, "base offset 1, expected 4 from the previous batch"),
    "base_offset_off_name": (base_offset_off_name, "base offset 9, expected 8 from the segment's name"),
    "segment_renamed": (segment_renamed, "expected 6 from the segment's name"),
    "index_entry_bit_flip": (index_entry_bit_flip, "entry 1 fails its crc"),
    "index_truncated_mid_entry": (index_truncated_mid_entry, "partial entry"),
    "index_missing_last_entry": (index_missing_last_entry, "3 entries for 4 batches"),
    "index_entry_wrong_position": (
        index_entry_wrong_position,
        f"entry 2 says offset 4 at byte {2 * BATCH_SIZE + 6}, "
        f"the store has offset 4 at byte {2 * BATCH_SIZE}",
    ),
    "index_header_wrong_base": (index_header_wrong_base, "index base offset 3 does not match segment 8"),
    "index_deleted": (index_deleted, f"{SEG0}.index: missing"),
}


def test_a_healthy_directory_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_log(tmp_path / "p")
    rc, out = dump(tmp_path / "p", capsys)
    assert rc == 0, out
    assert "DAMAGED" not in out and out.count("consistent with the store") == 2


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_damage_is_named_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    d = tmp_path / "p"
    make_log(d)
    damage, expected = DAMAGE[name]
    damage(d)
    rc, out = dump(d, capsys)
    assert rc == 1, out
    assert "DAMAGED" in out and expected in out, out


def test_a_stored_poison_batch_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_log(tmp_path / "p", poison=True)
    rc, out = dump(tmp_path / "p", capsys)
    assert rc == 1, out
    assert "the records do not frame" in out and "bytes left after record_count" in out, out
