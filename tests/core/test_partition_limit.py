"""`--max-partitions auto` (broker/core/limits.py): derived from the host's memory (a quarter of
MemTotal at 16 KiB a partition, at most 1 000 000), an explicit number kept, the open-file limit
lowering either at start with the log saying what bound it. A fake /proc/meminfo stands for hosts."""

from __future__ import annotations

import argparse
import logging
import resource
from pathlib import Path

import pytest

from broker.core.limits import (
    MAX_PARTITIONS_AUTO,
    PARTITIONS_AUTO_MAX,
    PARTITIONS_MEMORY_UNKNOWN,
    Limits,
    add_limit_arguments,
    derive_partition_limit,
    limits_from_args,
    memory_total_bytes,
    partition_limit,
)
from broker.node import startup

GIB = 1 << 30


def meminfo(tmp_path: Path, total_kb: int) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {total_kb} kB\nMemFree:        1234 kB\nMemAvailable:   99 kB\n")
    return str(path)


def test_auto_is_a_quarter_of_the_memory_at_16_kib_a_partition(tmp_path: Path) -> None:
    assert Limits().max_partitions == MAX_PARTITIONS_AUTO
    path = meminfo(tmp_path, 24 * GIB // 1024)  # this machine's 24 GB
    assert memory_total_bytes(path) == 24 * GIB
    derived, why = derive_partition_limit(Limits(), path)
    assert derived.max_partitions == 24 * GIB // 4 // (16 * 1024) == 393_216
    assert "memory" in why and "24576 MiB" in why
    small, _ = derive_partition_limit(Limits(), meminfo(tmp_path, 1024 * 1024))  # 1 GiB
    assert small.max_partitions == 16_384


def test_auto_stops_at_a_million_and_falls_back_without_meminfo(tmp_path: Path) -> None:
    huge, why = derive_partition_limit(Limits(), meminfo(tmp_path, 256 * GIB // 1024))
    assert huge.max_partitions == PARTITIONS_AUTO_MAX == 1_000_000 and "ceiling" in why
    unknown, why = derive_partition_limit(Limits(), str(tmp_path / "absent"))
    assert unknown.max_partitions == PARTITIONS_MEMORY_UNKNOWN and "unreadable" in why
    garbled = tmp_path / "garbled"
    garbled.write_text("MemTotal: lots\n")
    assert derive_partition_limit(Limits(), str(garbled))[0].max_partitions == PARTITIONS_MEMORY_UNKNOWN


def test_an_explicit_number_wins_over_auto(tmp_path: Path) -> None:
    explicit, why = derive_partition_limit(Limits(max_partitions=123), meminfo(tmp_path, 24 * GIB // 1024))
    assert explicit.max_partitions == 123 and why == "--max-partitions 123"
    assert partition_limit(Limits(max_partitions=123)) == 123
    assert partition_limit(Limits()) >= 1  # a core made without the supervisor derives it itself


def test_the_command_line_takes_auto_or_a_positive_number() -> None:
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser)
    assert limits_from_args(parser.parse_args([])).max_partitions == MAX_PARTITIONS_AUTO
    assert limits_from_args(parser.parse_args(["--max-partitions", "auto"])).max_partitions == 0
    assert limits_from_args(parser.parse_args(["--max-partitions", "5000"])).max_partitions == 5000
    for bad in ("0", "-3", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--max-partitions", bad])
    assert "(default auto)" in " ".join(parser.format_help().split())


def test_the_open_file_limit_leaves_auto_alone_and_the_log_says_what_bound_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Partitions hold no descriptor of their own (the segment cache bounds them), so the
    open-file limit sizes the cache and connections, never the partition limit: auto stays
    what the memory gives, an explicit number stays itself, and the log says which."""
    path = meminfo(tmp_path, 24 * GIB // 1024)
    monkeypatch.setattr(startup, "derive_partition_limit", lambda lim: derive_partition_limit(lim, path))
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (20_000, 20_000))
    with caplog.at_level(logging.INFO, logger="broker.node.supervisor"):
        fitted = startup.raise_nofile_limit(Limits())
    assert fitted.max_partitions == 393_216
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("partition limit"))
    assert line.startswith("partition limit 393216 (--max-partitions auto: memory"), line
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warned, "defaults fitted to the open-file limit are said, not warned"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="broker.node.supervisor"):
        fitted = startup.raise_nofile_limit(Limits(max_partitions=4000))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("partition limit"))
    assert fitted.max_partitions == 4000 and line == "partition limit 4000 (--max-partitions 4000)"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="broker.node.supervisor"):
        startup.raise_nofile_limit(Limits(max_connections_per_core=15_000))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [w for w in warned if w.startswith("--max-connections-per-core 15000 lowered to")], warned
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (2_000_000, 2_000_000))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="broker.node.supervisor"):
        fitted = startup.raise_nofile_limit(Limits())
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("partition limit"))
    assert fitted.max_partitions == 393_216 and "memory" in line, line
