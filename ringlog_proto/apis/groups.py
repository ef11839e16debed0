"""Requests and responses of consumer groups: committed offsets (OffsetCommit, OffsetFetch) and
membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ringlog_proto.apis.body import (
    REQUEST_ARRAY_MAX,
    PartitionRequest,
    Reader,
    Request,
    Response,
    Writer,
)
from ringlog_proto.apis.codes import ApiKey
from ringlog_proto.frames import Frame


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest(PartitionRequest):
    # group str, offset i64, metadata str, generation i32, member_id str
    # (generation -1 and member "": a commit outside group membership, refused while the group
    # has members; a member commits with the generation it joined)
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    group: str = ""
    offset: int = 0
    metadata: str = ""
    generation: int = -1
    member_id: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.group).pack("q", self.offset).str(self.metadata).pack("i", self.generation)
        w.str(self.member_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> OffsetCommitRequest:
        group, offset, metadata = r.str(), r.int("q"), r.str()
        return cls(frame.topic_id, frame.partition, group, offset, metadata, r.int("i"), r.str())


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest(PartitionRequest):
    # group str
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    group: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.group)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> OffsetFetchRequest:
        return cls(frame.topic_id, frame.partition, r.str())


@dataclass(frozen=True, slots=True)
class GroupProtocol:
    """One assignor a member can use (Kafka's "range", "roundrobin"...) and what it says about
    the member under it (Kafka's consumer protocol: its subscription)."""

    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupRequest(Request):
    # group str, member_id str ("" on a first join), session_timeout_ms i32, rebalance_timeout_ms i32,
    # protocol_type str, protocols array<name str, metadata bytes>
    API_KEY: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    group: str = ""
    member_id: str = ""
    session_timeout_ms: int = 45_000
    rebalance_timeout_ms: int = 300_000
    protocol_type: str = "consumer"
    protocols: tuple[GroupProtocol, ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.group).str(self.member_id).pack("ii", self.session_timeout_ms, self.rebalance_timeout_ms)
        w.str(self.protocol_type).array(len(self.protocols))
        for p in self.protocols:
            w.str(p.name).bytes(p.metadata)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> JoinGroupRequest:
        group, member = r.str(), r.str()
        session, rebalance = r.unpack("ii")
        kind = r.str()
        protocols = tuple(GroupProtocol(r.str(), r.bytes()) for _ in range(r.array(6, REQUEST_ARRAY_MAX)))
        return cls(group, member, session, rebalance, kind, protocols)


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class SyncGroupRequest(Request):
    # group str, generation i32, member_id str, assignments array<member_id str, assignment bytes>
    # (only the leader sends assignments; the others send none)
    API_KEY: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    group: str = ""
    generation: int = -1
    member_id: str = ""
    assignments: tuple[GroupAssignment, ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.group).pack("i", self.generation).str(self.member_id).array(len(self.assignments))
        for a in self.assignments:
            w.str(a.member_id).bytes(a.assignment)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> SyncGroupRequest:
        group, generation, member = r.str(), r.int("i"), r.str()
        assignments = tuple(GroupAssignment(r.str(), r.bytes()) for _ in range(r.array(6, REQUEST_ARRAY_MAX)))
        return cls(group, generation, member, assignments)


@dataclass(frozen=True, slots=True)
class HeartbeatRequest(Request):
    # group str, generation i32, member_id str
    API_KEY: ClassVar[ApiKey] = ApiKey.HEARTBEAT
    group: str = ""
    generation: int = -1
    member_id: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.group).pack("i", self.generation).str(self.member_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> HeartbeatRequest:
        return cls(r.str(), r.int("i"), r.str())


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest(Request):
    # group str, member_id str
    API_KEY: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    group: str = ""
    member_id: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.group).str(self.member_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> LeaveGroupRequest:
        return cls(r.str(), r.str())


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Response):
    # offset i64 (-1 when the group has committed nothing), metadata str
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    offset: int = -1
    metadata: str = ""

    def write(self, w: Writer) -> None:
        w.pack("q", self.offset).str(self.metadata)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"offset": r.int("q"), "metadata": r.str()}


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Response):
    # generation i32, protocol str (the assignor chosen), leader str, member_id str (yours),
    # members array<member_id str, metadata bytes> (every member's, to the leader only; else empty)
    API_KEY: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    member_id: str = ""
    members: tuple[GroupMember, ...] = ()

    def write(self, w: Writer) -> None:
        w.pack("i", self.generation).str(self.protocol).str(self.leader).str(self.member_id)
        w.array(len(self.members))
        for m in self.members:
            w.str(m.member_id).bytes(m.metadata)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        generation, protocol, leader, member = r.int("i"), r.str(), r.str(), r.str()
        members = tuple(GroupMember(r.str(), r.bytes()) for _ in range(r.array(6)))
        return {
            "generation": generation,
            "protocol": protocol,
            "leader": leader,
            "member_id": member,
            "members": members,
        }


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Response):
    # assignment bytes (this member's, as the leader wrote it)
    API_KEY: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    assignment: bytes = b""

    def write(self, w: Writer) -> None:
        w.bytes(self.assignment)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"assignment": r.bytes()}


@dataclass(frozen=True, slots=True)
class HeartbeatResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.HEARTBEAT


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
