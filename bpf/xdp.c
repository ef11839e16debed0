/* XDP classifier: counts ingress packets by class and drops malformed membership packets.
 *
 * Rules this program keeps (bpf/xdp.py loads and attaches it):
 * - Classes, by the destination port looked up in rl_xdp_ports ((protocol << 16) | port -> class):
 *   membership (UDP to the membership port), partition (TCP to a broker port), other (the rest,
 *   including non-IP, fragments after the first, and IPv6 with extension headers).
 * - A packet to the membership port whose UDP payload is shorter than a membership header and its
 *   tag, or does not start with the magic and version of the membership packet, is dropped
 *   (XDP_DROP) and counted as malformed. The tag itself (an HMAC under the cluster key) is checked
 *   in user space: the key never enters the kernel. That is the only packet this program drops;
 *   everything else is XDP_PASS, untouched.
 * - The membership packet's magic, version, their offsets and its smallest size are not written
 *   here: ringlog_proto/membership.py owns them, and bpf/xdp.py passes them as -D flags
 *   (`membership_defines`). Compiled without them, this file stops at the #error below.
 * - Counters are per CPU (BPF_PERCPU_ARRAY): no atomics on the packet path; readers sum the CPUs.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#define RL_CLASS_MEMBERSHIP 0
#define RL_CLASS_PARTITION 1
#define RL_CLASS_OTHER 2
#define RL_CLASS_MALFORMED 3 /* membership port, bad packet: dropped */
#define RL_CLASS_SLOTS 4

#if !defined(RL_MEMBERSHIP_MAGIC) || !defined(RL_MEMBERSHIP_MAGIC_OFFSET) || !defined(RL_MEMBERSHIP_VERSION) \
    || !defined(RL_MEMBERSHIP_VERSION_OFFSET) || !defined(RL_MEMBERSHIP_PACKET_MIN)
#error "the membership packet's defines are missing: load xdp.c through bpf/xdp.py"
#endif
/* Every byte read below lies within the RL_MEMBERSHIP_PACKET_MIN bytes checked against the end. */
_Static_assert(RL_MEMBERSHIP_MAGIC_OFFSET + 4 <= RL_MEMBERSHIP_PACKET_MIN, "magic within the checked bytes");
_Static_assert(RL_MEMBERSHIP_VERSION_OFFSET < RL_MEMBERSHIP_PACKET_MIN, "version within the checked bytes");

BPF_HASH(rl_xdp_ports, u32, u32, 64);
BPF_PERCPU_ARRAY(rl_xdp_stats, u64, RL_CLASS_SLOTS);

static __always_inline int rl_done(u32 cls, int action)
{
    u64 *v = rl_xdp_stats.lookup(&cls);
    if (v)
        *v += 1;
    return action;
}

int rl_xdp_classify(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return rl_done(RL_CLASS_OTHER, XDP_PASS);
    u8 proto;
    void *l4;
    if (eth->h_proto == htons(ETH_P_IP)) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > end || ip->ihl < 5)
            return rl_done(RL_CLASS_OTHER, XDP_PASS);
        if (ip->frag_off & htons(0x1FFF)) /* not the first fragment: no L4 header here */
            return rl_done(RL_CLASS_OTHER, XDP_PASS);
        proto = ip->protocol;
        l4 = (void *)ip + ip->ihl * 4;
    } else if (eth->h_proto == htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > end)
            return rl_done(RL_CLASS_OTHER, XDP_PASS);
        proto = ip6->nexthdr;
        l4 = (void *)(ip6 + 1);
    } else {
        return rl_done(RL_CLASS_OTHER, XDP_PASS);
    }
    u16 dport;
    if (proto == IPPROTO_TCP) {
        struct tcphdr *tcp = l4;
        if ((void *)(tcp + 1) > end)
            return rl_done(RL_CLASS_OTHER, XDP_PASS);
        dport = ntohs(tcp->dest);
    } else if (proto == IPPROTO_UDP) {
        struct udphdr *udp = l4;
        if ((void *)(udp + 1) > end)
            return rl_done(RL_CLASS_OTHER, XDP_PASS);
        dport = ntohs(udp->dest);
    } else {
        return rl_done(RL_CLASS_OTHER, XDP_PASS);
    }
    u32 key = (u32)proto << 16 | dport;
    u32 *cls = rl_xdp_ports.lookup(&key);
    if (!cls)
        return rl_done(RL_CLASS_OTHER, XDP_PASS);
    if (*cls != RL_CLASS_MEMBERSHIP)
        return rl_done(RL_CLASS_PARTITION, XDP_PASS);
    struct udphdr *udp = l4;
    u8 *p = (u8 *)(udp + 1);
    if ((void *)(p + RL_MEMBERSHIP_PACKET_MIN) > end || ntohs(udp->len) < sizeof(*udp) + RL_MEMBERSHIP_PACKET_MIN)
        return rl_done(RL_CLASS_MALFORMED, XDP_DROP);
    u8 *m = p + RL_MEMBERSHIP_MAGIC_OFFSET;
    u32 magic = (u32)m[0] << 24 | (u32)m[1] << 16 | (u32)m[2] << 8 | m[3]; /* big-endian on the wire */
    if (magic != RL_MEMBERSHIP_MAGIC || p[RL_MEMBERSHIP_VERSION_OFFSET] != RL_MEMBERSHIP_VERSION)
        return rl_done(RL_CLASS_MALFORMED, XDP_DROP);
    return rl_done(RL_CLASS_MEMBERSHIP, XDP_PASS);
}
