"""Kafka's consumer-group APIs over the core's protocol-neutral coordinator.

Rules this module keeps:
- FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
  DescribeGroups and ListGroups, encoded here; what they mean is broker/core/coordinator.py
  (membership) and broker/core/groups.py (the offsets, shared with our own protocol).
- A group is coordinated by one core of one node, `Core.group_coordinator` (alone: the core
  `coordinator_for(group, cores)`; in a cluster, of the node `coordinator_node` picks among the
  live ones). FindCoordinator names that core as Metadata names a partition's leader: its Kafka
  broker id (node * 1000 + core), the node's host, the core's direct port. A group request on any
  other core is answered NOT_COORDINATOR (the client finds
  the coordinator again), never forwarded. A transactional id's coordinator (key type 1) is the
  core owning its `__transaction_state` partition (broker/core/transactions.py), named the same
  way; the topic is made on the first such request.
- JoinGroup and SyncGroup wait for the rest of the group: they are `Later` outcomes, answered by
  the coordinator's callback in the connection's request order like any other reply.
- Static membership: the group instance id of JoinGroup v5, SyncGroup and Heartbeat v3,
  LeaveGroup v3 and OffsetCommit v7 is handed to the coordinator, which keeps Kafka's rules
  (broker/core/coordinator.py); FENCED_INSTANCE_ID is its answer to an old incarnation.
- Offsets are kept under topic ids: a topic named in an OffsetCommit that does not exist (or a
  partition beyond its count) is UNKNOWN_TOPIC_OR_PARTITION; OffsetFetch answers -1 for what
  was never committed, and a null topic list (v2+) is every offset of the group whose topic
  still exists.
- ListGroups lists the groups of the core asked (each core is a broker, as admin clients expect:
  they ask every broker); DescribeGroups answers for the groups this core coordinates. A group
  whose members all left stays listed and is described Empty while it has committed offsets, as
  Kafka's does (broker/core/coordinator.py `offsets_exist`).
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.coordinator import GroupCode, JoinResult, SyncResult
from broker.core.core import Core
from broker.core.groups import NOTHING_COMMITTED, OFFSET_METADATA_MAX, Committed, PartitionId, check_group
from broker.core.outcomes import Later, Outcome, Reply, Silent
from broker.core.views import kafka_broker_id
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.errors import kafka_error

log = logging.getLogger(__name__)

OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
TXN_OFFSET_COMMIT: Final = 28
# api key -> (lowest, highest) version answered; every higher version is flexible
GROUP_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    OFFSET_COMMIT: (2, 7),  # v0-1 (ZooKeeper-era commits, per-partition timestamps): not answered
    OFFSET_FETCH: (1, 7),  # v0: ZooKeeper-stored offsets; v6+ flexible, v7 require_stable
    FIND_COORDINATOR: (0, 2),
    JOIN_GROUP: (0, 5),
    HEARTBEAT: (0, 3),
    LEAVE_GROUP: (0, 3),
    SYNC_GROUP: (0, 3),
    DESCRIBE_GROUPS: (0, 4),
    LIST_GROUPS: (0, 2),
    TXN_OFFSET_COMMIT: (0, 4),  # v3+ flexible, with KIP-447's member fields; v5 is TV2's
}
# Handlers built but not yet advertised (api key -> the versions they answer): the adapter has
# them in its table, but only SUPPORTED_VERSIONS reaches a handler. None at present.
NOT_ADVERTISED: Final[dict[int, tuple[int, int]]] = {}
KEY_TYPE_GROUP: Final = 0
KEY_TYPE_TRANSACTION: Final = 1
AUTHORIZED_OPERATIONS_OMITTED: Final = -(2**31)  # Kafka's "not asked for"
NO_THROTTLE: Final = datetime.timedelta(0)


def _code(code: GroupCode) -> ErrorCode:
    return ErrorCode[code.value]


class KafkaGroups:
    """The group APIs of one core's Kafka adapter."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.coordinator = core.coordinator
        self.client_id = ""  # of the request being handled (set by the adapter)
        # whether ListGroups shows a group to the request's principal (set by the adapter: ACLs)
        self.may_describe: Callable[[str], bool] = lambda _group: True

    def apis(self) -> dict[int, Callable[[KafkaRequest, Any], Outcome]]:
        return {
            FIND_COORDINATOR: self._find_coordinator,
            JOIN_GROUP: self._join_group,
            SYNC_GROUP: self._sync_group,
            HEARTBEAT: self._heartbeat,
            LEAVE_GROUP: self._leave_group,
            OFFSET_COMMIT: self._offset_commit,
            OFFSET_FETCH: self._offset_fetch,
            TXN_OFFSET_COMMIT: self._txn_offset_commit,
            DESCRIBE_GROUPS: self._describe_groups,
            LIST_GROUPS: self._list_groups,
        }

    def _mine(self, group: str) -> bool:
        config = self.core.config
        return self.core.group_coordinator(group) == (config.node_id, config.core_id)

    def _answers_offsets(self, group: str) -> bool:
        """Whether this core answers the group's OffsetFetch (`_offset_fetch`)."""
        return self.coordinator.offsets.remote or self._mine(group)

    @staticmethod
    def _reply(request: KafkaRequest, resp: Any) -> Reply:
        return Reply(encode_response(request.correlation_id, resp))

    @staticmethod
    def _schema(request: KafkaRequest) -> tuple[type[Any], Any]:
        schema = response_schema(request.api_key, request.api_version)
        assert schema is not None
        return schema, sys.modules[schema.__module__]

    # ------------------------------------------------------------------------- FindCoordinator

    def _find_coordinator(self, request: KafkaRequest, body: Any) -> Outcome:
        schema, _ = self._schema(request)
        key_type = int(getattr(body, "key_type", KEY_TYPE_GROUP))
        if key_type not in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
            self.core.metrics.error()
            resp = make(
                schema,
                throttle_time=NO_THROTTLE,
                error_code=ErrorCode.invalid_request,
                error_message=f"key type {key_type} is not a group (0) or a transactional id (1)",
                node_id=-1,
                host="",
                port=-1,
            )
            return self._reply(request, resp)
        view = self.core.metadata_view([])
        if key_type == KEY_TYPE_TRANSACTION:
            txn_coordinator = self.core.transactions.coordinator_of(str(body.key))
            if txn_coordinator is None:
                self.core.metrics.error()
                resp = make(
                    schema,
                    throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.coordinator_not_available,
                    error_message="the transaction state partition has no leader now",
                    node_id=-1,
                    host="",
                    port=-1,
                )
                return self._reply(request, resp)
            node_id, core = txn_coordinator
        else:
            node_id, core = self.core.group_coordinator(body.key)
        node = view.node(node_id)
        if node is None:  # the view changed between the two reads: the client asks again
            self.core.metrics.error()
            resp = make(
                schema,
                throttle_time=NO_THROTTLE,
                error_code=ErrorCode.coordinator_not_available,
                error_message=f"node {node_id} coordinates {body.key!r} but is not in this node's view",
                node_id=-1,
                host="",
                port=-1,
            )
            return self._reply(request, resp)
        resp = make(
            schema,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            error_message=None,
            node_id=kafka_broker_id(node_id, core),
            host=node.host,
            port=node.core_port(core),
        )
        return self._reply(request, resp)

    # ------------------------------------------------------------------------- JoinGroup, SyncGroup

    def _join_group(self, request: KafkaRequest, body: Any) -> Outcome:
        schema, module = self._schema(request)

        def reply(r: JoinResult) -> Reply:
            if r.code != GroupCode.NONE:
                self.core.metrics.error()
            members = tuple(
                make(module.JoinGroupResponseMember, member_id=mid, group_instance_id=iid, metadata=meta)
                for mid, iid, meta in r.members
            )
            resp = make(
                schema,
                throttle_time=NO_THROTTLE,
                error_code=_code(r.code),
                generation_id=r.generation,
                protocol_name=r.protocol_name or "",
                leader=r.leader,
                member_id=r.member_id,
                members=members,
            )
            return self._reply(request, resp)

        group = str(body.group_id)
        if not self._mine(group):
            return reply(JoinResult(GroupCode.NOT_COORDINATOR, body.member_id))
        if not group:
            self.core.metrics.error()
            return self._reply(request, make(schema, error_code=ErrorCode.invalid_group_id, **_EMPTY_JOIN))
        session_ms = int(body.session_timeout.total_seconds() * 1000)
        rebalance = getattr(body, "rebalance_timeout", None)
        rebalance_ms = session_ms if rebalance is None else int(rebalance.total_seconds() * 1000)
        protocols = [(p.name, bytes(p.metadata)) for p in body.protocols]
        client_id = self.client_id

        def start(answer: Callable[[Reply | Silent], None]) -> None:
            self.coordinator.join(
                group,
                body.member_id,
                body.protocol_type,
                protocols,
                session_ms,
                rebalance_ms,
                lambda r: answer(reply(r)),
                instance_id=getattr(body, "group_instance_id", None),
                client_id=client_id,
                require_known_member_id=request.api_version >= 4,
            )

        return Later(start)

    def _sync_group(self, request: KafkaRequest, body: Any) -> Outcome:
        schema, _ = self._schema(request)

        def reply(r: SyncResult) -> Reply:
            if r.code != GroupCode.NONE:
                self.core.metrics.error()
            resp = make(schema, throttle_time=NO_THROTTLE, error_code=_code(r.code), assignment=r.assignment)
            return self._reply(request, resp)

        group = str(body.group_id)
        if not self._mine(group):
            return reply(SyncResult(GroupCode.NOT_COORDINATOR))
        assignments = {a.member_id: bytes(a.assignment) for a in body.assignments}

        def start(answer: Callable[[Reply | Silent], None]) -> None:
            self.coordinator.sync(
                group,
                int(body.generation_id),
                body.member_id,
                assignments,
                lambda r: answer(reply(r)),
                instance_id=getattr(body, "group_instance_id", None),
            )

        return Later(start)

    # ------------------------------------------------------------------------- Heartbeat, LeaveGroup

    def _heartbeat(self, request: KafkaRequest, body: Any) -> Outcome:
        schema, _ = self._schema(request)
        group = str(body.group_id)
        if self._mine(group):
            code = self.coordinator.heartbeat(
                group, int(body.generation_id), body.member_id, getattr(body, "group_instance_id", None)
            )
        else:
            code = GroupCode.NOT_COORDINATOR
        if code != GroupCode.NONE:
            self.core.metrics.error()
        return self._reply(request, make(schema, throttle_time=NO_THROTTLE, error_code=_code(code)))

    def _leave_group(self, request: KafkaRequest, body: Any) -> Outcome:
        schema, module = self._schema(request)
        group = str(body.group_id)
        if request.api_version < 3:
            leaving = [(body.member_id, None)]
        else:
            leaving = [(m.member_id, m.group_instance_id) for m in body.members]
        if not self._mine(group):
            codes = [GroupCode.NOT_COORDINATOR] * len(leaving)
            top = GroupCode.NOT_COORDINATOR
        else:
            codes = self.coordinator.leave(group, leaving)
            top = codes[0] if request.api_version < 3 and codes else GroupCode.NONE
        if any(c != GroupCode.NONE for c in codes):
            self.core.metrics.error()
        members = (
            tuple(
                make(module.MemberResponse, member_id=mid, group_instance_id=iid, error_code=_code(c))
                for (mid, iid), c in zip(leaving, codes, strict=True)
            )
            if request.api_version >= 3
            else ()
        )
        resp = make(schema, throttle_time=NO_THROTTLE, error_code=_code(top), members=members)
        return self._reply(request, resp)

    # ------------------------------------------------------------------------- offsets

    def _topic_id(self, name: str, index: int) -> int | None:
        """The id of topic `name` when it has partition `index`, else None."""
        core = self.core
        topic = core.registry.by_name.get(name)
        if topic is None or not 0 <= index < topic.partitions:
            core.refresh_topics(force=True)
            topic = core.registry.by_name.get(name)
        if topic is None or not 0 <= index < topic.partitions:
            return None
        return topic.topic_id

    def _offset_commit(self, request: KafkaRequest, body: Any) -> Outcome:
        """Every known partition's offset in one durable write, if the group allows the commit
        (its generation and member, or generation -1 while it has no members). Any offset is
        stored as it came, negative or past the partition's high watermark: Kafka's coordinator
        (OffsetMetadataManager) checks only the metadata's length (OFFSET_METADATA_TOO_LARGE for
        that partition), never the log."""
        group = str(body.group_id)
        store = self.coordinator.offsets

        def check() -> GroupCode:
            return self.coordinator.commit_check(
                group,
                int(body.generation_id_or_member_epoch),
                body.member_id,
                getattr(body, "group_instance_id", None),
            )

        return self._commit(
            request,
            body,
            "OffsetCommitResponse",
            check,
            lambda offsets, live: store.commit(group, offsets, live),
        )

    def _txn_offset_commit(self, request: KafkaRequest, body: Any) -> Outcome:
        """A transaction's offsets, kept pending for its producer id in the group's store (durably
        before the answer) until its marker makes them committed or drops them
        (broker/core/groups.py), as Kafka's GroupCoordinator handleTxnCommitOffsets. v3+ name
        the member they were consumed as: checked as a commit is (KIP-447: a zombie of an old
        generation is ILLEGAL_GENERATION, an old static incarnation FENCED_INSTANCE_ID), but one
        naming no member (v0-2, or generation -1 and no ids) is stored whatever the group's
        members. An epoch older than the producer's pending one is INVALID_PRODUCER_EPOCH."""
        group = str(body.group_id)
        store = self.coordinator.offsets
        producer_id, producer_epoch = int(body.producer_id), int(body.producer_epoch)

        def check() -> GroupCode:
            return self.coordinator.commit_check(
                group,
                int(getattr(body, "generation_id", -1)),
                getattr(body, "member_id", ""),
                getattr(body, "group_instance_id", None),
                transactional=True,
            )

        return self._commit(
            request,
            body,
            "TxnOffsetCommitResponse",
            check,
            lambda offsets, live: store.commit_pending(group, producer_id, producer_epoch, offsets, live),
        )

    def _commit(
        self,
        request: KafkaRequest,
        body: Any,
        response_name: str,
        check: Callable[[], GroupCode],
        store: Callable[[dict[PartitionId, Committed], Callable[[int], bool]], None],
    ) -> Outcome:
        """OffsetCommit's and TxnOffsetCommit's common course: each partition checked (known
        topic, metadata length), the group's coordinator and id, then `check` (the group's rule)
        and `store` (one durable write, off the loop where the store is etcd)."""
        schema, module = self._schema(request)
        topic_schema = getattr(module, f"{response_name}Topic")
        partition_schema = getattr(module, f"{response_name}Partition")
        group = str(body.group_id)
        codes: dict[tuple[str, int], ErrorCode] = {}
        offsets: dict[tuple[int, int], Committed] = {}
        for t in body.topics:
            for p in t.partitions:
                key = (t.name, int(p.partition_index))
                topic_id = self._topic_id(*key)
                if topic_id is None:
                    codes[key] = ErrorCode.unknown_topic_or_partition
                    continue
                metadata = p.committed_metadata or ""
                if len(metadata) > OFFSET_METADATA_MAX:  # Kafka's one check of a committed offset
                    codes[key] = ErrorCode.offset_metadata_too_large
                    continue
                codes[key] = ErrorCode.none
                offsets[(topic_id, key[1])] = Committed(int(p.committed_offset), metadata)
        common: ErrorCode | None = None
        if not self._mine(group):
            common = ErrorCode.not_coordinator
        elif not group:
            common = ErrorCode.invalid_group_id
        else:
            try:
                check_group(group)
                if offsets:
                    self.core.space.check_writable()
            except Exception as exc:
                common = kafka_error(exc)[0]

        def respond(common: ErrorCode | None) -> Reply:
            if common is not None:
                for key, code in list(codes.items()):
                    if code == ErrorCode.none:
                        codes[key] = common
            if any(c != ErrorCode.none for c in codes.values()):
                self.core.metrics.error()
            topics = tuple(
                make(
                    topic_schema,
                    name=t.name,
                    partitions=tuple(
                        make(
                            partition_schema,
                            partition_index=p.partition_index,
                            error_code=codes[(t.name, int(p.partition_index))],
                        )
                        for p in t.partitions
                    ),
                )
                for t in body.topics
            )
            return self._reply(request, make(schema, throttle_time=NO_THROTTLE, topics=topics))

        if common is not None:
            return respond(common)

        def start(answer: Callable[[Reply | Silent], None]) -> None:
            # Kafka's coordinator stores any offset: it never compares one with the log's end
            # (docs/KAFKA.md, "Committed offsets")
            try:
                code = check()
            except Exception as exc:
                answer(respond(kafka_error(exc)[0]))
                return
            if code != GroupCode.NONE or not offsets:
                answer(respond(None if code == GroupCode.NONE else _code(code)))
                return
            live = frozenset(self.core.registry.by_id).__contains__

            def stored(result: object) -> None:
                # a store that cannot be written now: COORDINATOR_NOT_AVAILABLE (retriable)
                if isinstance(result, BaseException):
                    answer(respond(kafka_error(result)[0]))
                    return
                self.coordinator.offsets_exist(group)  # it stays, Empty, once its members leave
                answer(respond(None))

            self.core.offsets_run(lambda: store(offsets, live), stored)

        return Later(start)

    def _offset_fetch(self, request: KafkaRequest, body: Any) -> Outcome:
        """The group's offsets, read from its store (`Core.with_offsets`: off the loop where
        the store is etcd); a store that cannot be read now is COORDINATOR_NOT_AVAILABLE, which
        the client retries (Kafka's answer while its offsets topic is unavailable).

        In a cluster every core answers, not only the group's coordinator: the offsets are read
        from etcd (linearizable, nothing cached), so the answer is the same anywhere, and the
        coordinator moves with the live set while the nodes' views of it differ (librdkafka,
        answered NOT_COORDINATOR a few times in a row, stops fetching the partitions it was
        assigned until the next rebalance)."""
        group = str(body.group_id)
        if not (self._answers_offsets(group) and group):
            return self._offset_fetch_reply(request, body, None)
        store = self.coordinator.offsets
        require_stable = bool(getattr(body, "require_stable", False))

        def read() -> tuple[dict[PartitionId, Committed], set[PartitionId]]:
            doc = store.load_doc(group)  # one read (one etcd call) for both
            unstable = {k for txn in doc.pending.values() for k in txn.offsets} if require_stable else set()
            return dict(doc.offsets), unstable

        return self.core.with_offsets(read, lambda found: self._offset_fetch_reply(request, body, found))

    def _offset_fetch_reply(
        self,
        request: KafkaRequest,
        body: Any,
        found: tuple[Mapping[PartitionId, Committed], set[PartitionId]] | BaseException | None,
    ) -> Reply:
        """`found`: the group's offsets and the partitions whose offsets are unstable (pending in
        a transaction, asked with v7's require_stable), the store's failure, or None (not this
        group's coordinator, or no group id). An unstable partition is answered offset -1 and
        UNSTABLE_OFFSET_COMMIT (retriable: the client asks again once the transaction's marker
        came), as Kafka's GroupMetadataManager getOffsets."""
        schema, module = self._schema(request)
        group = str(body.group_id)
        mine = self._answers_offsets(group)
        wanted: list[tuple[str, list[int]]]
        committed: dict[tuple[str, int], Committed] = {}
        failed = kafka_error(found)[0] if isinstance(found, BaseException) else None
        unstable: set[tuple[str, int]] = set()
        if mine and group and found is not None and not isinstance(found, BaseException):
            offsets, pending = found
            if offsets and self._mine(group):
                self.coordinator.offsets_exist(group)
            if body.topics is None:  # v2+: every offset of the group whose topic still exists
                by_id = self.core.registry.by_id
                if any(tid not in by_id for tid, _ in offsets):
                    self.core.refresh_topics(force=True)
                grouped: dict[str, list[int]] = {}
                for (tid, index), c in sorted(offsets.items()):
                    topic = by_id.get(tid)
                    if topic is not None and index < topic.partitions:
                        grouped.setdefault(topic.name, []).append(index)
                        committed[(topic.name, index)] = c
                wanted = list(grouped.items())
            else:
                wanted = [(t.name, [int(i) for i in t.partition_indexes]) for t in body.topics]
                for name, indexes in wanted:
                    for index in indexes:
                        topic_id = self._topic_id(name, index)
                        if topic_id is not None:
                            committed[(name, index)] = offsets.get((topic_id, index), NOTHING_COMMITTED)
            by_id = self.core.registry.by_id  # after the lookups above refreshed it
            unstable = {(by_id[tid].name, index) for tid, index in pending if tid in by_id}
        else:
            wanted = [(t.name, [int(i) for i in t.partition_indexes]) for t in body.topics or ()]
        top = (failed or ErrorCode.none) if mine else ErrorCode.not_coordinator
        # v1 has no top-level error: each partition carries it
        part_error = top if request.api_version < 2 else ErrorCode.none
        if top != ErrorCode.none:
            self.core.metrics.error()
        topics = tuple(
            make(
                module.OffsetFetchResponseTopic,
                name=name,
                partitions=tuple(
                    make(
                        module.OffsetFetchResponsePartition,
                        partition_index=i,
                        committed_offset=-1
                        if (name, i) in unstable
                        else committed.get((name, i), Committed(-1, "")).offset,
                        committed_leader_epoch=-1,
                        metadata=""
                        if (name, i) in unstable
                        else committed.get((name, i), Committed(-1, "")).metadata,
                        error_code=ErrorCode.unstable_offset_commit if (name, i) in unstable else part_error,
                    )
                    for i in indexes
                ),
            )
            for name, indexes in wanted
        )
        return self._reply(request, make(schema, throttle_time=NO_THROTTLE, topics=topics, error_code=top))

    # ------------------------------------------------------------------------- DescribeGroups, ListGroups

    def _describe_groups(self, request: KafkaRequest, body: Any) -> Outcome:
        """The groups of this core: a group it holds no members of is Empty when it has committed
        offsets (read from the store, `Core.with_offsets`), else Dead, as Kafka describes a group
        it does not know; a store that cannot be read now makes such a group
        COORDINATOR_NOT_AVAILABLE (retriable)."""
        unknown = [g for g in body.groups if g and self._mine(g) and self.coordinator.view(g) is None]
        if not unknown:
            return self._describe_reply(request, body, set())
        store = self.coordinator.offsets

        def read() -> list[str]:
            return [g for g in unknown if store.has_offsets(g)]

        def reply(found: list[str] | BaseException) -> Reply:
            if isinstance(found, BaseException):
                return self._describe_reply(request, body, set(unknown))
            for group in found:
                self.coordinator.offsets_exist(group)
            return self._describe_reply(request, body, set())

        return self.core.with_offsets(read, reply)

    def _describe_reply(self, request: KafkaRequest, body: Any, unavailable: set[str]) -> Reply:
        schema, module = self._schema(request)
        described = []
        for group in body.groups:
            view = self.coordinator.view(group) if self._mine(group) else None
            code = ErrorCode.none if self._mine(group) else ErrorCode.not_coordinator
            if group in unavailable:
                code = ErrorCode.coordinator_not_available
            members = ()
            if view is not None:
                members = tuple(
                    make(
                        module.DescribedGroupMember,
                        member_id=m.member_id,
                        group_instance_id=m.instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in view.members
                )
            described.append(
                make(
                    module.DescribedGroup,
                    error_code=code,
                    group_id=group,
                    group_state=view.state if view is not None else "Dead",
                    protocol_type=view.protocol_type if view is not None else "",
                    protocol_data=view.protocol if view is not None else "",
                    members=members,
                    authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
                )
            )
        return self._reply(request, make(schema, throttle_time=NO_THROTTLE, groups=tuple(described)))

    def _list_groups(self, request: KafkaRequest, body: Any) -> Outcome:
        schema, module = self._schema(request)
        groups = tuple(
            make(module.ListedGroup, group_id=g.group_id, protocol_type=g.protocol_type or "")
            for g in self.coordinator.groups.values()
            if self.may_describe(g.group_id)
        )
        resp = make(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=groups)
        return self._reply(request, resp)


_EMPTY_JOIN: Final[dict[str, Any]] = {
    "throttle_time": NO_THROTTLE,
    "generation_id": -1,
    "protocol_name": "",
    "leader": "",
    "member_id": "",
    "members": (),
}
