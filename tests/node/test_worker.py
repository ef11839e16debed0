"""The worker's choices that need no process: the backend, and how the supervisor names an exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from broker.node import backend_choice
from broker.node.supervisor import (
    START_TIMEOUT_PER_PARTITION_S,
    START_TIMEOUT_S,
    STOP_TIMEOUT_PER_PARTITION_S,
    STOP_TIMEOUT_S,
    describe_exit,
    start_timeout_s,
    stop_timeout_s,
    worker_cpus,
)
from broker.storage import layout


def test_auto_falls_back_to_uvloop_and_says_why_when_native_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "native", None)  # import native -> ImportError
    caplog.set_level("INFO", logger="broker.node.worker")
    assert backend_choice.choose_backend("auto") == "uvloop"
    assert "io_uring unavailable: the native bindings are not built" in caplog.text
    assert "serving with uvloop" in caplog.text
    assert backend_choice.choose_backend("uvloop") == "uvloop"
    with pytest.raises(backend_choice.BackendUnavailable, match="io_uring unavailable"):
        backend_choice.choose_backend("io_uring")


def test_a_probe_that_names_a_reason_or_fails_makes_io_uring_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class FakeNative:
        @staticmethod
        def probe() -> str:
            return "io_uring_setup: EPERM (io_uring_disabled=2)"

    monkeypatch.setitem(sys.modules, "native", FakeNative)
    assert backend_choice.io_uring_unavailable() == "io_uring_setup: EPERM (io_uring_disabled=2)"

    class Broken:
        @staticmethod
        def probe() -> None:
            raise RuntimeError("boom")

    monkeypatch.setitem(sys.modules, "native", Broken)
    assert "native.probe() failed: boom" in str(backend_choice.io_uring_unavailable())
    with pytest.raises(ValueError, match="choose one of"):
        backend_choice.choose_backend("epoll")


def test_exits_are_named_by_code_or_signal() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"


def test_the_start_and_stop_timeouts_grow_with_the_partitions_stored(tmp_path) -> None:
    """Workers open (after a crash: recover) every stored partition before they serve: a node
    holding many must get the time for it, not be stopped at a fixed 60 s."""
    assert start_timeout_s(str(tmp_path)) == START_TIMEOUT_S  # a new data dir: no topics dir
    for topic, partitions in ((1, 600), (2, 400)):
        for p in range(partitions):
            os.makedirs(layout.partition_dir(str(tmp_path), topic, p))
    assert start_timeout_s(str(tmp_path)) == START_TIMEOUT_S + 1000 * START_TIMEOUT_PER_PARTITION_S
    # and the stop: a clean close syncs and snapshots each one (killed, the next start recovers all)
    assert stop_timeout_s(str(tmp_path)) == STOP_TIMEOUT_S + 1000 * STOP_TIMEOUT_PER_PARTITION_S


def test_a_worker_process_imports_the_kafka_schemas_without_hypothesis() -> None:
    """kio imports hypothesis when it is installed (it is, here: the tests use it); the worker's
    entry point keeps it out, a seventh of every worker start (broker/node/worker_process.py)."""
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['worker', '--help']\n"
        "try:\n"
        "    runpy.run_module('broker.node.worker_process', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code)\n"
        "print('kio' in sys.modules, sys.modules.get('hypothesis', 'absent'))\n"
    )
    out = python(probe)
    assert out.splitlines()[-2:] == ["exit 0", "True None"], out
    assert "--spec" in out
    plain = "import hypothesis, kio.static._phantom as p; print(p.hypothesis is not None)"
    assert python(plain).strip() == "True", "without the entry point kio does import it"


def python(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    return run.stdout


def test_a_node_of_a_cluster_starts_its_workers_at_its_node_ids_cpu() -> None:
    """Nodes of one machine spread over its CPUs; a single node (id 0) starts at the first."""
    assert worker_cpus([0, 1], 1, 0) == [0]
    assert [worker_cpus([0, 1], 1, node)[0] for node in (1, 2, 3)] == [0, 1, 0]
    assert worker_cpus([2, 5, 7], 1, 2) == [5]  # the affinity set's CPUs, in its order
    assert [worker_cpus([0, 1, 2, 3], 2, node) for node in (1, 2)] == [[0, 1], [2, 3]]
    assert worker_cpus([0, 1, 2], 2, 2) == [2, 0]  # around the set
    assert worker_cpus([0, 1], 3, 0) == [0, 1, 0]  # oversubscribed: round the set
    assert worker_cpus([3], 2, 4_000_000_000) == [3, 3]  # node ids are u32
