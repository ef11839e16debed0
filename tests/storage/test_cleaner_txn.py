"""The log cleaner and transactions (broker/storage/cleaner.py's rules, Kafka's LogCleaner with
`CleanedTransactionMetadata` and KIP-534's horizon for markers): a partition holding committed,
aborted and open transactions among plain records is cleaned as the core cleans it, and the
state rebuilt from the cleaned log (a reopen) holds the same open transactions, last stable
offset and read_committed view, with nothing aborted visible; a clean killed at any step with
markers in the log leaves the old log or the new. Transactional batches are produced with the
partition's allow switch: the wire still refuses them."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from txn_kit import IO, KEYS, PIDS, Writer, check_files, committed_view

from broker.core.partition import Partition
from broker.storage import log_cleaning
from broker.storage.cleaner import clean, no_steps
from broker.storage.diskspace import DiskSpace
from broker.storage.log import LogConfig
from broker.storage.log_cleaning import CleanerCheckpoint
from broker.storage.offset_map import OffsetMap
from broker.storage.throttle import Throttle
from ringlog_proto.batch import iter_batches

DAY_MS = 24 * 3600 * 1000
CONFIG = LogConfig(
    segment_bytes=700,
    max_batch_bytes=700,
    retention_ms=None,
    cleanup_policy="compact",
    min_cleanable_dirty_ratio=0.0,
)


def state(p: Partition) -> tuple[dict[int, int], int, dict[bytes, bytes]]:
    view, _ = committed_view(p)
    return p.producers.ongoing(), p.last_stable_offset, view


def clean_partition(p: Partition, now: int, steps: Callable[[str], None] = no_steps) -> bool:
    """One clean of `p` as the core runs it (broker/core/cleaning.py), on this thread."""
    cp = CleanerCheckpoint()
    d = log_cleaning.assess(p.log, cp, now, p.high_watermark, p.last_stable_offset)
    planned = log_cleaning.plan(
        p.log, d, now, p.producers.last_offsets(), p.producers.last_markers(), p.aborted.entries()
    )
    if planned is None:
        return False
    result = clean(planned.plan, OffsetMap(1 << 20), IO, Throttle(None), steps)
    if not log_cleaning.install(p.log, planned, result, steps):
        return False
    for group in result.groups:
        p.aborted.replace_between(group.base_offset, group.replaces[-1].next_offset, group.aborted)
    return True


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("plain"), st.sampled_from(KEYS), st.booleans()),
        st.tuples(st.just("txn"), st.sampled_from(PIDS), st.sampled_from(KEYS), st.booleans()),
        st.tuples(st.just("end"), st.sampled_from(PIDS), st.booleans()),
    ),
    min_size=5,
    max_size=60,
)


def write_ops(w: Writer, ops: list) -> tuple[set[bytes], set[bytes]]:
    """Run `ops`; returns the values written in aborted transactions and in open ones."""
    values: dict[int, list[bytes]] = {pid: [] for pid in PIDS}
    aborted: set[bytes] = set()
    for i, op in enumerate(ops):
        if op[0] == "plain":
            w.plain(op[1], None if op[2] and i % 3 == 0 else b"p%d" % i)
        elif op[0] == "txn":
            w.txn(op[1], op[2], op[3] and i % 4 == 0)
            values[op[1]].append(b"%d-%d" % (op[1], w.n))
        elif op[1] in w.open:
            w.end(op[1], op[2])
            if not op[2]:
                aborted.update(values[op[1]])
            values[op[1]] = []
    return aborted, {v for pid in w.open for v in values[pid]}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, ends=st.lists(st.booleans(), min_size=3, max_size=3), more=OPS)
def test_cleaning_keeps_transactions_right(tmp_path: Path, ops: list, ends: list[bool], more: list) -> None:
    """`ops`, then the transactions they left open end (`ends`: commit or abort), then `more`
    (what they leave open stays open): the cleanable range holds every kind. Cleaned once, then
    again past the markers' delete horizon (from the state the reopen rebuilt)."""
    directory = tmp_path / f"p{time.monotonic_ns()}"
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(directory), CONFIG)
    w = Writer(p, space)
    aborted, _ = write_ops(w, ops + [("end", pid, commit) for pid, commit in zip(PIDS, ends, strict=True)])
    more_aborted, open_values = write_ops(w, more)
    aborted |= more_aborted
    for i in range(8):  # roll past it all: what is stable is cleanable
        w.plain(b"z", b"tail%d" % i + b"." * 100)
    before = state(p)
    _, seen = committed_view(p)
    assert not seen & aborted and not seen & open_values
    now = int(time.time() * 1000)
    for when, what in ((now, "cleaned"), (now + 2 * DAY_MS, "cleaned past the horizon")):
        event(f"{what}: {clean_partition(p, when)}")
        assert state(p) == before, f"{what}, in memory"
        p.close()
        p = Partition(1, 0, str(directory), CONFIG)
        assert state(p) == before, f"{what}, rebuilt from the cleaned log"
        _, seen = committed_view(p)
        assert not seen & aborted, "no aborted record reaches read_committed"
    p.close()
    shutil.rmtree(directory)


def test_aborted_records_go_and_markers_go_after_their_horizon(tmp_path: Path) -> None:
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(tmp_path / "p"), CONFIG)
    w = Writer(p, space)
    w.plain(b"a", b"plain-a")  # 0
    w.txn(7, b"a", False)  # 1: aborted, yet the last of key a
    w.end(7, False)  # 2
    w.txn(8, b"b", False)  # 3: committed
    w.end(8, True)  # 4
    w.txn(8, b"b", False)  # 5: committed, replaces 3
    w.end(8, True)  # 6
    w.txn(7, b"c", False)  # 7: committed (producer 7's last batch now)
    w.end(7, True)  # 8
    w.plain(b"d", b"x" * 600)  # 9: rolls
    w.txn(9, b"c", False)  # 10: open
    w.plain(b"d", b"y" * 600)  # 11: rolls
    assert p.last_stable_offset == 10 and p.log.segments[1].base_offset == 9
    assert [e.last_offset for e in p.aborted.entries()] == [2]
    now = int(time.time() * 1000)
    assert clean_partition(p, now)
    kept = {h.base_offset: h for _, h in iter_batches(everything(p))}
    assert kept[0].record_count == 1, "key a's value stays: the aborted record hid nothing"
    assert 1 not in kept, "an aborted record goes whatever its key"
    assert 3 not in kept
    assert kept[2].delete_horizon_ms == now + CONFIG.delete_retention_ms, "no batch of its txn left"
    assert kept[4].delete_horizon_ms == now + CONFIG.delete_retention_ms
    assert kept[6].delete_horizon_ms is None and kept[8].delete_horizon_ms is None, "their batches stay"
    assert 10 in kept, "past the last stable offset: not cleaned"
    assert p.aborted.entries() == [], "its marker's transaction left nothing to skip"
    assert clean_partition(p, now + CONFIG.delete_retention_ms)
    kept = {h.base_offset: h for _, h in iter_batches(everything(p))}
    assert sorted(kept) == [0, 5, 6, 7, 8, 9, 10, 11]
    assert committed_view(p)[0] == {b"a": b"plain-a", b"b": b"8-3", b"c": b"7-4", b"d": b"x" * 600}
    p.close()


def everything(p: Partition) -> bytes:
    out = b""
    offset = p.log.start_offset
    while offset < p.log.end_offset:
        r = p.log.read(offset, 1 << 20)
        out += r.data
        offset = r.next_offset
    return out


# ----------------------------------------------------------------------------- kill -9 mid-clean

STEPS = (
    "map-built",
    "cleaned-written",
    "cleaned-synced",
    "index-swap",
    "store-swap",
    "committed",
    "replaced-removed",
    "index-renamed",
    "store-renamed",
    "swapped",
)


def make_txn_log(directory: Path) -> None:
    space = DiskSpace(str(directory.parent), 0)
    p = Partition(1, 0, str(directory), CONFIG)
    w = Writer(p, space)
    for i in range(30):
        pid = PIDS[i % 3]
        w.txn(pid, KEYS[i % 4], False)
        w.plain(KEYS[(i + 1) % 4], b"p%d" % i + b"." * 40)
        if i % 3 == 2:
            for pid in PIDS:
                w.end(pid, commit=pid != 8)
    w.txn(9, b"a", False)  # left open
    for i in range(6):
        w.plain(b"z", b"tail%d" % i + b"." * 100)
    p.close()


def crash_at(directory: Path, step: str, occurrence: int, now: int) -> bool:
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            seen: dict[str, int] = {}

            def steps(name: str) -> None:
                seen[name] = seen.get(name, 0) + 1
                if name == step and seen[name] == occurrence:
                    os._exit(9)

            p = Partition(1, 0, str(directory), CONFIG)
            clean_partition(p, now, steps)
            p.log.abandon()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    code = os.WEXITSTATUS(status)
    assert code in (0, 9), "the child failed before its step"
    return code == 9


def served(directory: Path) -> tuple[tuple, bytes]:
    p = Partition(1, 0, str(directory), CONFIG)
    try:
        check_files(p, directory)  # every `.txnindex` left describes its segment as it is
        return state(p), everything(p)
    finally:
        p.close()


@pytest.mark.slow
def test_a_clean_killed_at_any_step_with_markers_leaves_the_old_log_or_the_new(tmp_path: Path) -> None:
    source = tmp_path / "src" / "p"
    source.parent.mkdir()
    make_txn_log(source)
    now = int(time.time() * 1000)
    old_state, old_bytes = served(source)
    shutil.copytree(source, tmp_path / "clean")
    p = Partition(1, 0, str(tmp_path / "clean"), CONFIG)
    assert clean_partition(p, now)
    p.close()
    new_state, new_bytes = served(tmp_path / "clean")
    assert new_bytes != old_bytes and new_state == old_state
    for step in STEPS:
        for occurrence in (1, 2):
            work = tmp_path / f"{step}-{occurrence}"
            shutil.copytree(source, work)
            if not crash_at(work, step, occurrence, now):
                continue
            got_state, got_bytes = served(work)
            assert got_bytes in (old_bytes, new_bytes), f"killed at {step} #{occurrence}: a mix"
            assert got_state == old_state
            assert not [n for n in os.listdir(work) if n.endswith((".cleaned", ".swap"))]
            shutil.rmtree(work)
