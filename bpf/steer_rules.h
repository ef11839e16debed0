/* The two steering rules of reuseport.c, as functions that a test can run on their own.
 *
 * Rules: bit for bit ringlog_proto: `rl_frame_key` reads the partition identity where
 * ringlog_proto/frames.py puts it (tests/bpf/test_steer_rules.py checks these defines against the
 * Python constants, and runs this very code through BPF_PROG_TEST_RUN over frames the Python
 * encoder made); `rl_port_owner` is routing.port_owner, compared over thousands of cases the same
 * way. Needs rendezvous.h first (RL_MAX_CORES).
 */
#define RL_FRAME_MAGIC 0x52
#define RL_FRAME_VERSION 1
#define RL_FRAME_PREFIX 24 /* the frame header: length .. partition (frames.HEADER_SIZE) */
#define RL_FRAME_MAGIC_OFFSET 4
#define RL_FRAME_VERSION_OFFSET 5
#define RL_FRAME_TOPIC_ID_OFFSET 16 /* frames.TOPIC_ID_OFFSET */
#define RL_FRAME_PARTITION_OFFSET 20 /* frames.PARTITION_OFFSET */

static __always_inline u32 rl_be32(const u8 *p)
{
    return (u32)p[0] << 24 | (u32)p[1] << 16 | (u32)p[2] << 8 | p[3];
}

/* The partition key (routing.partition_key) a frame header names, or 0 when it names none: not a
 * ringlog frame of this version, or topic id 0 (a request about no partition). A key with a
 * topic id is never 0. */
static __always_inline u64 rl_frame_key(const u8 *f)
{
    if (f[RL_FRAME_MAGIC_OFFSET] != RL_FRAME_MAGIC || f[RL_FRAME_VERSION_OFFSET] != RL_FRAME_VERSION)
        return 0;
    u32 topic = rl_be32(f + RL_FRAME_TOPIC_ID_OFFSET);
    if (topic == 0)
        return 0;
    return (u64)topic << 32 | rl_be32(f + RL_FRAME_PARTITION_OFFSET);
}

/* The port rule (routing.port_owner): source port mod the configured cores when that core is live
 * in `live`, else -1. */
static __always_inline int rl_port_owner(u32 sport, u32 cores, u64 live)
{
    if (cores == 0)
        return -1;
    u32 core = sport % cores;
    if (core < RL_MAX_CORES && ((live >> core) & 1))
        return (int)core;
    return -1;
}
