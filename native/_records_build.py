"""cffi API-mode builder for `native._records`: the broker's record-framing walk in C.

Rules this module keeps:
- Its own extension, not linked to liburing: a machine without io_uring still gets the fast walk.
  Built by `pip install -e .` (setup.py lists it in `cffi_modules` beside `native/_build.py`).
- The walk is the exact twin of `ringlog_proto.batch.walk_records_python`: same checks in the
  same order, same result encoding, so the two can be tested against each other and either one
  can serve the broker (the Python one is the fallback when this module is not built).
- It reads Kafka's record framing (RecordBatch v2: zigzag varint lengths, offset deltas,
  header counts) and header-key bytes (UTF-8, because clients decode header keys as text), never
  payload bytes; a compressed batch is not walked (ringlog_proto/batch.py says why). One call
  per batch: the per-record loop is what Python cannot afford at ~1 µs per record on the produce
  path.
- The GIL is held during the walk (see the preamble of SOURCE): it is too short to be worth
  releasing, and releasing it cost as much as the walk.
- It trusts nothing in the buffer: every length is checked against the bytes left in its record
  before it is used, in 64-bit arithmetic, so no field value can make it read out of bounds.

Result (an i64): 0 when the section frames exactly `count` records, else
`code | record_index << 8 | byte_offset << 32` (byte offset from `start`), codes in
`ringlog_proto.batch.RECORD_ERRORS`.
"""

from __future__ import annotations

import os

from cffi import FFI

CDEF = """
int64_t rr_walk_records(const unsigned char *buf, size_t buf_len, size_t start, size_t end,
                        uint32_t count);
"""

SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#include "rl_utf8.h"

/* The walk takes a microsecond or two and touches neither Python objects nor errno. cffi wraps
   every call in a GIL release/reacquire and an errno save/restore, which for a small batch cost
   as much as the walk itself: on the broker's produce path that was the difference between a
   few percent and under the issue's 5% bound. These overrides apply to this module only (the
   wrappers cffi generates after this preamble): the GIL stays held, as for any C builtin. */
#undef Py_BEGIN_ALLOW_THREADS
#undef Py_END_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#define Py_END_ALLOW_THREADS }
#undef _cffi_restore_errno
#undef _cffi_save_errno
#define _cffi_restore_errno() ((void)0)
#define _cffi_save_errno() ((void)0)

enum {
    RR_TOO_FEW_RECORDS = 1,
    RR_LENGTH_VARINT = 2,
    RR_RECORD_PAST_END = 3,
    RR_RECORD_TOO_SHORT = 4,
    RR_KEY_LENGTH_INVALID = 5,
    RR_KEY_PAST_RECORD = 6,
    RR_VALUE_LENGTH_INVALID = 7,
    RR_VALUE_PAST_RECORD = 8,
    RR_VARINT_PAST_RECORD = 9,
    RR_HEADER_KEY_PAST_RECORD = 10,
    RR_HEADER_KEY_NOT_UTF8 = 11,
    RR_HEADER_VALUE_LENGTH_INVALID = 12,
    RR_HEADER_VALUE_PAST_RECORD = 13,
    RR_RECORD_LENGTH_MISMATCH = 14,
    RR_TRAILING_BYTES = 15,
    RR_BOUNDS = 16,
    RR_OFFSET_DELTA = 17,
    RR_HEADER_COUNT_INVALID = 18,
};

#define RR_FAIL(code, index, at) \
    return (int64_t)(code) | ((int64_t)(index) << 8) | ((int64_t)(at) << 32)

#define RR_VARINT_BITS 35   /* 5 bytes of 7 bits: a sixth makes a varint too long */
#define RR_VARLONG_BITS 70  /* 10 bytes */

/* Kafka's zigzag varint at s[*q], ending before `lim`: 1 and the value (bits past 32, or 64 for
   a varlong, dropped as Kafka's reader drops them) and *q moved past it; 0 when it runs to `lim`
   or is longer than `bits` allows. */
static inline int rr_varint(const unsigned char *s, uint64_t *q, uint64_t lim, unsigned bits, int64_t *out)
{
    uint64_t p = *q, z = 0;
    unsigned shift = 0;
    if (p < lim && s[p] < 0x80) { /* one byte: most lengths and deltas */
        z = s[p];
        *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
        *q = p + 1;
        return 1;
    }
    while (p < lim) {
        unsigned char b = s[p++];
        z |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            if (bits == RR_VARINT_BITS) z &= 0xFFFFFFFFu;
            *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
            *q = p;
            return 1;
        }
        shift += 7;
        if (shift >= bits) return 0;
    }
    return 0;
}


int64_t rr_walk_records(const unsigned char *buf, size_t buf_len, size_t start, size_t end,
                        uint32_t count)
{
    if (start > end || end > buf_len || end - start > ((size_t)1 << 31)) RR_FAIL(RR_BOUNDS, 0, 0);
    const unsigned char *s = buf + start;
    uint64_t len = end - start;
    uint64_t p = 0;
    uint32_t i;
    for (i = 0; i < count; i++) {
        if (p == len) RR_FAIL(RR_TOO_FEW_RECORDS, i, p);
        uint64_t q = p, n;
        int64_t rlen, v;
        if (!rr_varint(s, &q, len, RR_VARINT_BITS, &rlen)) RR_FAIL(RR_LENGTH_VARINT, i, p);
        if (rlen < 6) RR_FAIL(RR_RECORD_TOO_SHORT, i, p);
        if ((uint64_t)rlen > len - q) RR_FAIL(RR_RECORD_PAST_END, i, p);
        uint64_t rend = q + (uint64_t)rlen;
        q += 1; /* attributes */
        n = q;
        if (!rr_varint(s, &n, rend, RR_VARLONG_BITS, &v)) RR_FAIL(RR_VARINT_PAST_RECORD, i, q);
        q = n;
        if (!rr_varint(s, &n, rend, RR_VARINT_BITS, &v)) RR_FAIL(RR_VARINT_PAST_RECORD, i, q);
        if (v != (int64_t)i) RR_FAIL(RR_OFFSET_DELTA, i, q);
        q = n;
        if (!rr_varint(s, &n, rend, RR_VARINT_BITS, &v)) RR_FAIL(RR_VARINT_PAST_RECORD, i, q);
        if (v < -1) RR_FAIL(RR_KEY_LENGTH_INVALID, i, q);
        if (v > 0) {
            if ((uint64_t)v > rend - n) RR_FAIL(RR_KEY_PAST_RECORD, i, q);
            n += (uint64_t)v;
        }
        q = n;
        if (!rr_varint(s, &n, rend, RR_VARINT_BITS, &v)) RR_FAIL(RR_VARINT_PAST_RECORD, i, q);
        if (v < -1) RR_FAIL(RR_VALUE_LENGTH_INVALID, i, q);
        if (v > 0) {
            if ((uint64_t)v > rend - n) RR_FAIL(RR_VALUE_PAST_RECORD, i, q);
            n += (uint64_t)v;
        }
        q = n;
        int64_t hcount;
        if (!rr_varint(s, &n, rend, RR_VARINT_BITS, &hcount)) RR_FAIL(RR_VARINT_PAST_RECORD, i, q);
        if (hcount < 0) RR_FAIL(RR_HEADER_COUNT_INVALID, i, q);
        q = n;
        /* Each header takes at least two bytes or fails: the loop ends within the record. */
        for (int64_t k = 0; k < hcount; k++) {
            if (!rr_varint(s, &n, rend, RR_VARINT_BITS, &v)) RR_FAIL(RR_VARINT_PAST_RECORD, i, q);
            if (v < 0 || (uint64_t)v > rend - n) RR_FAIL(RR_HEADER_KEY_PAST_RECORD, i, q);
            if (!rl_utf8_ok(s + n, (size_t)v)) RR_FAIL(RR_HEADER_KEY_NOT_UTF8, i, q);
            q = n + (uint64_t)v;
            n = q;
            if (!rr_varint(s, &n, rend, RR_VARINT_BITS, &v)) RR_FAIL(RR_VARINT_PAST_RECORD, i, q);
            if (v < -1) RR_FAIL(RR_HEADER_VALUE_LENGTH_INVALID, i, q);
            if (v > 0) {
                if ((uint64_t)v > rend - n) RR_FAIL(RR_HEADER_VALUE_PAST_RECORD, i, q);
                n += (uint64_t)v;
            }
            q = n;
        }
        if (q != rend) RR_FAIL(RR_RECORD_LENGTH_MISMATCH, i, p);
        p = rend;
    }
    if (p != len) RR_FAIL(RR_TRAILING_BYTES, i, p);
    return 0;
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "native._records",
    SOURCE,
    include_dirs=[os.path.dirname(os.path.abspath(__file__))],  # rl_utf8.h
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    # Builds native/_records*.so next to this file (a worktree's own), compiling in a temporary
    # directory: cffi's compile runs setuptools, which must not read the project's pyproject.toml.
    import glob
    import shutil
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        ffibuilder.compile(tmpdir=tmp, verbose=True)
        for built in glob.glob(os.path.join(tmp, "native", "_records*.so")):
            shutil.copy(built, here)
            print(f"built {os.path.join(here, os.path.basename(built))}")
