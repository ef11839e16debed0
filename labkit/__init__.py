"""The harnesses that tests/, bench/ and scripts/ share: real brokers and etcd members in
subprocesses (`brokerproc`, `etcdproc`), network namespaces with brokers inside (`netlab`, one
node; `clusterlab`, a cluster on a bridge with the nemesis's faults), the nemesis's workload and
checker (`nemesisload`, `clusterchecker`), certificates and the security commands (`securitylab`),
Kafka requests of any api and version (`kafka_requests`), bad batches (`poison_batches`) and the
SWIM simulator (`swimsim`).

Rules this package keeps:
- Nothing the broker ships imports it (an import-linter contract in pyproject.toml): it starts
  the broker as a user does, from outside.
- `pip install -e .` installs it beside the broker, so a benchmark or a script imports it as it
  imports `broker`, without touching sys.path. Helpers only the tests use stay in tests/.
- Whatever it starts it stops, by pid, and whatever it makes in the kernel it removes, also
  when the caller fails.
"""
