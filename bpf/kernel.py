"""The thin layer between ringlog and the kernel's bpf(2): availability, maps by fd, test runs.

Rules this module keeps:
- bcc is imported lazily (`load_bcc`), so this module is importable everywhere.
- Map access goes through libbcc's `bpf_*_elem` calls on plain fds (bcc's Python `Table` cannot
  handle a SOCKMAP: "Unknown table type 15"), with keys and values as bytes in host order.
- Errors are `BpfError` carrying the errno's text and what was being done: every caller reports
  them as one line.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent

BPF_MAP_TYPE_SOCKMAP: Final = 15
BPF_PROG_TYPE_XDP: Final = 6
BPF_PROG_TYPE_SK_REUSEPORT: Final = 21  # not in bcc 0.26's enum: passed as a number
SO_ATTACH_REUSEPORT_EBPF: Final = 52
SO_DETACH_REUSEPORT_BPF: Final = 68
TCP_FASTOPEN: Final = 23
TCP_FASTOPEN_NO_COOKIE: Final = 34
MSG_FASTOPEN: Final = 0x20000000
_SYS_BPF: Final = 321  # x86_64
_BPF_PROG_TEST_RUN: Final = 10
_BPF_PROG_GET_NEXT_ID: Final = 11
_BPF_PROG_GET_FD_BY_ID: Final = 13
_BPF_OBJ_GET_INFO_BY_FD: Final = 15
_BPF_LINK_CREATE: Final = 28
BPF_XDP: Final = 37  # enum bpf_attach_type: an XDP link
# Same limit as RL_MAX_CORES in rendezvous.h: the live set is one u64 bitmask in a map.
MAX_CORES: Final = 64


class BpfError(Exception):
    """A bpf(2) operation failed; the message says which and why."""


def ebpf_unavailable() -> str | None:
    """Why bcc-loaded eBPF cannot be used in this process, or None if it can (root, bcc importable,
    kernel headers linked where bcc looks for them)."""
    if os.geteuid() != 0:
        return "not root (loading BPF programs needs CAP_BPF and CAP_NET_ADMIN)"
    try:
        import bcc  # noqa: F401, PLC0415 - optional system package
    except Exception as exc:
        return f"bcc is not importable ({exc}); install python3-bpfcc (make setup links it into the venv)"
    build = Path("/lib/modules") / platform.release() / "build"
    if not build.exists():
        return f"no kernel headers at {build} (make setup links Debian's linux-headers there for bcc)"
    return None


def load_bcc() -> Any:
    """The bcc module (imported on first use)."""
    import bcc  # noqa: PLC0415 - optional system package

    return bcc


def source(*names: str) -> bytes:
    """The concatenated text of C files in this package (headers first), for bcc's `text=` (bytes:
    bcc warns about str)."""
    return "\n".join((HERE / name).read_text() for name in names).encode()


def _lib() -> Any:
    lib = load_bcc().libbcc.lib
    if not getattr(lib, "_ringlog_typed", False):
        lib.bcc_create_map.restype = ctypes.c_int
        lib.bcc_create_map.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib._ringlog_typed = True
    return lib


def create_map(map_type: int, name: str, key_size: int, value_size: int, max_entries: int) -> int:
    """A new map's fd (the caller closes it)."""
    fd = _lib().bcc_create_map(map_type, name.encode(), key_size, value_size, max_entries, 0)
    if fd < 0:
        raise BpfError(f"cannot create map {name}: {os.strerror(-fd if fd < -1 else ctypes.get_errno())}")
    return fd


def map_update(fd: int, key: bytes, value: bytes, what: str = "map update") -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    if _lib().bpf_update_elem(fd, k, v, 0) != 0:
        raise BpfError(f"{what}: {os.strerror(ctypes.get_errno())}")


def map_delete(fd: int, key: bytes) -> bool:
    """Delete `key`; False if it was not there."""
    k = ctypes.create_string_buffer(key, len(key))
    return _lib().bpf_delete_elem(fd, k) == 0


def table_fd(bpf: Any, name: str) -> int:
    """The fd of map `name` declared in a bcc program."""
    return int(load_bcc().libbcc.lib.bpf_table_fd(bpf.module, name.encode()))


def percpu_sums(bpf: Any, name: str, slots: int) -> list[int]:
    """Each slot of a BPF_PERCPU_ARRAY summed over the CPUs."""
    table = bpf[name.encode()]
    return [int(table.sum(table.Key(i)).value) for i in range(slots)]


class _TestRunAttr(ctypes.Structure):
    _fields_ = (
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
    )


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def prog_test_run(prog_fd: int, data: bytes, out_size: int = 256) -> tuple[int, bytes]:
    """Run a loaded program once on `data` (BPF_PROG_TEST_RUN): (return value, packet after)."""
    inp = ctypes.create_string_buffer(data, len(data))
    out = ctypes.create_string_buffer(out_size)
    attr = _TestRunAttr()
    attr.prog_fd = prog_fd
    attr.data_size_in = len(data)
    attr.data_size_out = out_size
    attr.data_in = ctypes.addressof(inp)
    attr.data_out = ctypes.addressof(out)
    attr.repeat = 1
    rc = _libc.syscall(_SYS_BPF, _BPF_PROG_TEST_RUN, ctypes.byref(attr), ctypes.sizeof(attr))
    if rc != 0:
        raise BpfError(f"BPF_PROG_TEST_RUN: {os.strerror(ctypes.get_errno())}")
    return attr.retval, out.raw[: attr.data_size_out]


# ----------------------------------------------------------------------------- links and program info
#
# Everything ringlog attaches outside a socket goes through a BPF link (BPF_LINK_CREATE): the kernel
# detaches a link's program when the last fd of the link is closed, which a SIGKILL does too. A
# netlink-attached XDP program (`ip link set ... xdp`, bcc's attach_xdp, pyroute2) stays on the
# interface after its loader dies, which is how a killed broker used to leave `lo` dropping packets.


class _LinkCreateAttr(ctypes.Structure):
    _fields_ = (
        ("prog_fd", ctypes.c_uint32),
        ("target_ifindex", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("_rest", ctypes.c_uint64 * 4),  # the per-type union, unused for XDP: must be zero
    )


class _IdAttr(ctypes.Structure):
    _fields_ = (("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32))


class _InfoAttr(ctypes.Structure):
    _fields_ = (("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64))


_PROG_INFO_NAME_OFFSET: Final = 64  # struct bpf_prog_info: ... nr_map_ids u32, map_ids u64, name[16]
_PROG_INFO_LEN: Final = 80


def _sys_bpf(cmd: int, attr: ctypes.Structure) -> int:
    return int(_libc.syscall(_SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))


def xdp_link_create(prog_fd: int, ifindex: int, flags: int) -> int:
    """Attach an XDP program to `ifindex` through a new BPF link; the link's fd (close-on-exec, as
    every bpf(2) fd). `flags`: XDP_FLAGS_SKB_MODE or XDP_FLAGS_DRV_MODE. The kernel refuses (EBUSY)
    when any XDP program is attached to the interface already: a link never replaces one."""
    attr = _LinkCreateAttr(prog_fd=prog_fd, target_ifindex=ifindex, attach_type=BPF_XDP, flags=flags)
    fd = _sys_bpf(_BPF_LINK_CREATE, attr)
    if fd < 0:
        raise BpfError(f"BPF_LINK_CREATE (xdp): {os.strerror(ctypes.get_errno())}")
    return fd


_GET_NEXT_ID: Final = {"prog": _BPF_PROG_GET_NEXT_ID, "map": 12, "link": 31}  # BPF_{MAP,LINK}_GET_NEXT_ID


def object_ids(kind: str = "prog") -> list[int]:
    """The ids of every BPF `kind` ("prog", "map", "link") on the machine, as `bpftool KIND show`
    lists them."""
    ids: list[int] = []
    attr = _IdAttr()
    while _sys_bpf(_GET_NEXT_ID[kind], attr) == 0:
        ids.append(attr.next_id)
        attr.id = attr.next_id
    return ids


def prog_ids() -> list[int]:
    """Every BPF program loaded on the machine."""
    return object_ids("prog")


def prog_name(prog_id: int) -> str | None:
    """The name a loaded program was given (at most 15 characters: BPF_OBJ_NAME_LEN), or None
    when no program has that id (any more)."""
    fd = _sys_bpf(_BPF_PROG_GET_FD_BY_ID, _IdAttr(id=prog_id))
    if fd < 0:
        return None
    try:
        info = ctypes.create_string_buffer(_PROG_INFO_LEN)
        attr = _InfoAttr(bpf_fd=fd, info_len=_PROG_INFO_LEN, info=ctypes.addressof(info))
        if _sys_bpf(_BPF_OBJ_GET_INFO_BY_FD, attr) != 0:
            raise BpfError(f"BPF_OBJ_GET_INFO_BY_FD (prog {prog_id}): {os.strerror(ctypes.get_errno())}")
        name = info.raw[_PROG_INFO_NAME_OFFSET:_PROG_INFO_LEN]
        return name.split(b"\0", 1)[0].decode(errors="replace")
    finally:
        os.close(fd)


def bpf_fd_ids(pid: int | str = "self") -> dict[str, set[int]]:
    """The BPF objects process `pid` holds open, by kind ("prog_id", "map_id", "link_id"), read from
    /proc/PID/fdinfo (a link's fd also names its program). Empty when the process is gone."""
    found: dict[str, set[int]] = {"prog_id": set(), "map_id": set(), "link_id": set()}
    base = f"/proc/{pid}/fdinfo"
    try:
        names = os.listdir(base)
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(base, name)) as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in found and value.strip().isdigit():
                found[key].add(int(value))
    return found


def prog_holders(prog_id: int) -> list[int]:
    """Pids of the processes holding program `prog_id` open (its fd, or a link's): a program that
    none holds and that is still attached was left behind by a process that died."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and prog_id in bpf_fd_ids(entry)["prog_id"]:
            pids.append(int(entry))
    return pids
