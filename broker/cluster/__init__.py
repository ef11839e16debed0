"""The cluster: how several ringlog nodes become one broker (docs/CLUSTER.md).

- `swim.py`: membership, SWIM over UDP in RLMB packets (ringlog_proto/membership.py), sans-I/O. A
  failure *signal* only.
- `placement.py`: weighted rendezvous placement of a partition's replicas over nodes.
- `store.py`: the metadata store (etcd) behind get/put/txn/watch/lease; the record of the cluster.
- `election.py`: one controller at a time, on an etcd lease.
- `records.py`: the keys and values of the cluster's records; `mirror.py`: a node's copy of them,
  fed by the store's watch, which the agent publishes to the workers.
- `admin.py`: the writes made outside the controller (topics, a leader's in-sync-set changes).
- `producer_ids.py`: blocks of producer ids claimed from the store (the core's `BlockSource`).
- `group_offsets.py`: consumer-group offsets in the store, so they outlive a coordinator node.
- `security_docs.py`: the cluster's users and ACLs in the store, copied into each node's files.
- `controller.py`, `agent.py`: what the controller decides, and what each node's supervisor runs.

The supervisor runs membership, the agent and the controller. A worker never watches the store:
it learns the cluster's state from what the supervisor publishes under `<data_dir>/run/`, and its
cores make their few writes (topics, in-sync sets, producer ids, group offsets, ACLs) through the
objects of this package that the worker hands them (`ClusterSettings`), on their blocking
threads, never on their loops.
"""
