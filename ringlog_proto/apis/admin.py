"""Requests and responses of the cluster's administration: ApiVersions, Metadata (and the topic,
partition and node descriptions it carries), CreateTopic, DeleteTopic, DescribeConfigs,
AlterConfigs and Stats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ringlog_proto.apis.body import (
    REQUEST_ARRAY_MAX,
    MalformedBody,
    Reader,
    Request,
    Response,
    Writer,
    _error,
)
from ringlog_proto.apis.codes import ApiKey, ConfigOp, ConfigSource, ErrorCode
from ringlog_proto.frames import Frame


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest(Request):
    # client_name str
    API_KEY: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    client_name: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.client_name)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> ApiVersionsRequest:
        return cls(r.str())


@dataclass(frozen=True, slots=True)
class MetadataRequest(Request):
    # topics array<str>: empty means all topics; (v4) allow_auto_create u8: 1 = a named topic
    # that does not exist is created, where the broker auto-creates topics (a producer's lookup)
    API_KEY: ClassVar[ApiKey] = ApiKey.METADATA
    topics: tuple[str, ...] = ()
    allow_auto_create: bool = False  # (v4)

    def write(self, w: Writer) -> None:
        w.array(len(self.topics))
        for t in self.topics:
            w.str(t)
        w.pack("B", int(self.allow_auto_create))

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> MetadataRequest:
        topics = tuple(r.str() for _ in range(r.array(2, REQUEST_ARRAY_MAX)))
        allow = bool(r.int("B")) if frame.api_version >= 4 else False  # a v3 frame: never creates
        return cls(topics, allow)


@dataclass(frozen=True, slots=True)
class CreateTopicRequest(Request):
    # name str, partitions u32, retention_ms i64, retention_bytes i64, segment_bytes i64,
    # replication i16 (-1 = the broker's default; retention -2 = keep forever),
    # (v3) configs array<name str, value str> (the topic's config overrides, Kafka's names),
    # (v4) assignment array<array<node id u32>> (each partition's replicas placed by hand,
    # the preferred leader first; empty: placed by the broker)
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    name: str = ""
    partitions: int = 1
    retention_ms: int = -1
    retention_bytes: int = -1
    segment_bytes: int = -1
    replication: int = -1  # (v2) replicas per partition; -1 = the broker's default (one node: 1)
    configs: tuple[tuple[str, str], ...] = ()  # (v3)
    assignment: tuple[tuple[int, ...], ...] = ()  # (v4)

    def write(self, w: Writer) -> None:
        w.str(self.name).pack(
            "Iqqqh",
            self.partitions,
            self.retention_ms,
            self.retention_bytes,
            self.segment_bytes,
            self.replication,
        )
        _write_pairs(w, self.configs)
        w.array(len(self.assignment))
        for replicas in self.assignment:
            w.array(len(replicas))
            for node in replicas:
                w.pack("I", node)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> CreateTopicRequest:
        name = r.str()
        partitions, retention_ms, retention_bytes, segment_bytes, replication = r.unpack("Iqqqh")
        configs = _read_pairs(r) if frame.api_version >= 3 else ()  # a v2 frame has none
        assignment: tuple[tuple[int, ...], ...] = ()
        if frame.api_version >= 4:  # a v3 frame has none
            assignment = tuple(
                tuple(r.int("I") for _ in range(r.array(4, REQUEST_ARRAY_MAX)))
                for _ in range(r.array(4, REQUEST_ARRAY_MAX))
            )
        return cls(
            name, partitions, retention_ms, retention_bytes, segment_bytes, replication, configs, assignment
        )


def _write_pairs(w: Writer, pairs: tuple[tuple[str, str], ...]) -> None:
    w.array(len(pairs))
    for name, value in pairs:
        w.str(name).str(value)


def _read_pairs(r: Reader) -> tuple[tuple[str, str], ...]:
    return tuple((r.str(), r.str()) for _ in range(r.array(4, REQUEST_ARRAY_MAX)))


@dataclass(frozen=True, slots=True)
class DescribeConfigsRequest(Request):
    # topic str, keys array<str> (empty: every config)
    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_CONFIGS
    topic: str = ""
    keys: tuple[str, ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.topic).array(len(self.keys))
        for key in self.keys:
            w.str(key)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> DescribeConfigsRequest:
        return cls(r.str(), tuple(r.str() for _ in range(r.array(2, REQUEST_ARRAY_MAX))))


@dataclass(frozen=True, slots=True)
class ConfigChange:
    name: str
    op: ConfigOp = ConfigOp.SET
    value: str = ""


@dataclass(frozen=True, slots=True)
class AlterConfigsRequest(Request):
    # topic str, incremental u8 (0: the topic's overrides become `changes`' values, each a SET;
    # 1: each change applied to them), validate_only u8 (1: checked, nothing changed),
    # changes array<name str, op u8 (ConfigOp), value str>
    API_KEY: ClassVar[ApiKey] = ApiKey.ALTER_CONFIGS
    topic: str = ""
    incremental: bool = True
    validate_only: bool = False
    changes: tuple[ConfigChange, ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.topic).pack("BB", int(self.incremental), int(self.validate_only)).array(len(self.changes))
        for c in self.changes:
            w.str(c.name).pack("B", c.op).str(c.value)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> AlterConfigsRequest:
        topic = r.str()
        incremental, validate_only = r.unpack("BB")
        changes = []
        for _ in range(r.array(5, REQUEST_ARRAY_MAX)):
            name, op = r.str(), r.int("B")
            try:
                kind = ConfigOp(op)
            except ValueError:
                raise MalformedBody(f"unknown config operation {op}") from None
            changes.append(ConfigChange(name, kind, r.str()))
        return cls(topic, bool(incremental), bool(validate_only), tuple(changes))


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest(Request):
    # name str
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC
    name: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.name)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> DeleteTopicRequest:
        return cls(r.str())


@dataclass(frozen=True, slots=True)
class StatsRequest(Request):
    # (empty body)
    API_KEY: ClassVar[ApiKey] = ApiKey.STATS

    def write(self, w: Writer) -> None:
        pass

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> StatsRequest:
        return cls()


@dataclass(frozen=True, slots=True)
class ApiVersion:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse(Response):
    # broker_version str, node_id i32, cores u16, apis array<api_key u16, min u16, max u16>
    API_KEY: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    broker_version: str = ""
    node_id: int = 0
    cores: int = 1
    apis: tuple[ApiVersion, ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.broker_version).pack("iH", self.node_id, self.cores).array(len(self.apis))
        for a in self.apis:
            w.pack("HHH", a.api_key, a.min_version, a.max_version)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        version = r.str()
        node_id, cores = r.unpack("iH")
        apis = tuple(ApiVersion(*r.unpack("HHH")) for _ in range(r.array(6)))
        return {"broker_version": version, "node_id": node_id, "cores": cores, "apis": apis}


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    # index u32, owner_core i16, start_offset i64, end_offset i64, leader_node i32, leader_epoch i32,
    # replicas array<node i32, core i16>, isr array<node i32, core i16>
    index: int
    owner_core: int  # the core serving it on its leader node; -1: no leader (offline)
    start_offset: int
    end_offset: int
    leader_node: int = 0  # -1: offline
    leader_epoch: int = 0
    replicas: tuple[tuple[int, int], ...] = ()  # (node id, core), the preferred leader first
    isr: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeMetadata:
    # node_id i32, host str, port u16, cores u16, core_ports array<u16>, rack str, live u8
    node_id: int
    host: str
    port: int
    cores: int
    core_ports: tuple[int, ...] = ()
    rack: str = ""
    live: bool = True

    def core_port(self, core: int) -> int:
        """Where `core` of this node is reached: its direct port, else the node's public port."""
        if core < len(self.core_ports) and self.core_ports[core]:
            return self.core_ports[core]
        return self.port


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    # error i16, name str, topic_id u32, retention_ms i64, retention_bytes i64, segment_bytes i64,
    # partitions array<PartitionMetadata>
    error: ErrorCode
    name: str
    topic_id: int
    retention_ms: int = -1
    retention_bytes: int = -1
    segment_bytes: int = -1
    partitions: tuple[PartitionMetadata, ...] = ()


PARTITION_OFFSETS_AT = 6  # a partition's start and end offsets (">qq") after its index and core


def _node_core(r: Reader) -> tuple[int, int]:
    """A replica or ISR entry: (node id, core)."""
    node, core = r.unpack("ih")
    return node, core


@dataclass(frozen=True, slots=True)
class MetadataResponse(Response):
    # (version 2) host str, port u16, cores u16, steering u8 (1 = eBPF steers connections to
    # owning cores), core_ports array<u16> (core k's direct port, 0 = not reachable directly),
    # topics array<TopicMetadata>, (version 3) node_id i32 (the node answering), clustered u8,
    # nodes array<NodeMetadata> (every node the cluster knows, live or not; one node: itself)
    API_KEY: ClassVar[ApiKey] = ApiKey.METADATA
    host: str = ""
    port: int = 0
    cores: int = 1
    steering: bool = False
    topics: tuple[TopicMetadata, ...] = ()
    core_ports: tuple[int, ...] = ()
    node_id: int = 0
    clustered: bool = False
    nodes: tuple[NodeMetadata, ...] = ()

    def node(self, node_id: int) -> NodeMetadata | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        return None

    def write(self, w: Writer) -> None:
        self.write_head(w)
        w.array(len(self.topics))
        for t in self.topics:
            self.write_topic(w, t)
        self.write_nodes(w)

    def write_head(self, w: Writer) -> None:
        """The fields before the topics (`write` is head, topics, nodes: a broker may write the
        topics its own way between them)."""
        w.str(self.host).pack("HHB", self.port, self.cores, int(self.steering)).array(len(self.core_ports))
        for port in self.core_ports:
            w.pack("H", port)

    @staticmethod
    def write_topic(w: Writer, t: TopicMetadata) -> None:
        w.pack("h", t.error).str(t.name).pack(
            "Iqqq", t.topic_id, t.retention_ms, t.retention_bytes, t.segment_bytes
        )
        w.array(len(t.partitions))
        for p in t.partitions:
            MetadataResponse.write_partition(w, p)

    @staticmethod
    def write_partition(w: Writer, p: PartitionMetadata) -> None:
        """One partition: its offsets at bytes 6-21 (`PARTITION_OFFSETS_AT`)."""
        w.pack("Ihqqii", p.index, p.owner_core, p.start_offset, p.end_offset, p.leader_node, p.leader_epoch)
        for replicas in (p.replicas, p.isr):
            w.array(len(replicas))
            for node, core in replicas:
                w.pack("ih", node, core)

    def write_nodes(self, w: Writer) -> None:
        """The fields after the topics."""
        w.pack("iB", self.node_id, int(self.clustered)).array(len(self.nodes))
        for n in self.nodes:
            w.pack("i", n.node_id).str(n.host).pack("HH", n.port, n.cores).array(len(n.core_ports))
            for port in n.core_ports:
                w.pack("H", port)
            w.str(n.rack).pack("B", int(n.live))

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        host = r.str()
        port, cores, steering = r.unpack("HHB")
        core_ports = tuple(r.int("H") for _ in range(r.array(2)))
        topics = []
        for _ in range(r.array(32)):
            error = _error(r.int("h"))
            name = r.str()
            topic_id, ret_ms, ret_bytes, seg_bytes = r.unpack("Iqqq")
            parts = []
            for _ in range(r.array(38)):
                index, owner_core, start, end, leader, epoch = r.unpack("Ihqqii")
                replicas = tuple(_node_core(r) for _ in range(r.array(6)))
                isr = tuple(_node_core(r) for _ in range(r.array(6)))
                parts.append(PartitionMetadata(index, owner_core, start, end, leader, epoch, replicas, isr))
            topics.append(TopicMetadata(error, name, topic_id, ret_ms, ret_bytes, seg_bytes, tuple(parts)))
        node_id, clustered = r.unpack("iB")
        nodes = []
        for _ in range(r.array(14)):
            nid = r.int("i")
            nhost = r.str()
            nport, ncores = r.unpack("HH")
            nports = tuple(r.int("H") for _ in range(r.array(2)))
            nodes.append(NodeMetadata(nid, nhost, nport, ncores, nports, r.str(), bool(r.int("B"))))
        return {
            "host": host,
            "port": port,
            "cores": cores,
            "steering": bool(steering),
            "topics": tuple(topics),
            "core_ports": core_ports,
            "node_id": node_id,
            "clustered": bool(clustered),
            "nodes": tuple(nodes),
        }


@dataclass(frozen=True, slots=True)
class CreateTopicResponse(Response):
    # topic_id u32
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    topic_id: int = 0

    def write(self, w: Writer) -> None:
        w.pack("I", self.topic_id)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"topic_id": r.int("I")}


@dataclass(frozen=True, slots=True)
class DeleteTopicResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC


@dataclass(frozen=True, slots=True)
class ConfigDescription:
    name: str
    value: str
    source: ConfigSource
    doc: str = ""


@dataclass(frozen=True, slots=True)
class DescribeConfigsResponse(Response):
    # configs array<name str, value str, source u8 (ConfigSource), doc str>: every config of the
    # topic (or those asked), with its effective value
    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_CONFIGS
    configs: tuple[ConfigDescription, ...] = ()

    def write(self, w: Writer) -> None:
        w.array(len(self.configs))
        for c in self.configs:
            w.str(c.name).str(c.value).pack("B", c.source).str(c.doc)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        configs = []
        for _ in range(r.array(7)):
            name, value, source = r.str(), r.str(), r.int("B")
            try:
                where = ConfigSource(source)
            except ValueError:
                raise MalformedBody(f"unknown config source {source}") from None
            configs.append(ConfigDescription(name, value, where, r.str()))
        return {"configs": tuple(configs)}


@dataclass(frozen=True, slots=True)
class AlterConfigsResponse(Response):
    # (empty body: the error says what was refused)
    API_KEY: ClassVar[ApiKey] = ApiKey.ALTER_CONFIGS


@dataclass(frozen=True, slots=True)
class StatsResponse(Response):
    # core u16 (the core that answered), stats bytes: UTF-8 JSON, one snapshot per core and the
    # supervisor's eBPF snapshot ("bpf"; new keys in the JSON keep the binary format unchanged)
    # (broker/core/metrics.py says what a snapshot holds)
    API_KEY: ClassVar[ApiKey] = ApiKey.STATS
    core: int = 0
    stats_json: str = "{}"

    def write(self, w: Writer) -> None:
        w.pack("H", self.core).bytes(self.stats_json.encode())

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        core = r.int("H")
        raw = r.bytes()
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            raise MalformedBody("stats are not UTF-8") from exc
        return {"core": core, "stats_json": text}
