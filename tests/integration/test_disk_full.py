"""A full disk: the broker starts, serves reads, DeleteTopic and retention,
refuses writes with OUT_OF_SPACE (retriable) and takes writes again once space is back.

Against a real `broker serve` on a real full file system: a 16 MiB ext4 image loop-mounted under
the test's tmp dir (ext4's delayed allocation, short writes and ENOSPC, not a mock), filled by a
filler file. Needs root (mount); CI runs as root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import BatchError, encode_batch, iter_batches

E = m.ErrorCode
BACKENDS = [pytest.param("uvloop", id="uvloop"), pytest.param("io_uring", id="io_uring")]
DISK_MIB = 16
STARTED: list[BrokerProcess] = []


def _why_no_disk() -> str | None:
    if os.geteuid() != 0:
        return "needs root to loop-mount a small ext4 file system"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB ext4 file system mounted at tmp_path/disk; unmounted at teardown, whatever happened."""
    reason = _why_no_disk()
    if reason is not None:
        pytest.skip(reason)
    image = tmp_path / "disk.img"
    mnt = tmp_path / "disk"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(DISK_MIB * 1024 * 1024)
    # -m 0: no blocks reserved for root (the broker runs as root here: it would write into them).
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True, capture_output=True)
    mount = ["mount", "-o", "loop", str(image), str(mnt)]
    mounted = subprocess.run(mount, check=False, capture_output=True, text=True)
    if mounted.returncode != 0:  # e.g. a container without loop devices
        pytest.skip(f"cannot loop-mount an ext4 image here: {mounted.stderr.strip()}")
    STARTED.clear()
    try:
        yield mnt
    finally:
        for broker in STARTED:
            if broker.running():
                broker.kill()
        STARTED.clear()
        for _ in range(50):  # a broker killed a moment ago may still hold files open
            if subprocess.run(["umount", str(mnt)], check=False, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def fill(path: Path, leave: int = 0) -> int:
    """Grow `path` until the file system refuses another byte (or only `leave` bytes are free);
    its size. Most of it is allocated at once (fallocate: no data written), the rest by writes."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        bulk = free_bytes(path.parent) - max(leave, 1 << 20)
        if leave:
            if bulk > 0:
                os.posix_fallocate(f.fileno(), 0, bulk)
            return max(bulk, 0)
        if bulk > 0:
            os.posix_fallocate(f.fileno(), 0, bulk)
            f.seek(bulk)
            written = bulk
        chunk = 256 * 1024
        while chunk >= 512:
            try:
                written += f.write(b"\xa5" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
        with contextlib.suppress(OSError):
            os.fsync(f.fileno())
    return written


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def start(data: Path, log: Path, backend: str, *extra: str, cores: int = 1) -> BrokerProcess:
    broker = BrokerProcess(data, log, extra=("--ebpf", "off", *extra), backend=backend, cores=cores)
    STARTED.append(broker)  # killed by small_disk's teardown, whatever the test did
    return broker.start()


def produce(w: Wire, tid: int, values: list[bytes], acks: int = m.Acks.WRITTEN) -> m.ProduceResponse:
    resp = w.rpc(m.ProduceRequest(tid, 0, acks, 5000, encode_batch(values)))
    assert isinstance(resp, m.ProduceResponse)
    return resp


def values_of(w: Wire, tid: int) -> list[bytes]:
    return [r.value for r in w.fetch_all(tid, 0) if r.value is not None]


def cut_preallocated(data_dir: Path) -> None:
    """Cut each store file after its last batch: what a broker killed with nothing preallocated
    leaves (a killed broker's preallocated zeros are given back when the next one opens the
    partition, which would free the space these tests fill)."""
    for store in data_dir.glob("topics/*/*/*.log"):
        data = store.read_bytes()
        end = 0
        with contextlib.suppress(BatchError):
            for pos, h in iter_batches(data):
                end = pos + h.size
        os.truncate(store, end)


def until_accepted(w: Wire, req: m.Request, timeout: float = 10) -> m.Response:
    """Each core sees space again within its check interval (a second): until then it answers
    OUT_OF_SPACE, which a client retries."""
    deadline = time.monotonic() + timeout
    while True:
        resp = w.rpc(req)
        if resp.error != E.OUT_OF_SPACE or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


def produce_until_accepted(w: Wire, tid: int, value: bytes) -> m.ProduceResponse:
    resp = until_accepted(w, m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([value])))
    assert isinstance(resp, m.ProduceResponse)
    return resp


@pytest.mark.parametrize(
    ("backend", "cores"),
    [
        pytest.param("uvloop", 1, id="uvloop-1core"),
        pytest.param("io_uring", 1, id="io_uring-1core"),
        # Two cores: DeleteTopic frees the space only once every core closed the topic's files,
        # and each core has its own view of the disk.
        pytest.param("uvloop", 2, id="uvloop-2core"),
    ],
)
def test_starts_on_a_full_disk_serves_reads_and_deletes_refuses_writes(
    small_disk: Path, tmp_path: Path, backend: str, cores: int
) -> None:
    data, log = small_disk / "data", tmp_path / "broker.log"
    broker = start(data, log, backend, "--min-free-bytes", str(1 << 20), cores=cores)
    w = Wire(broker.port)
    keep = w.create_topic("keep")
    drop = w.create_topic("drop")
    bare = w.create_topic("bare")
    kept = [b"kept-%03d" % i + b"." * 2000 for i in range(50)]
    for i in range(0, len(kept), 10):
        assert produce(w, keep, kept[i : i + 10]).error == E.NONE
    for _ in range(5):
        assert produce(w, drop, [b"d" * 100_000] * 4).error == E.NONE
    assert w.rpc(m.OffsetCommitRequest(keep, 0, "g", 7, "meta")).error == E.NONE
    assert w.rpc(m.FetchRequest(bare, 0, 0, 1 << 20, 0)).error == E.NONE  # made on first use
    w.close()
    broker.kill()  # SIGKILL: the index entries still in memory are lost; recovery must add them
    cut_preallocated(data)
    for f in (data / "topics" / str(bare) / "0").iterdir():  # as if killed before its first segment
        f.unlink()
    for f in (data / "run").iterdir():  # a start frees these: full to the last byte all the same
        f.unlink()

    filler = small_disk / "filler"
    fill(filler)
    assert free_bytes(small_disk) < 64 * 1024
    broker = start(data, log, backend, "--min-free-bytes", str(1 << 20), cores=cores)  # main: refused
    try:
        w = Wire(broker.port)
        # Writes: refused with the retriable OUT_OF_SPACE and a message, and nothing stored.
        resp = produce(w, keep, [b"refused"])
        assert resp.error == E.OUT_OF_SPACE, resp
        assert "space" in resp.message
        assert produce(w, keep, [b"refused"], acks=m.Acks.DURABLE).error == E.OUT_OF_SPACE
        assert w.rpc(m.CreateTopicRequest("new", 1)).error == E.OUT_OF_SPACE
        assert w.rpc(m.OffsetCommitRequest(keep, 0, "g", 9, "")).error == E.OUT_OF_SPACE
        # Reads: everything stored is served.
        assert values_of(w, keep) == kept
        assert w.rpc(m.ListOffsetsRequest(keep, 0, m.OffsetSpec.LATEST)).offset == len(kept)
        meta = w.rpc(m.MetadataRequest(()))
        assert isinstance(meta, m.MetadataResponse)
        assert sorted(t.name for t in meta.topics) == ["bare", "drop", "keep"]
        # A partition that needs a new segment file to open: the broker started all the same.
        resp = w.rpc(m.FetchRequest(bare, 0, 0, 1 << 20, 0))
        assert resp.error == E.OUT_OF_SPACE, resp
        got = w.rpc(m.OffsetFetchRequest(keep, 0, "g"))
        assert isinstance(got, m.OffsetFetchResponse) and (got.offset, got.metadata) == (7, "meta")
        # DeleteTopic frees space even now.
        before = free_bytes(small_disk)
        assert w.rpc(m.DeleteTopicRequest("drop")).error == E.NONE
        assert free_bytes(small_disk) > before + 1_000_000
        meta = w.rpc(m.MetadataRequest(()))
        assert [t.name for t in meta.topics] == ["bare", "keep"]  # type: ignore[attr-defined]

        # Space back (the filler goes): writes are taken again, without a restart.
        filler.unlink()
        resp = produce_until_accepted(w, keep, b"after")
        assert resp.error == E.NONE, resp
        assert resp.base_offset == len(kept)
        assert until_accepted(w, m.CreateTopicRequest("new", 1)).error == E.NONE  # maybe another core
        assert until_accepted(w, m.OffsetCommitRequest(keep, 0, "g", 9, "")).error == E.NONE
        assert values_of(w, keep) == [*kept, b"after"]
        assert produce(w, bare, [b"bare"]).error == E.NONE
        w.close()
        assert broker.stop() == 0, broker.log()
    finally:
        if broker.running():
            broker.kill()
    assert "Traceback" not in broker.log(), broker.log()


@pytest.mark.parametrize("backend", BACKENDS)
def test_disk_filling_under_a_live_broker(small_disk: Path, tmp_path: Path, backend: str) -> None:
    """The disk fills while a producer runs: produce fails cleanly with OUT_OF_SPACE (real ENOSPC
    from the write: --min-free-bytes 0), every acknowledged record stays readable, and produce
    works again once space is freed."""
    data, log = small_disk / "data", tmp_path / "broker.log"
    broker = start(data, log, backend, "--min-free-bytes", "0")
    try:
        w = Wire(broker.port)
        tid = w.create_topic("live")
        acked: dict[int, bytes] = {}
        errors: list[m.ProduceResponse] = []
        stop = threading.Event()

        def producer() -> None:
            """Pipelines 4 produces at a time: a failed write undoes those written after it."""
            pw = Wire(broker.port)
            i = 0
            while not stop.is_set():
                sent = []
                for _ in range(4):
                    value = b"%06d:" % i + b"x" * 4000
                    acks = m.Acks.DURABLE if i % 5 == 0 else m.Acks.WRITTEN
                    pw.send(m.ProduceRequest(tid, 0, acks, 5000, encode_batch([value] * 4)))
                    sent.append(value)
                    i += 1
                for value in sent:
                    resp = pw.recv()
                    assert isinstance(resp, m.ProduceResponse)
                    if resp.error == E.NONE:
                        for k in range(4):
                            acked[resp.base_offset + k] = value
                    else:
                        errors.append(resp)
            pw.close()

        # Most of the disk is taken first, so that the producer cannot fill it all by itself
        # before the filler grows (then freeing the filler would free nothing).
        fill(small_disk / "filler-1", leave=2 << 20)
        thread = threading.Thread(target=producer, daemon=True)
        thread.start()
        time.sleep(0.1)
        fill(small_disk / "filler")
        deadline = time.monotonic() + 10
        while len(errors) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        thread.join(10)
        assert errors, "the disk filled but no produce failed"
        assert {r.error for r in errors} == {E.OUT_OF_SPACE}, errors[:3]
        assert acked, "nothing was acknowledged before the disk filled"

        # Every acknowledged record is there, at its offset, with its value.
        records = {r.offset: r.value for r in w.fetch_all(tid, 0)}
        assert {o: records.get(o) for o in acked} == acked
        assert sorted(records) == list(range(len(records)))  # no hole left by a failed write
        end = len(records)

        (small_disk / "filler").unlink()
        (small_disk / "filler-1").unlink()
        resp = produce_until_accepted(w, tid, b"after")
        assert resp.error == E.NONE, resp
        assert resp.base_offset == end
        assert produce(w, tid, [b"durable"], m.Acks.DURABLE).error == E.NONE
        assert values_of(w, tid)[-2:] == [b"after", b"durable"]
        w.close()
        assert broker.stop() == 0, broker.log()
    finally:
        if broker.running():
            broker.kill()
    # The data written is intact after a restart too (recovery on what the failed writes left).
    broker = start(data, log, backend)
    try:
        w = Wire(broker.port)
        records = {r.offset: r.value for r in w.fetch_all(tid, 0)}
        assert {o: records.get(o) for o in acked} == acked
        assert len(records) == end + 2
        w.close()
        assert broker.stop() == 0
    finally:
        if broker.running():
            broker.kill()


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_core_takes_writes_again_once_space_is_freed(
    small_disk: Path, tmp_path: Path, backend: str
) -> None:
    """On ext4 one of two cores kept refusing every produce after space was
    freed (16 s and more, until a restart) while the other resumed within a second. Producers
    fill the disk through partitions of both cores (real ENOSPC: --min-free-bytes 0); once the
    filler goes, every partition takes writes again within a few seconds."""
    data, log = small_disk / "data", tmp_path / "broker.log"
    broker = start(data, log, backend, "--min-free-bytes", "0", cores=2)
    partitions = 4
    try:
        w = Wire(broker.port)
        tid = w.create_topic("live", partitions)
        failed: dict[int, int] = dict.fromkeys(range(partitions), 0)
        stop = threading.Event()

        def producer(partition: int) -> None:
            pw = Wire(broker.port)
            i = 0
            while not stop.is_set():
                for _ in range(4):
                    acks = m.Acks.DURABLE if i % 3 == 0 else m.Acks.WRITTEN
                    value = b"%d:%06d:" % (partition, i) + b"x" * 8000
                    pw.send(m.ProduceRequest(tid, partition, acks, 5000, encode_batch([value] * 4)))
                    i += 1
                for _ in range(4):
                    if pw.recv().error != E.NONE:
                        failed[partition] += 1
            pw.close()

        # Most of the disk is taken first (see test_disk_filling_under_a_live_broker).
        fill(small_disk / "filler-1", leave=3 << 20)
        threads = [threading.Thread(target=producer, args=(p,), daemon=True) for p in range(partitions)]
        for t in threads:
            t.start()
        time.sleep(0.1)
        fill(small_disk / "filler")
        deadline = time.monotonic() + 10
        while min(failed.values()) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(10)
        assert min(failed.values()) > 0, f"a partition never saw the disk full: {failed}"

        (small_disk / "filler").unlink()
        (small_disk / "filler-1").unlink()
        freed = time.monotonic()
        took: dict[int, float] = {}
        for p in range(partitions):
            req = m.ProduceRequest(tid, p, m.Acks.DURABLE, 5000, encode_batch([b"after"]))
            resp = until_accepted(w, req, timeout=20)
            assert resp.error == E.NONE, (p, resp, broker.log()[-3000:])
            took[p] = time.monotonic() - freed
        print(f"\n{backend}: partitions took writes again after {took}")
        assert max(took.values()) < 5, took
        w.close()
        assert broker.stop() == 0, broker.log()
    finally:
        if broker.running():
            broker.kill()


def test_a_new_data_dir_on_a_full_disk_is_refused_with_a_clear_message(
    small_disk: Path, tmp_path: Path
) -> None:
    """An existing data dir starts on a full disk (see above), a new one cannot
    (its directories need blocks): `broker serve` exits 1 at once saying that the disk is full
    and what to do, for a data dir missing or empty (a mount point), and starts once there is
    room. Before, it said only "unusable: [Errno 28] No space left on device"."""
    (small_disk / "empty").mkdir()
    filler = small_disk / "filler"
    fill(filler)
    for name in ("missing", "empty"):
        data = small_disk / name
        cmd = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(data), "--port", "0"]
        done = subprocess.run(
            [*cmd, "--ebpf", "off"], check=False, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 1, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"broker: data dir {data} cannot be set up: the disk is full"), last
        assert "free some space" in last, last
    filler.unlink()
    broker = start(small_disk / "empty", tmp_path / "broker.log", "uvloop", "--min-free-bytes", str(1 << 20))
    w = Wire(broker.port)
    assert w.create_topic("now", 1) >= 0
    w.close()
    assert broker.stop() == 0
