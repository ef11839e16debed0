"""A clean killed at every one of its steps (broker/storage/cleaner.py, log_cleaning.py): a child
process runs the clean and leaves with `os._exit` (no cleanup, no flush: what kill -9 leaves) at
one step, then the log reopens (log_recovery.py `finish_swaps`) and serves either every record it
had or exactly what the clean makes, never a mix and never a loss, with no clean's file left;
the next clean finishes the job, and `broker dump` finds nothing damaged."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from compaction_kit import COMPACT, Model, clean_round, read_all

from broker.cli import main
from broker.storage.log import Log
from broker.storage.log_cleaning import CleanerCheckpoint

# Each step a clean reports and each time it comes in a clean of the log below: once per clean,
# or once per group (the log's clean writes three groups).
ONCE = ("map-built", "committed", "swapped")
PER_GROUP = (
    "cleaned-written",
    "cleaned-synced",
    "index-swap",
    "store-swap",
    "replaced-removed",
    "index-renamed",
    "store-renamed",
)
CRASH_POINTS = [(step, 1) for step in ONCE] + [(step, k) for step in PER_GROUP for k in (1, 2, 3)]


def make_log(directory: Path) -> Model:
    log_ = Log.open(str(directory), COMPACT)
    model = Model()
    for i in range(240):
        key = b"k%d" % (i % 23)
        value = None if i % 17 == 5 else b"v%d" % i * 8
        if i % 50 == 0:
            model.append(log_, [(key, value)], producer_id=4, producer_epoch=0, base_sequence=i // 50)
        else:
            model.append(log_, [(key, value), (b"x%d" % (i % 3), b"w" * 90)])
    log_.close()
    return model


def cleaned(directory: Path) -> dict[int, tuple[bytes | None, bytes | None]]:
    log_ = Log.open(str(directory), COMPACT)
    try:
        assert clean_round(log_, CleanerCheckpoint(), producers_last={4: 200}).ok
        return read_all(log_)
    finally:
        log_.close()


def crash_at(directory: Path, step: str, occurrence: int) -> bool:
    """Run a clean of `directory` in a child that dies at the `occurrence`-th `step`; whether it
    died there (False: the clean has fewer such steps, and finished)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            seen = {}

            def steps(name: str) -> None:
                seen[name] = seen.get(name, 0) + 1
                if name == step and seen[name] == occurrence:
                    os._exit(9)

            log_ = Log.open(str(directory), COMPACT)
            clean_round(log_, CleanerCheckpoint(), producers_last={4: 200}, steps=steps)
            log_.abandon()  # as a kill leaves it: nothing more written
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    code = os.WEXITSTATUS(status)
    assert code in (0, 9), "the child failed before its step"
    return code == 9


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    base = tmp_path_factory.mktemp("original")
    model = make_log(base / "p")
    log_ = Log.open(str(base / "p"), COMPACT)
    old = read_all(log_)
    log_.close()
    assert old == model.records
    shutil.copytree(base / "p", base / "clean")
    new = cleaned(base / "clean")
    assert new != old
    return base / "p", old, new


@pytest.mark.slow
@pytest.mark.parametrize(("step", "occurrence"), CRASH_POINTS)
def test_a_clean_killed_at_any_step_leaves_the_old_log_or_the_new(
    original: tuple[Path, dict, dict],
    tmp_path: Path,
    step: str,
    occurrence: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, old, new = original
    work = tmp_path / "p"
    shutil.copytree(source, work)
    assert crash_at(work, step, occurrence), f"a clean of this log has fewer than {occurrence} {step!r} steps"
    log_ = Log.open(str(work), COMPACT)
    served = read_all(log_)
    assert served in (old, new), f"killed at {step} #{occurrence}: a mix"
    assert not [n for n in os.listdir(work) if n.endswith((".cleaned", ".swap"))]
    log_.close()
    assert main(["dump", str(work)]) == 0, capsys.readouterr().out
    again = Log.open(str(work), COMPACT)
    clean_round(again, CleanerCheckpoint(), producers_last={4: 200})
    assert read_all(again) == new, "the next clean finishes what the killed one began"
    again.close()
