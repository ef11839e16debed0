/* The rendezvous hash of ringlog_proto/routing.py, transcribed for BPF.
 *
 * Rules: bit for bit the same function as routing.owner() (tests/bpf/test_hash.py runs this very
 * code through BPF_PROG_TEST_RUN over thousands of (partition, live core set) pairs and compares).
 * Only u64 adds, xors, shifts and multiplies; one bounded loop over RL_MAX_CORES.
 */
/* The live set is one u64 bitmask; bpf/kernel.py MAX_CORES is the same limit. A program for N cores
 * may define it as N (bpf/steering.py does): no bit at or above N is ever live, so the owner is the
 * same, and the verifier walks N turns of the loop, not 64 (2 cores: loaded in 1 ms, not 190). */
#ifndef RL_MAX_CORES
#define RL_MAX_CORES 64
#endif

static __always_inline u64 rl_mix64(u64 x)
{
    u64 z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* The owner among the cores whose bit is set in `live`, or -1 when none is. Ties go to the lower
 * core because cores are visited in increasing order and only a strictly higher score wins. */
static __always_inline int rl_owner(u64 key, u64 live)
{
    int best = -1;
    u64 best_score = 0;
    for (int c = 0; c < RL_MAX_CORES; c++) {
        if (!((live >> c) & 1))
            continue;
        u64 s = rl_mix64(key ^ rl_mix64((u64)c + 1));
        if (best < 0 || s > best_score) {
            best = c;
            best_score = s;
        }
    }
    return best;
}
