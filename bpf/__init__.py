"""eBPF for ringlog: connection steering to the owning core (sk_reuseport + SOCKMAP) and the XDP
classifier, loaded with bcc (Debian's python3-bpfcc), attached with setsockopt (steering) and a BPF
link (XDP); pyroute2 only reads and cleans interfaces.

Rules this package keeps:
- Importing it never imports bcc or pyroute2: `kernel.ebpf_unavailable()` says why eBPF cannot be
  used here, and only the loaders (`steering.Steering`, `xdp.XdpClassifier`) import bcc, so a
  broker without bcc still starts (`--ebpf auto`) and clients never need it.
- The C lives in `*.c`/`*.h` beside the Python that loads it; `rendezvous.h` is the one C copy of
  `ringlog_proto.routing`'s hash, and `steer_rules.h` of its port rule and of where
  `ringlog_proto.frames` puts the partition identity, checked against them bit for bit by
  tests/bpf/test_hash.py and tests/bpf/test_steer_rules.py. `xdp.c` states no fact of the
  membership packet: `xdp.py` compiles it with `ringlog_proto.membership`'s constants as -D flags
  (tests/bpf/test_xdp_rules.py).
- Whoever loads a program detaches it and releases its maps (`close()`, idempotent), and nothing is
  attached in a way that outlives its loader: a SIGKILL leaves no program, map or link behind
  (plane.py says how, and what the next start undoes).
"""
