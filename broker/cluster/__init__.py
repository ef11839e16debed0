"""The cluster: how several ringlog nodes become one broker (docs/CLUSTER.md).

- `swim.py`: membership, SWIM over UDP in RLMB packets, sans-I/O. A failure *signal* only.
- `placement.py`: weighted rendezvous placement of a partition's replicas over nodes.
- `store.py`: the metadata store (etcd) behind get/put/txn/watch/lease; the record of the cluster.
- `election.py`: one controller at a time, on an etcd lease.
- `producer_ids.py`: blocks of producer ids claimed from the store (the core's `BlockSource`).
- `controller.py`, `agent.py`: what the controller decides, and what each node's supervisor runs.

Runs in the supervisor, never in a worker: workers learn the cluster's state from what the
supervisor publishes under `<data_dir>/run/`.
"""
