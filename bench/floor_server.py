"""What the kernel charges a server for the bytes alone: the floors bench/perf.py sets the broker's
CPU-per-GB figures beside, measured in the same run on the same CPU.

Run by perf.py, pinned to the servers' CPU; prints its port, then serves one connection at a time:
- `ingest DIR [crc]`: the least any log server does for a produce. Each connection gets a fresh
  file in DIR (fresh page cache, as a broker's new segment is). Every `recv_into` of up to 1 MiB
  is one `pwrite` at the file's end, and every whole length-prefixed frame received is answered
  with a fixed 16-byte-body reply whose error field (at `HEADER_SIZE`) is 0, in one `send` per
  receive: the replies perf.py's ingest client checks, with no parsing, validation, index or
  offsets. With `crc`, each whole frame's body also goes through crc32c once: the check Kafka's
  protocol asks of every broker before it stores a batch (the least a broker that validates does).
- `fetch FILE BYTES copy|sendfile|sendfile-crc`: the least any server does for a fetch. FILE gets
  BYTES of random data, read once (page cache warm). A request is 12 bytes (`>QI`: offset,
  length); the answer is that extent of FILE, by `pread` + `sendall` of one buffer (`copy`, the
  two copies a read-then-send broker makes), by `sendfile` (`sendfile`, the page cache's pages
  handed to the socket), or by `sendfile` after a crc32c over the extent read through a mapping
  of FILE (`sendfile-crc`: what ringlog does, which checks every batch it serves against its crc,
  so that a bit flipped on disk is an error and not a record; the crc is a read of every byte from
  memory, which sendfile never makes).
Python is fine here: one call moves up to 1 MiB, so the interpreter is a few percent of the CPU.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import sys

from crc32c import crc32c

from ringlog_proto.frames import HEADER_SIZE

BUF = 1 << 20
REPLY_BODY = 16
REPLY = struct.pack(">I", HEADER_SIZE - 4 + REPLY_BODY) + bytes(HEADER_SIZE - 4 + REPLY_BODY)
REQUEST = struct.Struct(">QI")


def serve_ingest(conn: socket.socket, directory: str, check: bool) -> None:
    path = os.path.join(directory, f"floor-{os.getpid()}.log")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.unlink(path)  # its pages go with the last close
    buf = bytearray(BUF)
    view = memoryview(buf)
    unpack_from = struct.unpack_from
    end = 0  # bytes written to the file
    have = 0  # bytes of an unfinished frame at the start of buf
    try:
        while True:
            k = conn.recv_into(view[have:])
            if not k:
                return
            os.pwrite(fd, view[have : have + k], end)
            end += k
            have += k
            pos = frames = 0
            while have - pos >= 4:
                size = 4 + unpack_from(">I", buf, pos)[0]
                if have - pos < size:
                    break
                if check:
                    crc32c(view[pos + HEADER_SIZE : pos + size])
                pos += size
                frames += 1
            if frames:
                conn.sendall(REPLY * frames)
            if pos:
                buf[: have - pos] = buf[pos:have]
                have -= pos
            elif have == BUF:
                raise ValueError(f"a frame larger than {BUF} bytes")
    finally:
        os.close(fd)


def make_file(path: str, nbytes: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    chunk = os.urandom(BUF)
    for off in range(0, nbytes, BUF):
        os.pwrite(fd, chunk[: min(BUF, nbytes - off)], off)
    for off in range(0, nbytes, BUF):  # warm
        os.pread(fd, BUF, off)
    return fd


def serve_fetch(conn: socket.socket, fd: int, mode: str) -> None:
    buf = bytearray(BUF)
    view = memoryview(buf)
    mapped = memoryview(mmap.mmap(fd, 0, prot=mmap.PROT_READ)) if mode == "sendfile-crc" else None
    req = bytearray(REQUEST.size)
    while True:
        got = 0
        while got < REQUEST.size:
            k = conn.recv_into(memoryview(req)[got:])
            if not k:
                return
            got += k
        offset, length = REQUEST.unpack(req)
        if mapped is not None:
            crc32c(mapped[offset : offset + length])
        if mode != "copy":
            sent = 0
            while sent < length:
                sent += os.sendfile(conn.fileno(), fd, offset + sent, length - sent)
        else:
            if length > len(buf):  # a chunk larger than the buffer (perf.py --fetch-max-bytes)
                buf = bytearray(length)
                view = memoryview(buf)
            n = os.preadv(fd, [view[:length]], offset)
            conn.sendall(view[:n])


def main(argv: list[str]) -> None:
    mode = argv[0]
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    fd = -1
    if mode == "fetch":
        fd = make_file(argv[1], int(argv[2]))
    print(ls.getsockname()[1], flush=True)
    while True:
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            try:
                if mode == "ingest":
                    serve_ingest(conn, argv[1], argv[2:] == ["crc"])
                else:
                    serve_fetch(conn, fd, argv[3])
            except ConnectionError:
                pass


if __name__ == "__main__":
    main(sys.argv[1:])
