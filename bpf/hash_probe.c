/* A test harness for rendezvous.h: an XDP program run only through BPF_PROG_TEST_RUN, never attached.
 * Input packet: key u64, live mask u64 (host order); it writes the owner (s32) over the first 4 bytes. */
#include <uapi/linux/bpf.h>

int rl_hash_probe(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    u64 *in = data;
    if ((void *)(in + 2) > end)
        return XDP_ABORTED;
    u64 key = in[0];
    u64 live = in[1];
    int owner = rl_owner(key, live);
    *(s32 *)data = owner;
    return XDP_PASS;
}
