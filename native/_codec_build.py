"""cffi API-mode builder for `native._codec`: a Kafka RecordBatch v2 records section, encoded and
decoded in C, one call per batch.

Rules this module keeps:
- Its own extension, not linked to liburing: a machine without io_uring still gets the fast codec.
  Built by `pip install -e .` (setup.py lists it in `cffi_modules` beside `native/_records_build.py`),
  or in place by running this file.
- Both functions are exact twins of the pure-Python ones in `ringlog_proto.records_codec`: same
  bytes out, same checks in the same order, same result encoding, so the two are tested against
  each other and either one can serve a client (the Python one is the fallback when this module is
  not built).
- cffi cannot take or return Python objects, so whole batches cross the boundary: encode takes the
  keys and values joined into one blob each plus int64 arrays of their lengths; decode fills an
  int64 array with each record's field positions, and Python slices the payload itself. Headers
  are rare: NULL arrays mean "no headers" and cost nothing.
- The section is the bytes after the 61-byte batch header. Every Kafka "varint" in it is a zigzag
  varint (int32, at most 5 bytes) or varlong (int64, at most 10 bytes), read as Kafka reads them:
  a longer one is refused, and the bits of its last byte beyond its type are dropped (the broker's
  walk, native/_records_build.py, reads them the same way, so a batch it stored decodes).
- Decode trusts nothing in the buffer: every varint is read against the bytes left in its record
  (or section), every length is checked against the bytes left in its record before it is used,
  in 64-bit arithmetic, so no field value can make it read out of bounds.
- The GIL is held (see the preamble of SOURCE), the same trade as `native._records`: a call is
  a walk over lengths plus memcpy of the payload, tens of microseconds for a MiB batch.

Encode result (an i64): bytes written (>= 0), or `-(code | record_index << 8)`, codes in
`ringlog_proto.records_codec.ENCODE_ERRORS`.

The encoder itself is native/rl_encode.h, shared with `native._batch` (native/batch.c), which
encodes the producer's common case, plain values as a whole batch, in one CPython call.
Decode result (an i64): 0 when the section holds exactly `count` records, else
`code | record_index << 8 | byte_offset << 32` (byte offset from `start`), codes in
`ringlog_proto.records_codec.DECODE_ERRORS`. Per record, decode writes 8 int64s into `out` (when not
NULL): key offset, key length, value offset, value length (offsets from the start of `buf`,
length -1 for null), timestamp delta, offset delta, offset of its first header (just after the
header count), header count.
"""

from __future__ import annotations

import os

from cffi import FFI

CDEF = """
int64_t rc_encode(unsigned char *out, size_t out_cap, uint32_t n,
                  const unsigned char *kblob, size_t kblob_len, const int64_t *klens,
                  const unsigned char *vblob, size_t vblob_len, const int64_t *vlens,
                  const int64_t *timestamps, int64_t base_ts,
                  const int64_t *hcounts, const unsigned char *hblob, size_t hblob_len,
                  const int64_t *hlens, size_t nh);
int64_t rc_decode(const unsigned char *buf, size_t buf_len, size_t start, size_t end,
                  uint32_t count, int64_t *out, size_t out_len);
"""

SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "rl_crc32c.h"
#include "rl_utf8.h"

/* As in native/_records_build.py: a call lasts microseconds and touches neither Python objects
   nor errno, so cffi's GIL release/reacquire and errno save/restore around it would cost as much
   as the work. These overrides apply to this module's wrappers only. */
#undef Py_BEGIN_ALLOW_THREADS
#undef Py_END_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#define Py_END_ALLOW_THREADS }
#undef _cffi_restore_errno
#undef _cffi_save_errno
#define _cffi_restore_errno() ((void)0)
#define _cffi_save_errno() ((void)0)

enum {
    RC_TOO_FEW_RECORDS = 1,
    RC_LENGTH_TRUNCATED = 2,
    RC_VARINT_TOO_LONG = 3,
    RC_LENGTH_NEGATIVE = 4,
    RC_RECORD_PAST_END = 5,
    RC_FIELD_PAST_RECORD = 6,
    RC_KEY_LENGTH_INVALID = 7,
    RC_KEY_PAST_RECORD = 8,
    RC_VALUE_LENGTH_INVALID = 9,
    RC_VALUE_PAST_RECORD = 10,
    RC_HEADER_COUNT_NEGATIVE = 11,
    RC_HEADER_KEY_LENGTH_INVALID = 12,
    RC_HEADER_KEY_PAST_RECORD = 13,
    RC_HEADER_KEY_NOT_UTF8 = 14,
    RC_HEADER_VALUE_LENGTH_INVALID = 15,
    RC_HEADER_VALUE_PAST_RECORD = 16,
    RC_RECORD_LENGTH_MISMATCH = 17,
    RC_TRAILING_BYTES = 18,
    RC_BOUNDS = 19,
};

#include "rl_encode.h"

/* ---- decode ---- */

#define RC_FAIL(code, index, at) \
    return (int64_t)(code) | ((int64_t)(index) << 8) | ((int64_t)(at) << 32)

/* Read a zigzag varint of at most `maxb` bytes (5: int32, 10: int64) from s[*p] before `lim`.
   0 on success, else RC_FIELD_PAST_RECORD (runs past lim) or RC_VARINT_TOO_LONG (a byte past
   `maxb`). Bits of the last byte beyond the type are dropped, as Kafka's reader (and the walk,
   native/_records_build.py) drops them. */
static inline int rc_get(const unsigned char *s, uint64_t *p, uint64_t lim, int maxb, int64_t *v)
{
    uint64_t u = 0;
    uint64_t q = *p;
    for (int k = 0; k < maxb; k++) {
        if (q == lim) return RC_FIELD_PAST_RECORD;
        unsigned char b = s[q++];
        u |= (uint64_t)(b & 0x7f) << (7 * k); /* past bit 63 (a varlong's 10th byte): dropped */
        if (!(b & 0x80)) {
            if (maxb == 5) u &= 0xFFFFFFFFu; /* an int32's bits 32-34: dropped */
            *v = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
            *p = q;
            return 0;
        }
    }
    return RC_VARINT_TOO_LONG;
}


int64_t rc_decode(const unsigned char *buf, size_t buf_len, size_t start, size_t end,
                  uint32_t count, int64_t *out, size_t out_len)
{
    if (start > end || end > buf_len || end - start > ((size_t)1 << 31)
        || (out && out_len / 8 < count))
        RC_FAIL(RC_BOUNDS, 0, 0);
    const unsigned char *s = buf + start;
    uint64_t len = end - start;
    uint64_t p = 0;
    uint32_t i;
    int rc;
    int64_t v;
    for (i = 0; i < count; i++) {
        if (p == len) RC_FAIL(RC_TOO_FEW_RECORDS, i, p);
        uint64_t q = p;
        rc = rc_get(s, &q, len, 5, &v);
        if (rc) RC_FAIL(rc == RC_FIELD_PAST_RECORD ? RC_LENGTH_TRUNCATED : rc, i, p);
        if (v < 0) RC_FAIL(RC_LENGTH_NEGATIVE, i, p);
        if ((uint64_t)v > len - q) RC_FAIL(RC_RECORD_PAST_END, i, p);
        uint64_t rend = q + (uint64_t)v;
        if (q == rend) RC_FAIL(RC_FIELD_PAST_RECORD, i, q);
        q++; /* attributes: unused in v2 records, read and ignored as Kafka does */
        int64_t ts, od, klen, vlen, hc;
        uint64_t at = q;
        if ((rc = rc_get(s, &q, rend, 10, &ts))) RC_FAIL(rc, i, at);
        at = q;
        if ((rc = rc_get(s, &q, rend, 5, &od))) RC_FAIL(rc, i, at);
        at = q;
        if ((rc = rc_get(s, &q, rend, 5, &klen))) RC_FAIL(rc, i, at);
        if (klen < -1) RC_FAIL(RC_KEY_LENGTH_INVALID, i, at);
        uint64_t ko = q;
        if (klen > 0) {
            if ((uint64_t)klen > rend - q) RC_FAIL(RC_KEY_PAST_RECORD, i, at);
            q += (uint64_t)klen;
        }
        at = q;
        if ((rc = rc_get(s, &q, rend, 5, &vlen))) RC_FAIL(rc, i, at);
        if (vlen < -1) RC_FAIL(RC_VALUE_LENGTH_INVALID, i, at);
        uint64_t vo = q;
        if (vlen > 0) {
            if ((uint64_t)vlen > rend - q) RC_FAIL(RC_VALUE_PAST_RECORD, i, at);
            q += (uint64_t)vlen;
        }
        at = q;
        if ((rc = rc_get(s, &q, rend, 5, &hc))) RC_FAIL(rc, i, at);
        if (hc < 0) RC_FAIL(RC_HEADER_COUNT_NEGATIVE, i, at);
        uint64_t ho = q;
        for (int64_t h = 0; h < hc; h++) {
            int64_t hk, hv;
            at = q;
            if ((rc = rc_get(s, &q, rend, 5, &hk))) RC_FAIL(rc, i, at);
            if (hk < 0) RC_FAIL(RC_HEADER_KEY_LENGTH_INVALID, i, at);
            if ((uint64_t)hk > rend - q) RC_FAIL(RC_HEADER_KEY_PAST_RECORD, i, at);
            if (!rl_utf8_ok(s + q, (size_t)hk)) RC_FAIL(RC_HEADER_KEY_NOT_UTF8, i, at);
            q += (uint64_t)hk;
            at = q;
            if ((rc = rc_get(s, &q, rend, 5, &hv))) RC_FAIL(rc, i, at);
            if (hv < -1) RC_FAIL(RC_HEADER_VALUE_LENGTH_INVALID, i, at);
            if (hv > 0) {
                if ((uint64_t)hv > rend - q) RC_FAIL(RC_HEADER_VALUE_PAST_RECORD, i, at);
                q += (uint64_t)hv;
            }
        }
        if (q != rend) RC_FAIL(RC_RECORD_LENGTH_MISMATCH, i, p);
        if (out) {
            int64_t *f = out + 8 * (size_t)i;
            f[0] = (int64_t)(start + ko);
            f[1] = klen;
            f[2] = (int64_t)(start + vo);
            f[3] = vlen;
            f[4] = ts;
            f[5] = od;
            f[6] = (int64_t)(start + ho);
            f[7] = hc;
        }
        p = rend;
    }
    if (p != len) RC_FAIL(RC_TRAILING_BYTES, i, p);
    return 0;
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "native._codec",
    SOURCE,
    include_dirs=[os.path.dirname(os.path.abspath(__file__))],  # rl_utf8.h, rl_crc32c.h
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":  # build in place, for a worktree that must not run `pip install -e .`
    import shutil
    import tempfile
    from pathlib import Path

    # In a scratch directory: setuptools would otherwise read (and judge) the project's pyproject.toml.
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(ffibuilder.compile(tmpdir=tmp))
        shutil.copy(built, Path(__file__).resolve().parent / built.name)
