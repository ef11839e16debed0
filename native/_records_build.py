"""cffi API-mode builder for `native._records`: the broker's record-framing walk in C.

Rules this module keeps:
- Its own extension, not linked to liburing: a machine without io_uring still gets the fast walk.
  Built by `pip install -e .` (setup.py lists it in `cffi_modules` beside `native/_build.py`).
- The walk is the exact twin of `ringlog_proto.batch.walk_records_python`: same checks in the
  same order, same result encoding, so the two can be tested against each other and either one
  can serve the broker (the Python one is the fallback when this module is not built).
- It reads lengths, counts and header-key bytes (UTF-8, because clients decode header keys as
  text), never payload bytes. One call per batch: the per-record loop is what Python cannot
  afford at ~1 µs per record on the produce path.
- The GIL is held during the walk (see the preamble of SOURCE): it is too short to be worth
  releasing, and releasing it cost as much as the walk.
- It trusts nothing in the buffer: every length is checked against the bytes left in its record
  before it is used, in 64-bit arithmetic, so no field value can make it read out of bounds.

Result (an i64): 0 when the section frames exactly `count` records, else
`code | record_index << 8 | byte_offset << 32` (byte offset from `start`), codes in
`ringlog_proto.batch.RECORD_ERRORS`.
"""

from __future__ import annotations

from cffi import FFI

CDEF = """
int64_t rr_walk_records(const unsigned char *buf, size_t buf_len, size_t start, size_t end,
                        uint32_t count);
"""

SOURCE = r"""
#include <stddef.h>
#include <stdint.h>

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
    RR_RECORD_HEADER_TRUNCATED = 2,
    RR_RECORD_PAST_END = 3,
    RR_RECORD_TOO_SHORT = 4,
    RR_KEY_LENGTH_INVALID = 5,
    RR_KEY_PAST_RECORD = 6,
    RR_VALUE_LENGTH_INVALID = 7,
    RR_VALUE_PAST_RECORD = 8,
    RR_HEADER_FIELD_PAST_RECORD = 9,
    RR_HEADER_KEY_PAST_RECORD = 10,
    RR_HEADER_KEY_NOT_UTF8 = 11,
    RR_HEADER_VALUE_LENGTH_INVALID = 12,
    RR_HEADER_VALUE_PAST_RECORD = 13,
    RR_RECORD_LENGTH_MISMATCH = 14,
    RR_TRAILING_BYTES = 15,
    RR_BOUNDS = 16,
};

#define RR_FAIL(code, index, at) \
    return (int64_t)(code) | ((int64_t)(index) << 8) | ((int64_t)(at) << 32)

static inline uint32_t rr_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint16_t rr_be16(const unsigned char *p)
{
    return (uint16_t)(((uint16_t)p[0] << 8) | (uint16_t)p[1]);
}

/* Strict UTF-8 as Python's bytes.decode() accepts it: no overlongs, no surrogates, <= U+10FFFF. */
static int rr_utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) { need = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) need = 2;
        else if (c == 0xED) { need = 2; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) need = 2;
        else if (c == 0xF0) { need = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) { need = 3; hi = 0x8F; }
        else return 0;
        if (n - i - 1 < need) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += need + 1;
    }
    return 1;
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
        if (len - p < 18) RR_FAIL(RR_RECORD_HEADER_TRUNCATED, i, p);
        uint64_t rlen = rr_be32(s + p);
        if (rlen > len - p - 4) RR_FAIL(RR_RECORD_PAST_END, i, p);
        if (rlen < 14) RR_FAIL(RR_RECORD_TOO_SHORT, i, p);
        uint64_t rend = p + 4 + rlen;
        int32_t klen = (int32_t)rr_be32(s + p + 8);
        int32_t vlen = (int32_t)rr_be32(s + p + 12);
        uint32_t hcount = rr_be16(s + p + 16);
        uint64_t q = p + 18;
        if (klen < -1) RR_FAIL(RR_KEY_LENGTH_INVALID, i, p + 8);
        if (klen > 0) {
            if ((uint64_t)klen > rend - q) RR_FAIL(RR_KEY_PAST_RECORD, i, p + 8);
            q += (uint64_t)klen;
        }
        if (vlen < -1) RR_FAIL(RR_VALUE_LENGTH_INVALID, i, p + 12);
        if (vlen > 0) {
            if ((uint64_t)vlen > rend - q) RR_FAIL(RR_VALUE_PAST_RECORD, i, p + 12);
            q += (uint64_t)vlen;
        }
        for (uint32_t k = 0; k < hcount; k++) {
            if (rend - q < 2) RR_FAIL(RR_HEADER_FIELD_PAST_RECORD, i, q);
            uint64_t hk = rr_be16(s + q);
            if (hk > rend - q - 2) RR_FAIL(RR_HEADER_KEY_PAST_RECORD, i, q);
            if (!rr_utf8_ok(s + q + 2, (size_t)hk)) RR_FAIL(RR_HEADER_KEY_NOT_UTF8, i, q);
            q += 2 + hk;
            if (rend - q < 4) RR_FAIL(RR_HEADER_FIELD_PAST_RECORD, i, q);
            int32_t hv = (int32_t)rr_be32(s + q);
            if (hv < -1) RR_FAIL(RR_HEADER_VALUE_LENGTH_INVALID, i, q);
            q += 4;
            if (hv > 0) {
                if ((uint64_t)hv > rend - q) RR_FAIL(RR_HEADER_VALUE_PAST_RECORD, i, q - 4);
                q += (uint64_t)hv;
            }
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
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
