/* sk_reuseport program: choose the listener (core) of every new connection to the public port.
 *
 * Rules this program keeps (bpf/steering.py loads it; docs/ARCHITECTURE.md has the decisions):
 * - Payload rule: a SYN carrying data (TCP Fast Open) that starts with a ringlog frame (magic 0x52,
 *   frame version 1) naming a partition (topic id != 0 at offset 16, partition at offset 20, both
 *   big-endian u32: steer_rules.h rl_frame_key) goes to the partition's owner: rendezvous.h over
 *   the live cores.
 * - Port rule: otherwise, core = TCP source port % configured cores, when that core is live
 *   (steer_rules.h rl_port_owner, which is ringlog_proto/routing.py port_owner). A client can pick
 *   its source port on purpose to reach a core.
 * - Otherwise (no live core chosen, or the choice failed) SK_PASS without a choice: the kernel's own
 *   reuseport hash picks. Every decision is counted in rl_steer_stats (per CPU).
 * - Never drops a connection: every path returns SK_PASS.
 * Built with -DRL_SOCKMAP_FD=<fd>: the SOCKMAP (index = core) is created by bpf/steering.py and its fd
 * is compiled in, because bcc rewrites map.method() calls but not a map passed to this helper.
 */
#include <uapi/linux/bpf.h>

#define RL_STEER_PAYLOAD 0
#define RL_STEER_PORT 1
#define RL_STEER_DEFAULT 2
#define RL_STEER_ERROR 3
#define RL_STEER_SLOTS 4

struct rl_live {
    u64 mask;  /* bit c set: core c is live (its listener is in the sockmap and served) */
    u32 cores; /* the configured core count, for the port rule */
    u32 generation; /* bumped by every update: tells readers the map is being kept */
};

BPF_ARRAY(rl_live_cores, struct rl_live, 1);
BPF_PERCPU_ARRAY(rl_steer_stats, u64, RL_STEER_SLOTS);

static __always_inline void rl_count(u32 slot)
{
    u64 *v = rl_steer_stats.lookup(&slot);
    if (v)
        *v += 1; /* per-CPU slot: no atomics needed */
}

static __always_inline int rl_select(struct sk_reuseport_md *md, u32 core, u32 slot)
{
    long err = bpf_sk_select_reuseport(md, (void *)bpf_pseudo_fd(1, RL_SOCKMAP_FD), &core, 0);
    rl_count(err == 0 ? slot : RL_STEER_ERROR);
    return SK_PASS;
}

int rl_reuseport_select(struct sk_reuseport_md *md)
{
    u32 zero = 0;
    struct rl_live *live = rl_live_cores.lookup(&zero);
    if (!live || !live->mask || !live->cores) {
        rl_count(RL_STEER_DEFAULT);
        return SK_PASS;
    }
    u64 mask = live->mask;
    u32 cores = live->cores;

    u8 tcp[20];
    if (bpf_skb_load_bytes(md, 0, tcp, sizeof(tcp)) < 0) {
        rl_count(RL_STEER_DEFAULT);
        return SK_PASS;
    }
    u32 doff = (u32)(tcp[12] >> 4) * 4;
    if (doff >= 20 && doff <= 60 && md->len >= doff + RL_FRAME_PREFIX) {
        u8 f[RL_FRAME_PREFIX];
        if (bpf_skb_load_bytes(md, doff, f, sizeof(f)) == 0) {
            u64 key = rl_frame_key(f);
            if (key != 0) {
                int owner = rl_owner(key, mask);
                if (owner >= 0)
                    return rl_select(md, (u32)owner, RL_STEER_PAYLOAD);
            }
        }
    }
    int core = rl_port_owner((u32)tcp[0] << 8 | tcp[1], cores, mask);
    if (core >= 0)
        return rl_select(md, (u32)core, RL_STEER_PORT);
    rl_count(RL_STEER_DEFAULT);
    return SK_PASS;
}
