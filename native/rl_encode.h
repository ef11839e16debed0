/* Kafka RecordBatch v2 encoding, for the extensions that include this file: `native._codec` (cffi:
   a records section with keys, headers and timestamps, `rc_encode`) and `native._batch` (CPython:
   a whole batch of plain values, `rc_encode_batch`). Each gets its own copy of these static
   functions. The batch header's layout is ringlog_proto/batch.py's: each including module exports
   the RC_AT_* offsets below and batch.py checks them when it loads it. Include after <stddef.h>,
   <stdint.h>, <string.h> and rl_crc32c.h.

   Results (an i64): bytes written (>= 0), or `-(code | record_index << 8)`, codes below (their
   names in `ringlog_proto.records_codec.ENCODE_ERRORS`). */
#ifndef RL_ENCODE_H
#define RL_ENCODE_H

enum {
    RC_ENC_OUT_TOO_SMALL = 1,
    RC_ENC_LENGTH_INVALID = 2,
    RC_ENC_BLOB_MISMATCH = 3,
    RC_ENC_TIMESTAMP_RANGE = 4,
    RC_ENC_RECORD_TOO_BIG = 5,
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

__attribute__((unused)) static int64_t rc_encode(unsigned char *out, size_t out_cap, uint32_t n,
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
__attribute__((unused)) static int64_t rc_encode_batch(unsigned char *out, size_t out_cap, uint32_t n,
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

#endif
