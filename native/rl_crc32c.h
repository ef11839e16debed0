/* crc32c (Castagnoli), as Kafka's batches carry it, for the extensions that include this file
   (native._records checks batches with it, native._codec seals them): each gets its own copy of
   these static functions and tables. In hardware (SSE4.2's crc32 instruction, three streams at a
   time so that its 3-cycle latency is hidden, the streams joined by tables that append zeros to
   a crc), or byte-wise from a table where there is no such instruction. Include after
   <stddef.h>, <stdint.h> and <string.h>. */
#ifndef RL_CRC32C_H
#define RL_CRC32C_H

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define RR_CRC_POLY 0x82F63B78u /* Castagnoli, reflected */
#define RR_CRC_LONG 8192        /* bytes per stream in a three-stream step over large inputs */
#define RR_CRC_SHORT 256        /* the same for what is left */

/* All filled once when the module is loaded (a constructor: before any call can be made). */
static uint32_t rr_crc_table[256];      /* one byte into a crc */
static uint32_t rr_crc_long[4][256];    /* a crc followed by RR_CRC_LONG zero bytes, per crc byte */
static uint32_t rr_crc_short[4][256];   /* ... RR_CRC_SHORT zero bytes */
static int rr_crc_hw;                   /* SSE4.2 is there */

/* The raw register (no inversion before or after), as the crc32 instruction keeps it. */
static uint32_t rr_crc_bytes(uint32_t c, const unsigned char *p, size_t n)
{
    while (n--) c = rr_crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

/* The register after `n` more zero bytes: linear in `c`, so a table per byte of `c` holds it. */
static uint32_t rr_crc_shift(uint32_t t[4][256], uint32_t c)
{
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
}

static void rr_crc_zeros_table(uint32_t t[4][256], size_t n)
{
    static const unsigned char zeros[RR_CRC_LONG];
    uint32_t basis[32];
    for (int i = 0; i < 32; i++) basis[i] = rr_crc_bytes(1u << i, zeros, n);
    for (int k = 0; k < 4; k++)
        for (int v = 0; v < 256; v++) {
            uint32_t x = 0;
            for (int j = 0; j < 8; j++)
                if ((v >> j) & 1) x ^= basis[8 * k + j];
            t[k][v] = x;
        }
}

#if defined(__x86_64__)
/* Three streams of `block` bytes each go through the instruction side by side (its latency is
   3 cycles, its throughput one a cycle); the register of A||B||C is then
   shift(shift(crc(A)) ^ crc0(B)) ^ crc0(C), crc0 starting from zero. */
#define RR_CRC_STEPS(block, table)                                                    \
    while (n >= 3 * (size_t)(block)) {                                                \
        uint64_t c1 = 0, c2 = 0, a, b, d;                                             \
        const unsigned char *e = p + (block);                                         \
        do {                                                                          \
            memcpy(&a, p, 8);                                                         \
            memcpy(&b, p + (block), 8);                                               \
            memcpy(&d, p + 2 * (block), 8);                                           \
            c0 = _mm_crc32_u64(c0, a);                                                \
            c1 = _mm_crc32_u64(c1, b);                                                \
            c2 = _mm_crc32_u64(c2, d);                                                \
            p += 8;                                                                   \
        } while (p < e);                                                              \
        c0 = rr_crc_shift(table, (uint32_t)c0) ^ (uint32_t)c1;                        \
        c0 = rr_crc_shift(table, (uint32_t)c0) ^ (uint32_t)c2;                        \
        p += 2 * (size_t)(block);                                                     \
        n -= 3 * (size_t)(block);                                                     \
    }

__attribute__((target("sse4.2")))
static uint32_t rr_crc_sse42(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c0 = crc, a;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    RR_CRC_STEPS(RR_CRC_LONG, rr_crc_long)
    RR_CRC_STEPS(RR_CRC_SHORT, rr_crc_short)
    while (n >= 8) {
        memcpy(&a, p, 8);
        c0 = _mm_crc32_u64(c0, a);
        p += 8;
        n -= 8;
    }
    while (n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0;
}
#endif

__attribute__((constructor))
static void rr_crc_setup(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ RR_CRC_POLY : c >> 1;
        rr_crc_table[i] = c;
    }
    rr_crc_zeros_table(rr_crc_long, RR_CRC_LONG);
    rr_crc_zeros_table(rr_crc_short, RR_CRC_SHORT);
#if defined(__x86_64__)
    __builtin_cpu_init();
    rr_crc_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
}

/* crc32c (initial and final inversion, as Kafka's batches carry it) of p[0:n]. */
static uint32_t rr_crc(const unsigned char *p, size_t n)
{
#if defined(__x86_64__)
    if (rr_crc_hw) return ~rr_crc_sse42(~0u, p, n);
#endif
    return ~rr_crc_bytes(~0u, p, n);
}

#endif
