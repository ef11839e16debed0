/* A test harness for steer_rules.h: an XDP program run only through BPF_PROG_TEST_RUN, never
 * attached. Input packet (host order): sport u32, cores u32, live u64, then a 24-byte frame
 * header. It writes back the frame's key (u64, 0 for none) and the port rule's owner (s32). */
#include <uapi/linux/bpf.h>

int rl_steer_probe(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    u8 *p = data;
    if ((void *)(p + 16 + RL_FRAME_PREFIX) > end)
        return XDP_ABORTED;
    u32 sport = *(u32 *)p;
    u32 cores = *(u32 *)(p + 4);
    u64 live = *(u64 *)(p + 8);
    u8 f[RL_FRAME_PREFIX];
    __builtin_memcpy(f, p + 16, RL_FRAME_PREFIX);
    u64 key = rl_frame_key(f);
    int owner = rl_port_owner(sport, cores, live);
    *(u64 *)p = key;
    *(s32 *)(p + 8) = owner;
    return XDP_PASS;
}
