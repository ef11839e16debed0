"""`broker reassign`: move a cluster's replicas by starting a reassignment in its etcd; the
controller completes it (docs/CLUSTER.md, "Placement").
"""

from __future__ import annotations

import argparse
import sys


def cmd_reassign(args: argparse.Namespace) -> int:
    """Start a reassignment in the store; the controller completes it once the new replicas are
    in sync (docs/CLUSTER.md, "Placement"). Prints what moves; `topics describe` shows progress."""
    from broker.cluster.admin import ClusterAdmin  # noqa: PLC0415 (the etcd client, for this command only)
    from broker.cluster.records import Keys, TopicRecord  # noqa: PLC0415
    from broker.cluster.store import EtcdStore, StoreError  # noqa: PLC0415
    from broker.core.replica_changes import ReplicaRefused  # noqa: PLC0415

    keys = Keys(args.cluster_name)
    store = EtcdStore([e.strip() for e in args.etcd.split(",") if e.strip()])
    admin = ClusterAdmin(store, keys)
    try:
        if args.drain is not None:
            moves = admin.drain(args.drain)
            for tid, p, target in moves:
                print(f"topic id {tid} partition {p}: -> {','.join(map(str, target))}")
            print(f"{len(moves)} partition(s) moving off node {args.drain}")
            return 0
        what = "--cancel" if args.cancel else "--replicas"
        if args.topic is None or args.partition is None:
            print(f"broker: reassign {what} needs TOPIC and PARTITION", file=sys.stderr)
            return 2
        kv = store.get(keys.topic(args.topic))
        if kv is None:
            print(f"broker: unknown topic {args.topic!r}", file=sys.stderr)
            return 1
        topic_id = TopicRecord.decode(kv.value).topic.topic_id
        if args.cancel:
            state = admin.alter_reassignment(topic_id, args.partition, None)
            now = ",".join(map(str, state.replicas))
            print(f"{args.topic} partition {args.partition}: cancelled, replicas {now}")
            return 0
        replicas = [int(x) for x in args.replicas.split(",") if x.strip()]
        state = admin.reassign(topic_id, args.partition, replicas)
        before, after = ",".join(map(str, state.replicas)), ",".join(map(str, replicas))
        print(f"{args.topic} partition {args.partition}: {before} -> {after}")
        return 0
    except (StoreError, ValueError, ReplicaRefused) as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()


def add_reassign_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    reassign = sub.add_parser(
        "reassign",
        help="move a cluster's replicas: one partition's (--replicas, --cancel), or every one off a "
        "node (--drain)",
    )
    reassign.add_argument(
        "--etcd", required=True, metavar="HOST:PORT[,HOST:PORT...]", help="the cluster's etcd"
    )
    reassign.add_argument("--cluster-name", default="ringlog")
    reassign.add_argument(
        "topic", nargs="?", help="the topic of the partition to move (with --replicas or --cancel)"
    )
    reassign.add_argument("partition", nargs="?", type=int)
    what = reassign.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--replicas", metavar="N,N,...", help="the partition's new replicas, preferred leader first"
    )
    what.add_argument("--drain", type=int, metavar="NODE", help="move every replica off this node")
    what.add_argument(
        "--cancel",
        action="store_true",
        help="cancel the partition's reassignment under way (the replicas it added go again)",
    )
    reassign.set_defaults(func=cmd_reassign)
