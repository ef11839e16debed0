"""ACL checks of Kafka requests, before the adapter acts on them (broker/security/acls.py decides).

Rules this module keeps:
- Every api names what it needs, as Kafka's authorizer does: Produce write on each topic; Fetch
  read; ListOffsets and OffsetForLeaderEpoch describe; CreateTopics create; DeleteTopics delete;
  FindCoordinator describe on the group; Join/Sync/Heartbeat/LeaveGroup read on the group;
  OffsetCommit read on the group and on each topic; OffsetFetch describe on both; DescribeGroups
  describe on each group; ListGroups lists only the groups the principal may describe (all of
  them with describe on the cluster: broker/kafka/groups.py); create on the cluster allows
  CreateTopics of any topic; DescribeAcls describe on the cluster, CreateAcls and DeleteAcls
  alter on it; DescribeConfigs, AlterConfigs and IncrementalAlterConfigs are checked resource by
  resource where they are answered (broker/kafka/configs.py: describe_configs or alter_configs
  on each topic, on the cluster for a broker's). The admin apis are checked item by item where
  they are answered, as Kafka checks them: CreatePartitions alter on each topic, DeleteRecords
  delete on each topic (broker/kafka/partitions.py); DeleteGroups delete on each group,
  OffsetDelete delete on the group and read on each topic (broker/kafka/group_admin.py);
  DescribeLogDirs describe on the cluster, DescribeProducers read on each topic,
  DescribeCluster nothing (broker/kafka/describe.py); DeleteTopics v6 delete on a topic named
  by id, once its name is known (broker/kafka/topics.py). ElectLeaders and
  AlterPartitionReassignments need alter on the cluster, ListPartitionReassignments describe on
  it (Kafka's ControllerApis), refused whole. ApiVersions, the SASL apis and
  InitProducerId (an id without a transactional id grants nothing: KIP-679) need nothing.
  Transactions (Kafka's rules): write on the transactional id for InitProducerId with one,
  AddPartitionsToTxn (and write on each topic), AddOffsetsToTxn (and read on the group), EndTxn,
  TxnOffsetCommit (and read on the group and each topic) and a Produce naming one; describe on it
  for FindCoordinator key type 1 and DescribeTransactions; ListTransactions shows only the ids
  the principal may describe (broker/kafka/transactions.py).
  Metadata is filtered instead (broker/kafka/adapter.py `_metadata`). OffsetForLeaderEpoch v0-1,
  which kio has no schema for, are checked where they are decoded (broker/kafka/leader_epoch.py).
- A refused request has no effect: it is answered with TOPIC_AUTHORIZATION_FAILED,
  GROUP_AUTHORIZATION_FAILED or CLUSTER_AUTHORIZATION_FAILED in every item of a response of its
  own shape (broker/kafka/unsupported.py `error_response`), an acks=0 produce with nothing.
- Produce, Fetch and ListOffsets are checked topic by topic instead, as Kafka does
  (`PER_TOPIC`): the adapter answers a refused topic's partitions TOPIC_AUTHORIZATION_FAILED and
  serves the others, so one producer writing to a topic it may and one it may not loses nothing
  of the first. The other apis naming several topics are refused whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply, Silent
from broker.kafka.codec import KafkaRequest, encode_response, response_schema
from broker.kafka.unsupported import error_response
from broker.security.acls import CLUSTER_NAME, OPERATIONS, Authorizer

_TOPIC_OPS: Final = {0: "write", 1: "read", 2: "describe", 19: "create", 20: "delete", 23: "describe"}
_GROUP_OPS: Final = {
    10: "describe", 11: "read", 12: "read", 13: "read", 14: "read", 8: "read", 9: "describe",
    25: "read", 28: "read",
}  # fmt: skip
# api -> what it needs on its transactional id (Kafka's KafkaApis): InitProducerId (with one),
# AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit and a transactional Produce
# write; FindCoordinator (key type 1) and DescribeTransactions describe
_TXN_OPS: Final = {
    0: "write",
    22: "write",
    24: "write",
    25: "write",
    26: "write",
    28: "write",
    65: "describe",
}
PRODUCE: Final = 0
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
CREATE_TOPICS: Final = 19
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
DESCRIBE_ACLS: Final = 29
ACL_ADMIN: Final = frozenset((29, 30, 31))
# ElectLeaders, AlterPartitionReassignments, ListPartitionReassignments: what each needs on the cluster
# WriteTxnMarkers: alter (KIP-1037; Kafka's brokers use cluster_action, which is not ours)
CLUSTER_OPS: Final = {43: "alter", 45: "alter", 46: "describe", 27: "alter"}
# api -> what it needs on each topic it names, checked per topic by the adapter (module rules)
PER_TOPIC: Final = {0: "write", 1: "read", 2: "describe"}


def _txn_ids(api_key: int, body: Any) -> Iterable[str]:
    match api_key:
        case 10:
            return (str(body.key),)
        case 24:
            return (str(body.v3_and_below_transactional_id),)
        case 65:
            return (str(t) for t in body.transactional_ids)
    txn_id = getattr(body, "transactional_id", None)
    return () if txn_id is None else (str(txn_id),)


def _topic_names(api_key: int, body: Any) -> Iterable[str]:
    match api_key:
        case 0:
            return (t.name for t in body.topic_data)
        case 1 | 23:
            return (t.topic for t in body.topics)
        case 2 | 19 | 8:
            return (t.name for t in body.topics)
        case 9:
            return (t.name for t in body.topics or ())
        case 28:
            return (t.name for t in body.topics)
        case 24:
            return (t.name for t in body.v3_and_below_topics)
        case 20:  # v6: topics by name or id; those by id are checked once named (broker/kafka/topics.py)
            if getattr(body, "topic_names", None) is not None:
                return (str(n) for n in body.topic_names)
            return (str(t.name) for t in getattr(body, "topics", ()) if t.name is not None)
    return ()


def _refuse(request: KafkaRequest, body: Any, code: ErrorCode, what: str) -> Outcome:
    if request.api_key == PRODUCE and int(body.acks) == 0:
        return Silent()
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    resp = error_response(request.api_key, schema, body, code, f"not authorized: {what}")
    return Reply(encode_response(request.correlation_id, resp))


# Kafka's AclOperation codes of the operations a resource type has, as Metadata and
# DescribeCluster report them (authorized operations: bit `code` set for each one allowed); those
# the ACLs here do not know (cluster action, idempotent write, tokens, ...) are never reported
KAFKA_OPERATION_CODES: Final = {
    "topic": {
        "read": 3,
        "write": 4,
        "create": 5,
        "delete": 6,
        "alter": 7,
        "describe": 8,
        "describe_configs": 10,
        "alter_configs": 11,
    },
    "cluster": {"create": 5, "alter": 7, "describe": 8, "describe_configs": 10, "alter_configs": 11},
}


def authorized_operations(
    authorizer: Authorizer, principal: str | None, resource_type: str, name: str
) -> int:
    """Kafka's bit field of the operations `principal` may do on the resource (every one the
    ACLs know where they are off); 0 without describe on it, as Kafka answers."""
    known = [(op, code) for op, code in KAFKA_OPERATION_CODES[resource_type].items() if op in OPERATIONS]
    if not authorizer.enabled:
        return sum(1 << code for _, code in known)
    if not authorizer.allowed(principal, "describe", resource_type, name):
        return 0
    return sum(1 << code for op, code in known if authorizer.allowed(principal, op, resource_type, name))


def may_describe_group(authorizer: Authorizer, principal: str | None, group: str) -> bool:
    """Whether ListGroups shows `group` to `principal`: describe on the cluster shows every group,
    describe on a group that one (Kafka's rule)."""
    return not authorizer.enabled or any(
        authorizer.allowed(principal, "describe", rtype, name)
        for rtype, name in (("cluster", CLUSTER_NAME), ("group", group))
    )


def check(authorizer: Authorizer, principal: str | None, request: KafkaRequest, body: Any) -> Outcome | None:
    """None when `principal` may make this request; else the answer that refuses it."""
    key = request.api_key
    allowed = authorizer.allowed
    txn_op = _TXN_OPS.get(key)
    if txn_op is not None or (key == 10 and int(getattr(body, "key_type", 0)) == 1):
        for txn_id in _txn_ids(key, body):
            op = txn_op or "describe"
            if not allowed(principal, op, "transactional_id", txn_id):
                code = ErrorCode.transactional_id_authorization_failed
                return _refuse(request, body, code, f"{op} transactional id {txn_id}")
        if key == 24:
            for name in _topic_names(key, body):
                if not allowed(principal, "write", "topic", name):
                    return _refuse(request, body, ErrorCode.topic_authorization_failed, f"write topic {name}")
    group_op = _GROUP_OPS.get(key)
    if group_op is not None:
        group = str(body.key if key == 10 else body.group_id)
        if key == 10 and int(getattr(body, "key_type", 0)) != 0:
            group = ""  # a transaction coordinator: its transactional id was checked above
        if group and not allowed(principal, group_op, "group", group):
            return _refuse(request, body, ErrorCode.group_authorization_failed, f"{group_op} group {group}")
    if key in (OFFSET_COMMIT, OFFSET_FETCH, 28):
        offsets_op = "read" if key in (OFFSET_COMMIT, 28) else "describe"
        for name in _topic_names(key, body):
            if not allowed(principal, offsets_op, "topic", name):
                return _refuse(
                    request, body, ErrorCode.topic_authorization_failed, f"{offsets_op} topic {name}"
                )
        return None
    if key == DESCRIBE_GROUPS:
        for group in body.groups:
            if not allowed(principal, "describe", "group", str(group)):
                return _refuse(request, body, ErrorCode.group_authorization_failed, f"describe group {group}")
        return None
    if key in ACL_ADMIN or key in CLUSTER_OPS:  # DescribeAcls: describe on the cluster; CreateAcls,
        # DeleteAcls: alter; and the replica admin apis (CLUSTER_OPS)
        op = CLUSTER_OPS.get(key) or ("describe" if key == DESCRIBE_ACLS else "alter")
        if not allowed(principal, op, "cluster", CLUSTER_NAME):
            return _refuse(request, body, ErrorCode.cluster_authorization_failed, f"{op} cluster")
        return None
    if key == LIST_GROUPS:
        return None  # filtered instead: `may_describe_group`
    topic_op = _TOPIC_OPS.get(key)
    if topic_op is not None and key not in PER_TOPIC:
        if key == CREATE_TOPICS and allowed(principal, "create", "cluster", CLUSTER_NAME):
            return None  # create on the cluster creates any topic, as in Kafka
        for name in _topic_names(key, body):
            if not allowed(principal, topic_op, "topic", name):
                return _refuse(
                    request, body, ErrorCode.topic_authorization_failed, f"{topic_op} topic {name}"
                )
    return None
