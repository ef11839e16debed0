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

`rc_encode_batch` is the producer's common case whole: plain values (no keys, headers or
timestamps of their own) as one batch, the section above behind the 61-byte header and its crc
(native/rl_crc32c.h, the checksum native._records uses too). The header layout is this file's
copy of a format fact that ringlog_proto/batch.py owns: its offsets are exported and checked
against batch.py's when batch.py loads it. Anything it does not encode (a field out of its
width, a count outside 1..RECORD_COUNT_MAX) it refuses with RC_ENC_HEADER_RANGE, and
`encode_batch`'s own path then raises the error.
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
int64_t rc_encode_batch(unsigned char *out, size_t out_cap, uint32_t n,
                        const unsigned char *vblob, size_t vblob_len, const int64_t *vlens,
                        int64_t base_ts, int64_t base_offset, int64_t leader_epoch,
                        int64_t producer_id, int64_t producer_epoch, int64_t base_sequence);
#define RC_BATCH_HEADER_SIZE ...
#define RC_BATCH_CRC_START ...
#define RC_BATCH_MAGIC ...
#define RC_RECORD_COUNT_MAX ...
#define RC_AT_BASE_OFFSET ...
#define RC_AT_LENGTH ...
#define RC_AT_LEADER_EPOCH ...
#define RC_AT_MAGIC ...
#define RC_AT_CRC ...
#define RC_AT_ATTRIBUTES ...
#define RC_AT_LAST_DELTA ...
#define RC_AT_BASE_TS ...
#define RC_AT_MAX_TS ...
#define RC_AT_PRODUCER_ID ...
#define RC_AT_PRODUCER_EPOCH ...
#define RC_AT_BASE_SEQUENCE ...
#define RC_AT_COUNT ...
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
    RC_ENC_OUT_TOO_SMALL = 1,
    RC_ENC_LENGTH_INVALID = 2,
    RC_ENC_BLOB_MISMATCH = 3,
    RC_ENC_TIMESTAMP_RANGE = 4,
    RC_ENC_RECORD_TOO_BIG = 5,
};

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

/* ---- encode ---- */

static inline uint64_t rc_zz(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline size_t rc_vsize(uint64_t u)
{
    size_t n = 1;
    while (u >= 0x80) { u >>= 7; n++; }
    return n;
}

static inline unsigned char *rc_put(unsigned char *o, uint64_t u)
{
    while (u >= 0x80) { *o++ = (unsigned char)(u | 0x80); u >>= 7; }
    *o++ = (unsigned char)u;
    return o;
}

#define RC_ENC_FAIL(code, index) return -((int64_t)(code) | ((int64_t)(index) << 8))

/* A record's body may not exceed INT32_MAX (its length is an int32 varint). */
#define RC_BODY_MAX ((int64_t)0x7fffffff)

int64_t rc_encode(unsigned char *out, size_t out_cap, uint32_t n,
                  const unsigned char *kblob, size_t kblob_len, const int64_t *klens,
                  const unsigned char *vblob, size_t vblob_len, const int64_t *vlens,
                  const int64_t *timestamps, int64_t base_ts,
                  const int64_t *hcounts, const unsigned char *hblob, size_t hblob_len,
                  const int64_t *hlens, size_t nh)
{
    unsigned char *o = out;
    unsigned char *oend = out + out_cap;
    size_t kp = 0, vp = 0, hp = 0, hi = 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t klen = klens ? klens[i] : -1;
        int64_t vlen = vlens ? vlens[i] : -1;
        if (klen < -1 || klen > RC_BODY_MAX || vlen < -1 || vlen > RC_BODY_MAX)
            RC_ENC_FAIL(RC_ENC_LENGTH_INVALID, i);
        uint64_t kbytes = klen > 0 ? (uint64_t)klen : 0;
        uint64_t vbytes = vlen > 0 ? (uint64_t)vlen : 0;
        if (kbytes > kblob_len - kp || vbytes > vblob_len - vp) RC_ENC_FAIL(RC_ENC_BLOB_MISMATCH, i);
        int64_t delta = 0;
        if (timestamps && __builtin_sub_overflow(timestamps[i], base_ts, &delta))
            RC_ENC_FAIL(RC_ENC_TIMESTAMP_RANGE, i);
        int64_t hc = hcounts ? hcounts[i] : 0;
        if (hc < 0 || (uint64_t)hc > nh - hi) RC_ENC_FAIL(RC_ENC_BLOB_MISMATCH, i);
        /* the body's size first: the record starts with it */
        uint64_t body = 1 + rc_vsize(rc_zz(delta)) + rc_vsize(rc_zz((int64_t)i))
                        + rc_vsize(rc_zz(klen)) + kbytes + rc_vsize(rc_zz(vlen)) + vbytes
                        + rc_vsize(rc_zz(hc));
        uint64_t hbytes = 0;
        for (int64_t h = 0; h < hc; h++) {
            int64_t hk = hlens[2 * (hi + h)], hv = hlens[2 * (hi + h) + 1];
            if (hk < 0 || hk > RC_BODY_MAX || hv < -1 || hv > RC_BODY_MAX)
                RC_ENC_FAIL(RC_ENC_LENGTH_INVALID, i);
            uint64_t hvb = hv > 0 ? (uint64_t)hv : 0;
            body += rc_vsize(rc_zz(hk)) + (uint64_t)hk + rc_vsize(rc_zz(hv)) + hvb;
            hbytes += (uint64_t)hk + hvb;
        }
        if (hbytes > hblob_len - hp) RC_ENC_FAIL(RC_ENC_BLOB_MISMATCH, i);
        if (body > (uint64_t)RC_BODY_MAX) RC_ENC_FAIL(RC_ENC_RECORD_TOO_BIG, i);
        if (5 + body > (uint64_t)(oend - o)) RC_ENC_FAIL(RC_ENC_OUT_TOO_SMALL, i);
        o = rc_put(o, rc_zz((int64_t)body));
        *o++ = 0; /* attributes */
        o = rc_put(o, rc_zz(delta));
        o = rc_put(o, rc_zz((int64_t)i));
        o = rc_put(o, rc_zz(klen));
        memcpy(o, kblob + kp, kbytes);
        o += kbytes;
        kp += kbytes;
        o = rc_put(o, rc_zz(vlen));
        memcpy(o, vblob + vp, vbytes);
        o += vbytes;
        vp += vbytes;
        o = rc_put(o, rc_zz(hc));
        for (int64_t h = 0; h < hc; h++, hi++) {
            int64_t hk = hlens[2 * hi], hv = hlens[2 * hi + 1];
            o = rc_put(o, rc_zz(hk));
            memcpy(o, hblob + hp, (size_t)hk);
            o += hk;
            hp += (size_t)hk;
            o = rc_put(o, rc_zz(hv));
            if (hv > 0) {
                memcpy(o, hblob + hp, (size_t)hv);
                o += hv;
                hp += (size_t)hv;
            }
        }
    }
    if (kp != kblob_len || vp != vblob_len || hp != hblob_len || hi != nh)
        RC_ENC_FAIL(RC_ENC_BLOB_MISMATCH, n);
    return (int64_t)(o - out);
}

/* ---- a whole batch of values ---- */

/* RecordBatch v2's header, big-endian (ringlog_proto/batch.py owns the layout; these are checked
   against it when the Python side loads this module). */
#define RC_BATCH_HEADER_SIZE 61
#define RC_BATCH_CRC_START 21
#define RC_BATCH_MAGIC 2
#define RC_RECORD_COUNT_MAX (1 << 20)
#define RC_AT_BASE_OFFSET 0
#define RC_AT_LENGTH 8
#define RC_AT_LEADER_EPOCH 12
#define RC_AT_MAGIC 16
#define RC_AT_CRC 17
#define RC_AT_ATTRIBUTES 21
#define RC_AT_LAST_DELTA 23
#define RC_AT_BASE_TS 27
#define RC_AT_MAX_TS 35
#define RC_AT_PRODUCER_ID 43
#define RC_AT_PRODUCER_EPOCH 51
#define RC_AT_BASE_SEQUENCE 53
#define RC_AT_COUNT 57

#define RC_ENC_HEADER_RANGE 6 /* a header field that does not fit its width, or no records */

static inline void rc_be(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}

/* `n` values (no keys, headers or timestamps of their own: the producer's common case) as one
   whole batch: its header, crc included, then the records section rc_encode writes (every record
   at `base_ts`, which is also the max timestamp). The bytes `encode_batch` makes for the same
   values and fields (tests compare). Returns the batch's size, or -(code | index << 8) as
   rc_encode does; RC_ENC_HEADER_RANGE for a field out of its width or a count outside 1..max. */
int64_t rc_encode_batch(unsigned char *out, size_t out_cap, uint32_t n,
                        const unsigned char *vblob, size_t vblob_len, const int64_t *vlens,
                        int64_t base_ts, int64_t base_offset, int64_t leader_epoch,
                        int64_t producer_id, int64_t producer_epoch, int64_t base_sequence)
{
    if (n < 1 || n > RC_RECORD_COUNT_MAX || leader_epoch != (int32_t)leader_epoch
        || producer_epoch != (int16_t)producer_epoch || base_sequence != (int32_t)base_sequence)
        RC_ENC_FAIL(RC_ENC_HEADER_RANGE, 0);
    if (out_cap < RC_BATCH_HEADER_SIZE) RC_ENC_FAIL(RC_ENC_OUT_TOO_SMALL, 0);
    static const unsigned char none[1]; /* no keys, no headers (never read: their lengths are 0) */
    int64_t section = rc_encode(out + RC_BATCH_HEADER_SIZE, out_cap - RC_BATCH_HEADER_SIZE, n, none, 0,
                                NULL, vblob, vblob_len, vlens, NULL, base_ts, NULL, none, 0, NULL, 0);
    if (section < 0) return section;
    int64_t size = RC_BATCH_HEADER_SIZE + section;
    if (size - 12 > INT32_MAX) RC_ENC_FAIL(RC_ENC_RECORD_TOO_BIG, 0);
    rc_be(out + RC_AT_BASE_OFFSET, (uint64_t)base_offset, 8);
    rc_be(out + RC_AT_LENGTH, (uint64_t)(size - 12), 4);
    rc_be(out + RC_AT_LEADER_EPOCH, (uint64_t)leader_epoch, 4);
    out[RC_AT_MAGIC] = RC_BATCH_MAGIC;
    rc_be(out + RC_AT_ATTRIBUTES, 0, 2);
    rc_be(out + RC_AT_LAST_DELTA, n - 1, 4);
    rc_be(out + RC_AT_BASE_TS, (uint64_t)base_ts, 8);
    rc_be(out + RC_AT_MAX_TS, (uint64_t)base_ts, 8);
    rc_be(out + RC_AT_PRODUCER_ID, (uint64_t)producer_id, 8);
    rc_be(out + RC_AT_PRODUCER_EPOCH, (uint64_t)producer_epoch, 2);
    rc_be(out + RC_AT_BASE_SEQUENCE, (uint64_t)base_sequence, 4);
    rc_be(out + RC_AT_COUNT, n, 4);
    rc_be(out + RC_AT_CRC, rr_crc(out + RC_BATCH_CRC_START, (size_t)size - RC_BATCH_CRC_START), 4);
    return size;
}

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
