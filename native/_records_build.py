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

The second function is the read side's: `rr_scan_stored` checks batches read back from a
segment, the twin of a loop of `ringlog_proto.batch.stored_damage` (same checks, same order), and
`rr_crc32c` is its checksum. A fetch of 1 MiB is ~16 batches of 64 KiB: in Python the loop was
~120 calls per fetch around 16 crc32c calls, about a third of a fetch's Python. The crc is
Castagnoli's in hardware (SSE4.2's crc32 instruction, three streams at a time so that its
3-cycle latency is hidden, the streams joined by tables that append zeros to a crc), or
byte-wise from a table where there is no such instruction. The batch header's layout is this
file's second copy of a format fact (ringlog_proto/batch.py owns it): its offsets are exported
as constants and checked against batch.py's when the module is loaded.

The third is the produce side's: `rr_check_produced` makes every check of
`broker.storage.log.Log.validate` (the header, the size limit, `invalid_header`'s rules, the crc,
the walk; a transactional batch refused unless the caller's flag allows it, a control batch
always) on a produce's batches in one call, and returns how far they all pass. It says no more:
from the first batch that fails, validate's Python finds why, so the messages have one source.
With `invalid_header`'s limits it is a third copy of those facts, exported and checked like the
offsets; the tests hold it to pass exactly what the Python checks accept.

The fourth is the follower's: `rr_check_stored` makes a follower's checks of its leader's batches
(`broker.storage.validation.validate_stored`: the size limit, `invalid_stored_header`'s rules,
the crc) in one call, as Kafka's follower checks them: no record walk, no inflating. Its twin
and its tests are `rr_check_produced`'s.
"""

from __future__ import annotations

import os

from cffi import FFI

CDEF = """
int64_t rr_walk_records(const unsigned char *buf, size_t buf_len, size_t start, size_t end,
                        uint32_t count);
int64_t rr_crc32c(const unsigned char *buf, size_t buf_len, size_t start, size_t end);
int64_t rr_crc32c_table(const unsigned char *buf, size_t buf_len, size_t start, size_t end);
int rr_crc32c_hardware(void);
int rr_scan_stored(const unsigned char *buf, size_t buf_len, size_t pos, size_t end,
                   int64_t base_offset, int64_t *out);
#define RR_BATCH_HEADER_SIZE ...
#define RR_BATCH_CRC_START ...
#define RR_BATCH_MAGIC ...
#define RR_SCAN_TRUNCATED ...
#define RR_SCAN_BASE_OFFSET ...
#define RR_SCAN_FRAMING ...
#define RR_SCAN_CRC ...
#define RR_SCAN_BOUNDS ...
int64_t rr_check_produced(const unsigned char *buf, size_t buf_len, int64_t max_batch, int flags);
int64_t rr_check_stored(const unsigned char *buf, size_t buf_len, int64_t max_batch);
#define RR_ATTR_STORED_KNOWN ...
#define RR_ATTR_DELETE_HORIZON ...
#define RR_CHECK_WALK ...
#define RR_CHECK_TRANSACTIONAL ...
#define RR_BATCH_LENGTH_AT ...
#define RR_BATCH_ATTRIBUTES_AT ...
#define RR_BATCH_LAST_DELTA_AT ...
#define RR_BATCH_BASE_TS_AT ...
#define RR_BATCH_MAX_TS_AT ...
#define RR_BATCH_COUNT_AT ...
#define RR_BATCH_MAGIC_AT ...
#define RR_BATCH_CRC_AT ...
#define RR_RECORD_COUNT_MAX ...
#define RR_RECORD_HEADER_SIZE ...
#define RR_ATTR_KNOWN ...
#define RR_ATTR_COMPRESSION ...
#define RR_ATTR_TRANSACTIONAL ...
#define RR_ATTR_CONTROL ...
#define RR_CODEC_MAX ...
"""

SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "rl_crc32c.h"
#include "rl_utf8.h"

/* The walk takes a microsecond or two and touches neither Python objects nor errno. cffi wraps
   every call in a GIL release/reacquire and an errno save/restore, which for a small batch cost
   as much as the walk itself: on the broker's produce path that was the difference between a
   few percent and under the 5% the walk is allowed. These overrides apply to this module only (the
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

/* ------------------------------------------------------------------------------- crc32c */

/* rl_crc32c.h: rr_crc(p, n), and rr_crc_bytes and rr_crc_hw for the functions below. */

int rr_crc32c_hardware(void)
{
    return rr_crc_hw;
}

/* crc32c of buf[start:end]; -1 when the range is not inside the buffer. */
int64_t rr_crc32c(const unsigned char *buf, size_t buf_len, size_t start, size_t end)
{
    if (start > end || end > buf_len) return -1;
    return rr_crc(buf + start, end - start);
}

/* The same by the table alone: what a CPU without the instruction runs, callable here so that
   the tests check it on a machine that has one. */
int64_t rr_crc32c_table(const unsigned char *buf, size_t buf_len, size_t start, size_t end)
{
    if (start > end || end > buf_len) return -1;
    return ~rr_crc_bytes(~0u, buf + start, end - start) & 0xFFFFFFFFu;
}

/* --------------------------------------------------------------------- stored batches */

/* RecordBatch v2's header, big-endian (ringlog_proto/batch.py owns the layout; these are checked
   against it at import): base_offset i64 @0, batch_length i32 @8, magic i8 @16, crc u32 @17
   covering [21, 12 + batch_length), record_count i32 @57. */
#define RR_BATCH_HEADER_SIZE 61
#define RR_BATCH_CRC_START 21
#define RR_BATCH_MAGIC 2
#define RR_BATCH_LENGTH_PREFIX 12
#define RR_BATCH_LENGTH_AT 8
#define RR_BATCH_MAGIC_AT 16
#define RR_BATCH_CRC_AT 17
#define RR_BATCH_ATTRIBUTES_AT 21
#define RR_BATCH_LAST_DELTA_AT 23
#define RR_BATCH_BASE_TS_AT 27
#define RR_BATCH_MAX_TS_AT 35
#define RR_BATCH_COUNT_AT 57
/* and the rules of a produced batch's header (batch.py's `invalid_header`, `refused_batch`) */
#define RR_RECORD_COUNT_MAX (1 << 20)
#define RR_RECORD_HEADER_SIZE 7
#define RR_ATTR_COMPRESSION 0x07
#define RR_ATTR_TRANSACTIONAL 0x10
#define RR_ATTR_CONTROL 0x20
#define RR_ATTR_KNOWN 0x3F
/* and a stored batch's (`invalid_stored_header`): a cleaned batch may carry a delete horizon */
#define RR_ATTR_DELETE_HORIZON 0x40
#define RR_ATTR_STORED_KNOWN (RR_ATTR_KNOWN | RR_ATTR_DELETE_HORIZON)
#define RR_CODEC_MAX 4
/* rr_check_produced's flags: walk the records of an uncompressed batch; let a transactional
   batch through (a control batch never is: markers are the broker's to write, not a
   producer's). */
#define RR_CHECK_WALK 1
#define RR_CHECK_TRANSACTIONAL 2

enum {
    RR_SCAN_TRUNCATED = 1,   /* fewer bytes than a header left */
    RR_SCAN_BASE_OFFSET = 2, /* the batch does not start at the offset the one before ends at */
    RR_SCAN_FRAMING = 3,     /* bad magic, or a length shorter than a header or past the end */
    RR_SCAN_CRC = 4,
    RR_SCAN_BOUNDS = 5,      /* pos..end is not inside the buffer */
};

static inline uint64_t rr_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

static inline uint32_t rr_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Check the batches in buf[pos:end], the first at `base_offset`, each starting where the one
   before ends. 0 when all are intact, else why the scan stopped (RR_SCAN_*). Either way
   out[0] is the end of the intact batches and out[1] the offset after them; on a stop, out[2],
   out[3] and out[4] are the stopping batch's base offset, length and magic as read (what the
   message names). */
int rr_scan_stored(const unsigned char *buf, size_t buf_len, size_t pos, size_t end,
                   int64_t base_offset, int64_t *out)
{
    out[0] = (int64_t)pos;
    out[1] = base_offset;
    out[2] = out[3] = out[4] = 0;
    if (pos > end || end > buf_len) return RR_SCAN_BOUNDS;
    while (pos < end) {
        const unsigned char *h = buf + pos;
        if (end - pos < RR_BATCH_HEADER_SIZE) return RR_SCAN_TRUNCATED;
        int64_t found = (int64_t)rr_be64(h);
        int64_t length = (int32_t)rr_be32(h + RR_BATCH_LENGTH_AT);
        int64_t magic = (int8_t)h[RR_BATCH_MAGIC_AT];
        int64_t size = RR_BATCH_LENGTH_PREFIX + length;
        out[2] = found;
        out[3] = length;
        out[4] = magic;
        if (found != out[1]) return RR_SCAN_BASE_OFFSET;
        if (magic != RR_BATCH_MAGIC || size < RR_BATCH_HEADER_SIZE || (uint64_t)size > end - pos)
            return RR_SCAN_FRAMING;
        if (rr_crc(h + RR_BATCH_CRC_START, (size_t)size - RR_BATCH_CRC_START) != rr_be32(h + RR_BATCH_CRC_AT))
            return RR_SCAN_CRC;
        pos += (size_t)size;
        out[0] = (int64_t)pos;
        out[1] += (int32_t)rr_be32(h + RR_BATCH_COUNT_AT);
    }
    return 0;
}

/* --------------------------------------------------------------------- produced batches */

/* The size of the batch at buf[pos:] when it passes every check a produce makes
   (broker/storage/log.py's `validate`: header, size limit, `invalid_header`, crc, and the walk
   when RR_CHECK_WALK and the batch is not compressed; a transactional batch only with
   RR_CHECK_TRANSACTIONAL), else 0. Why it fails is not this function's to
   say: the caller's Python checks find the reason, and whatever they accept that this refused
   is accepted (only "passes" must never differ). */
static int64_t rr_produced_size(const unsigned char *buf, size_t buf_len, size_t pos, int64_t max_batch,
                                int flags)
{
    const unsigned char *h = buf + pos;
    if (buf_len - pos < RR_BATCH_HEADER_SIZE || (int8_t)h[RR_BATCH_MAGIC_AT] != RR_BATCH_MAGIC) return 0;
    int64_t length = (int32_t)rr_be32(h + RR_BATCH_LENGTH_AT);
    int64_t size = RR_BATCH_LENGTH_PREFIX + length;
    if (size > max_batch || size < RR_BATCH_HEADER_SIZE || (uint64_t)size > buf_len - pos) return 0;
    int64_t count = (int32_t)rr_be32(h + RR_BATCH_COUNT_AT);
    if (count < 1 || count > RR_RECORD_COUNT_MAX) return 0;
    if ((int32_t)rr_be32(h + RR_BATCH_LAST_DELTA_AT) != count - 1) return 0;
    int64_t attributes = (int16_t)((uint16_t)h[RR_BATCH_ATTRIBUTES_AT] << 8 | h[RR_BATCH_ATTRIBUTES_AT + 1]);
    if (attributes & ~(int64_t)RR_ATTR_KNOWN) return 0;
    if (attributes & RR_ATTR_CONTROL) return 0;
    if (attributes & RR_ATTR_TRANSACTIONAL && !(flags & RR_CHECK_TRANSACTIONAL)) return 0;
    int64_t codec = attributes & RR_ATTR_COMPRESSION;
    if (codec > RR_CODEC_MAX) return 0;
    if (!codec && size - RR_BATCH_HEADER_SIZE < count * RR_RECORD_HEADER_SIZE) return 0;
    if ((int64_t)rr_be64(h + RR_BATCH_MAX_TS_AT) < (int64_t)rr_be64(h + RR_BATCH_BASE_TS_AT)) return 0;
    uint32_t crc = rr_crc(h + RR_BATCH_CRC_START, (size_t)size - RR_BATCH_CRC_START);
    if (crc != rr_be32(h + RR_BATCH_CRC_AT)) return 0;
    if (flags & RR_CHECK_WALK && !codec
        && rr_walk_records(buf, buf_len, pos + RR_BATCH_HEADER_SIZE, pos + (size_t)size, (uint32_t)count))
        return 0;
    return size;
}

/* The end of the leading batches of buf[0:buf_len] that pass (rr_produced_size): buf_len when
   all do. A produce's batches checked in one call, where Python made ~10 per batch. */
int64_t rr_check_produced(const unsigned char *buf, size_t buf_len, int64_t max_batch, int flags)
{
    size_t pos = 0;
    while (pos < buf_len) {
        int64_t size = rr_produced_size(buf, buf_len, pos, max_batch, flags);
        if (!size) break;
        pos += (size_t)size;
    }
    return (int64_t)pos;
}

/* --------------------------------------------------------------------- a follower's copies */

/* The size of the batch at buf[pos:] when it passes a follower's checks of its leader's batch
   (broker/storage/validation.py's `validate_stored`: the size limit, `invalid_stored_header`,
   the crc; the records are not walked nor a compressed batch inflated: the leader did that
   when they were produced, and the crc covers them since), else 0. */
static int64_t rr_stored_size(const unsigned char *buf, size_t buf_len, size_t pos, int64_t max_batch)
{
    const unsigned char *h = buf + pos;
    if (buf_len - pos < RR_BATCH_HEADER_SIZE || (int8_t)h[RR_BATCH_MAGIC_AT] != RR_BATCH_MAGIC) return 0;
    int64_t length = (int32_t)rr_be32(h + RR_BATCH_LENGTH_AT);
    int64_t size = RR_BATCH_LENGTH_PREFIX + length;
    if (size > max_batch || size < RR_BATCH_HEADER_SIZE || (uint64_t)size > buf_len - pos) return 0;
    int64_t delta = (int32_t)rr_be32(h + RR_BATCH_LAST_DELTA_AT);
    if (delta < 0 || delta >= RR_RECORD_COUNT_MAX) return 0;
    int64_t count = (int32_t)rr_be32(h + RR_BATCH_COUNT_AT);
    if (count < 0 || count > delta + 1) return 0;
    int64_t attributes = (int16_t)((uint16_t)h[RR_BATCH_ATTRIBUTES_AT] << 8 | h[RR_BATCH_ATTRIBUTES_AT + 1]);
    if (attributes & ~(int64_t)RR_ATTR_STORED_KNOWN) return 0;
    int64_t codec = attributes & RR_ATTR_COMPRESSION;
    if (codec > RR_CODEC_MAX) return 0;
    if (count == 0) {
        if (size != RR_BATCH_HEADER_SIZE || codec) return 0;
    } else {
        if (!codec && size - RR_BATCH_HEADER_SIZE < count * RR_RECORD_HEADER_SIZE) return 0;
        if (!(attributes & RR_ATTR_DELETE_HORIZON)
            && (int64_t)rr_be64(h + RR_BATCH_MAX_TS_AT) < (int64_t)rr_be64(h + RR_BATCH_BASE_TS_AT))
            return 0;
    }
    uint32_t crc = rr_crc(h + RR_BATCH_CRC_START, (size_t)size - RR_BATCH_CRC_START);
    if (crc != rr_be32(h + RR_BATCH_CRC_AT)) return 0;
    return size;
}

/* The end of the leading batches of buf[0:buf_len] that pass (rr_stored_size): buf_len when all
   do. A follower's fetch, ~16 batches per MiB, checked in one call. */
int64_t rr_check_stored(const unsigned char *buf, size_t buf_len, int64_t max_batch)
{
    size_t pos = 0;
    while (pos < buf_len) {
        int64_t size = rr_stored_size(buf, buf_len, pos, max_batch);
        if (!size) break;
        pos += (size_t)size;
    }
    return (int64_t)pos;
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "native._records",
    SOURCE,
    include_dirs=[os.path.dirname(os.path.abspath(__file__))],  # rl_utf8.h, rl_crc32c.h
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
