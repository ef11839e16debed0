"""The Kafka codec and adapter without a server: frames, the protocol sniff, every version of
ApiVersions and Metadata decoded back with kio's own readers, the group APIs (FindCoordinator,
NOT_COORDINATOR, OffsetCommit and OffsetFetch at every version), and what is not answered."""

from __future__ import annotations

import datetime
import struct
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32, i64

from broker.backends.connection import FirstBytes
from broker.core.acks import InvalidAcksError, check_acks
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.errors import error_of
from broker.core.outcomes import Append, Gather, Later, Reply
from broker.core.producer_ids import EPOCH_LAST
from broker.kafka.adapter import SUPPORTED_VERSIONS, KafkaAdapter, cluster_id_for
from broker.kafka.codec import (
    KafkaFrameDecoder,
    KafkaRequest,
    kafka_decoder,
    make,
    request_schema,
)
from broker.kafka.errors import kafka_error
from broker.kafka.metadata_entries import topic_uuid
from broker.node.worker import serving_adapters
from broker.ringlog.adapter import RinglogAdapter
from broker.security.session import ConnectionAuth
from labkit.kafka_requests import frame as frame_of
from labkit.kafka_requests import read_response, request_of
from ringlog_proto import messages as m
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT, Record, encode_batch
from ringlog_proto.frames import NEED_DATA, FrameDecoder, ProtocolError, frame_decoder
from ringlog_proto.routing import coordinator_for, shard_for


def answer(adapter: KafkaAdapter, raw: bytes, api_key: int, version: int) -> tuple[int, Any]:
    """(correlation id, decoded response) of the adapter's reply to `raw` (a `Later` one is
    started here: in-process, nothing it waits for is on another core)."""
    outcome = adapter.handle(request_of(raw))
    if isinstance(outcome, Later):
        answers: list[Any] = []
        outcome.start(answers.append)
        assert len(answers) == 1
        outcome = answers[0]
    assert isinstance(outcome, Reply)
    return read_response(api_key, version, b"".join(outcome.buffers))


@pytest.fixture
def adapter(tmp_path: Path) -> KafkaAdapter:
    config = BrokerConfig(data_dir=str(tmp_path), port=9092, cores=2, core_ports=(9100, 9101))
    return KafkaAdapter(Core(config), config)


def create_topic(adapter: KafkaAdapter, name: str, partitions: int) -> int:
    decoder = FrameDecoder()
    decoder.feed(b"".join(m.encode_request(m.CreateTopicRequest(name, partitions), 1)))
    frame = decoder.next_frame()
    outcome = RinglogAdapter(adapter.core).handle(frame)  # type: ignore[arg-type]
    assert isinstance(outcome, Reply)
    decoder = FrameDecoder()
    decoder.feed(b"".join(outcome.buffers))
    resp = m.decode_response(decoder.next_frame())  # type: ignore[arg-type]
    assert isinstance(resp, m.CreateTopicResponse) and resp.error == m.ErrorCode.NONE
    return resp.topic_id


# ----------------------------------------------------------------------------- frames and the sniff


def test_decoder_takes_requests_fed_in_pieces() -> None:
    raw = frame_of(18, 0, 7, None) + frame_of(18, 1, 8, None)
    decoder = KafkaFrameDecoder(1 << 20)
    got = []
    for i in range(len(raw)):
        decoder.feed(raw[i : i + 1])
        req = decoder.next_frame()
        if req is not NEED_DATA:
            assert isinstance(req, KafkaRequest)
            got.append((req.api_key, req.api_version, req.correlation_id))
    assert got == [(18, 0, 7), (18, 1, 8)]
    assert decoder.buffered == 0


def test_decoder_refuses_oversized_and_short_sizes() -> None:
    decoder = KafkaFrameDecoder(64)
    decoder.feed(struct.pack(">i", 61))
    with pytest.raises(ProtocolError, match="exceeds the maximum 64"):
        decoder.next_frame()
    decoder = KafkaFrameDecoder(64)
    decoder.feed(struct.pack(">i", 3) + b"abc")
    with pytest.raises(ProtocolError, match="shorter than a request header"):
        decoder.next_frame()
    decoder = KafkaFrameDecoder(64)
    decoder.feed(struct.pack(">i", -5))
    with pytest.raises(ProtocolError):
        decoder.next_frame()


def test_first_bytes_choose_the_protocol(tmp_path: Path) -> None:
    core = Core(BrokerConfig(data_dir=str(tmp_path)))
    adapters = serving_adapters(core)
    ringlog, kafka = adapters.clients
    assert isinstance(ringlog, RinglogAdapter) and isinstance(kafka, KafkaAdapter)
    assert adapters.internal is ringlog
    ours = b"".join(m.encode_request(m.ApiVersionsRequest(), 1))
    theirs = frame_of(
        18, 3, 1, make(request_schema(18, 3), client_software_name="x", client_software_version="1")
    )  # type: ignore[arg-type]
    # the decoders the broker's connections use (native/frames.c's when it is built)
    kinds = ((ours, ringlog, type(frame_decoder())), (theirs, kafka, type(kafka_decoder(1 << 20))))
    for raw, adapter, kind in kinds:
        first = FirstBytes(adapters.clients, 1 << 20)
        first.feed(raw[:4])
        assert first.decide() is None  # four bytes say nothing yet
        first.feed(raw[4:])
        assert first.decide() is adapter
        decoder = first.hand_over(adapter, ConnectionAuth("client"))
        assert isinstance(decoder, kind)
        assert decoder.buffered == len(raw)
        assert decoder.next_frame() is not NEED_DATA
    garbage = FirstBytes(adapters.clients, 1 << 20)
    garbage.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(ProtocolError, match="neither a ringlog frame nor a Kafka request"):
        garbage.decide()
    core.close()


# ----------------------------------------------------------------------------- ApiVersions


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_api_versions_lists_only_what_is_answered(adapter: KafkaAdapter, version: int) -> None:
    schema = request_schema(18, version)
    assert schema is not None
    body = make(schema, client_software_name="librdkafka", client_software_version="2.0.2")
    corr, resp = answer(adapter, frame_of(18, version, 42, body), 18, version)
    assert corr == 42
    assert resp.error_code == ErrorCode.none
    assert {a.api_key: (a.min_version, a.max_version) for a in resp.api_keys} == SUPPORTED_VERSIONS
    assert SUPPORTED_VERSIONS == {
        0: (0, 8),
        1: (4, 11),
        2: (1, 5),
        3: (0, 12),
        18: (0, 3),
        19: (2, 7),
        20: (1, 6),
        22: (0, 4),
        23: (0, 3),
        8: (2, 7),
        9: (1, 7),
        10: (0, 2),
        11: (0, 5),
        12: (0, 3),
        13: (0, 3),
        14: (0, 3),
        15: (0, 4),
        16: (0, 2),
        17: (0, 1),
        36: (0, 2),
        29: (1, 3),
        30: (1, 3),
        31: (1, 3),
        32: (1, 4),
        33: (0, 2),
        44: (0, 1),
        37: (0, 3),
        21: (0, 2),
        42: (0, 2),
        47: (0, 0),
        35: (1, 4),
        60: (0, 2),
        61: (0, 0),
        43: (0, 2),
        45: (0, 0),
        46: (0, 0),
        24: (0, 3),
        25: (0, 4),
        26: (0, 4),
        27: (1, 2),
        28: (0, 4),
        65: (0, 0),
        66: (0, 1),
    }


def test_api_versions_v3_answers_with_header_v0_and_no_tagged_fields(adapter: KafkaAdapter) -> None:
    schema = request_schema(18, 3)
    assert schema is not None
    body = make(schema, client_software_name="x", client_software_version="1")
    outcome = adapter.handle(request_of(frame_of(18, 3, 5, body)))
    assert isinstance(outcome, Reply)
    data = b"".join(outcome.buffers)
    # size, correlation id, then the body at once (no header tag buffer), whose error code is 0;
    # the body ends with an empty tag buffer: no tagged field is sent at its default.
    assert struct.unpack_from(">ih", data, 4) == (5, 0)
    assert data[-1] == 0
    # size, correlation id, error code, the compact array's length, 7 bytes per api, throttle, tags
    assert len(data) == 4 + 4 + 2 + 1 + 7 * len(SUPPORTED_VERSIONS) + 4 + 1


def test_api_versions_above_ours_gets_unsupported_version_in_v0(adapter: KafkaAdapter) -> None:
    # A v4 body is v3's; the answer is a v0 response whatever the version asked.
    schema = request_schema(18, 4)
    assert schema is not None
    body = make(schema, client_software_name="x", client_software_version="1")
    corr, resp = answer(adapter, frame_of(18, 4, 9, body), 18, 0)
    assert corr == 9
    assert resp.error_code == ErrorCode.unsupported_version
    assert {a.api_key: (a.min_version, a.max_version) for a in resp.api_keys} == SUPPORTED_VERSIONS


# ----------------------------------------------------------------------------- Metadata


def metadata_request(version: int, topics: list[str] | None) -> Any:
    schema = request_schema(3, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["MetadataRequestTopic"])
    wanted = (
        None
        if topics is None
        else tuple(make(module.MetadataRequestTopic, name=t, topic_id=None) for t in topics)
    )
    return make(
        schema,
        topics=wanted,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


@pytest.mark.parametrize("version", range(0, 13))
def test_metadata_every_version(adapter: KafkaAdapter, version: int) -> None:
    topic_id = create_topic(adapter, "orders", 4)
    all_topics = [] if version == 0 else None  # v0: an empty list means all
    corr, resp = answer(adapter, frame_of(3, version, 11, metadata_request(version, all_topics)), 3, version)
    assert corr == 11
    assert {(b.node_id, b.host, b.port) for b in resp.brokers} == {
        (0, "127.0.0.1", 9100),
        (1, "127.0.0.1", 9101),
    }
    if version >= 1:
        assert resp.controller_id == 0
    if version >= 2:
        assert resp.cluster_id == cluster_id_for(adapter.config.data_dir)
    [topic] = resp.topics
    assert (topic.name, topic.error_code) == ("orders", ErrorCode.none)
    for p in topic.partitions:
        owner = shard_for(topic_id, p.partition_index, 2)
        assert (p.leader_id, p.replica_nodes, p.isr_nodes) == (owner, (owner,), (owner,))
    assert sorted(p.partition_index for p in topic.partitions) == [0, 1, 2, 3]
    if version >= 10:
        assert topic.topic_id == topic_uuid(cluster_id_for(adapter.config.data_dir), topic_id)


def test_metadata_unknown_topic_and_empty_list(adapter: KafkaAdapter) -> None:
    create_topic(adapter, "orders", 1)
    _, resp = answer(adapter, frame_of(3, 4, 1, metadata_request(4, ["orders", "nope"])), 3, 4)
    assert [(t.name, t.error_code) for t in resp.topics] == [
        ("orders", ErrorCode.none),
        ("nope", ErrorCode.unknown_topic_or_partition),
    ]
    assert "nope" not in adapter.core.registry.by_name  # never auto-created
    _, resp = answer(adapter, frame_of(3, 4, 2, metadata_request(4, [])), 3, 4)
    assert resp.topics == ()  # v1+: an empty list asks for no topic


def test_metadata_without_core_ports_lists_the_public_port(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=str(tmp_path), port=9092, cores=2, core_ports=())
    adapter = KafkaAdapter(Core(config), config)
    _, resp = answer(adapter, frame_of(3, 1, 1, metadata_request(1, None)), 3, 1)
    assert {(b.node_id, b.port) for b in resp.brokers} == {(0, 9092), (1, 9092)}


def test_ours_and_kafkas_metadata_agree(adapter: KafkaAdapter) -> None:
    create_topic(adapter, "orders", 4)
    view = adapter.core.metadata_view(None)
    _, resp = answer(adapter, frame_of(3, 8, 1, metadata_request(8, None)), 3, 8)
    [topic] = view.topics
    assert {p.index: p.owner_core for p in topic.partitions} == {
        p.partition_index: p.leader_id for p in resp.topics[0].partitions
    }


# ----------------------------------------------------------------------------- InitProducerId


def init_producer_id(adapter: KafkaAdapter, version: int, **values: Any) -> Any:
    schema = request_schema(22, version)
    assert schema is not None
    body = make(schema, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60), **values)
    corr, resp = answer(adapter, frame_of(22, version, 11, body), 22, version)
    assert corr == 11
    return resp


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_init_producer_id_every_version_gives_new_ids(adapter: KafkaAdapter, version: int) -> None:
    first = init_producer_id(adapter, version, producer_id=i64(-1), producer_epoch=i16(-1))
    second = init_producer_id(adapter, version, producer_id=i64(-1), producer_epoch=i16(-1))
    assert (first.error_code, first.producer_epoch) == (ErrorCode.none, 0)
    assert 0 <= first.producer_id < BROKER_PRODUCER_ID_LIMIT
    assert second.producer_id == first.producer_id + 1  # the rest of the block this core claimed


@pytest.mark.parametrize("version", [2, 3, 4])
def test_init_producer_id_flexible_versions_send_no_tagged_fields(
    adapter: KafkaAdapter, version: int
) -> None:
    schema = request_schema(22, version)
    assert schema is not None
    body = make(
        schema,
        transactional_id=None,
        transaction_timeout=datetime.timedelta(seconds=1),
        producer_id=i64(-1),
        producer_epoch=i16(-1),
    )
    outcome = adapter.handle(request_of(frame_of(22, version, 5, body)))
    assert isinstance(outcome, Reply)
    data = b"".join(outcome.buffers)
    # size, correlation id, the response header v1's empty tag buffer, throttle, error, id, epoch,
    # the body's empty tag buffer: no tagged field at its default is written.
    assert len(data) == 4 + 4 + 1 + 4 + 2 + 8 + 2 + 1
    assert data[8] == 0 and data[-1] == 0


@pytest.mark.parametrize("version", [3, 4])
def test_init_producer_id_bumps_the_epoch_of_a_known_producer(adapter: KafkaAdapter, version: int) -> None:
    new = init_producer_id(adapter, version, producer_id=i64(-1), producer_epoch=i16(-1))
    bumped = init_producer_id(adapter, version, producer_id=new.producer_id, producer_epoch=i16(0))
    assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (
        ErrorCode.none,
        new.producer_id,
        1,
    )
    # an exhausted epoch, or an id this broker never gives, starts a new id at epoch 0
    worn = init_producer_id(adapter, version, producer_id=new.producer_id, producer_epoch=i16(EPOCH_LAST))
    assert worn.producer_id not in (new.producer_id, -1) and worn.producer_epoch == 0
    foreign = init_producer_id(
        adapter, version, producer_id=i64(BROKER_PRODUCER_ID_LIMIT), producer_epoch=i16(3)
    )
    assert foreign.producer_id < BROKER_PRODUCER_ID_LIMIT and foreign.producer_epoch == 0


def _txn_id_on(adapter: KafkaAdapter, core: int) -> str:
    txns = adapter.core.transactions
    topic = txns.ensure_topic()
    assert topic is not None
    return next(
        t
        for t in (f"tx{i}" for i in range(1000))
        if adapter.core.owner(topic.topic_id, txns.partition_for(t)) == core
    )


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_init_producer_id_of_another_cores_transactional_id_is_not_coordinator(
    adapter: KafkaAdapter, version: int
) -> None:
    """A transactional id is served by the core owning its __transaction_state partition; the
    client asks FindCoordinator again elsewhere (the adapter is core 0's)."""
    schema = request_schema(22, version)
    assert schema is not None
    body = make(
        schema, transactional_id=_txn_id_on(adapter, 1), transaction_timeout=datetime.timedelta(seconds=60)
    )
    _, resp = answer(adapter, frame_of(22, version, 1, body), 22, version)
    assert (resp.error_code, resp.producer_id, resp.producer_epoch) == (ErrorCode.not_coordinator, -1, -1)


# ----------------------------------------------------------------------------- the rest


def test_unadvertised_api_with_top_level_error_code_gets_unsupported_version(adapter: KafkaAdapter) -> None:
    schema = request_schema(12, 4)  # Heartbeat v4 (flexible): not ours
    assert schema is not None
    body = make(schema, group_id="g", generation_id=i32(1), member_id="m", group_instance_id=None)
    corr, resp = answer(adapter, frame_of(12, 4, 3, body), 12, 4)
    assert (corr, resp.error_code) == (3, ErrorCode.unsupported_version)


def test_unknown_api_or_version_without_a_schema_closes(adapter: KafkaAdapter) -> None:
    with pytest.raises(ProtocolError, match="api 999 v0 is not supported"):
        adapter.handle(KafkaRequest(999, 0, 1, struct.pack(">hhih", 999, 0, 1, -1)))
    with pytest.raises(ProtocolError, match="api 1 v3 is not supported"):  # Fetch v3: kio has none
        adapter.handle(KafkaRequest(1, 3, 1, struct.pack(">hhih", 1, 3, 1, -1)))


def test_malformed_body_closes(adapter: KafkaAdapter) -> None:
    raw = frame_of(3, 1, 1, None) + b"\x00"  # an array length cut short
    raw = struct.pack(">i", len(raw) - 4) + raw[4:]
    with pytest.raises(ProtocolError, match="malformed kafka request"):
        adapter.handle(request_of(raw))


def test_cluster_id_is_stable_and_kafka_shaped(tmp_path: Path) -> None:
    first = cluster_id_for(str(tmp_path))
    assert first == cluster_id_for(str(tmp_path)) and len(first) == 22
    assert first != cluster_id_for(str(tmp_path / "other"))


# ----------------------------------------------------------------------------- OffsetForLeaderEpoch


@pytest.mark.parametrize("version", [2, 3])
def test_offset_for_leader_epoch_answers_owned_partitions_only(adapter: KafkaAdapter, version: int) -> None:
    topic_id = create_topic(adapter, "orders", 4)
    schema = request_schema(23, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["OffsetForLeaderTopic"])
    partitions = tuple(
        make(
            module.OffsetForLeaderPartition,
            partition=i32(p),
            current_leader_epoch=i32(-1),
            leader_epoch=i32(0),
        )
        for p in range(4)
    )
    body = make(
        schema,
        replica_id=i32(-2),
        topics=(make(module.OffsetForLeaderTopic, topic="orders", partitions=partitions),),
    )
    corr, resp = answer(adapter, frame_of(23, version, 4, body), 23, version)
    assert corr == 4
    got = {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in resp.topics[0].partitions}
    for p in range(4):
        if shard_for(topic_id, p, 2) == adapter.config.core_id:
            assert got[p] == (ErrorCode.none, 0, 0)
        else:
            assert got[p] == (ErrorCode.not_leader_or_follower, -1, -1)
    assert {shard_for(topic_id, p, 2) for p in range(4)} == {0, 1}  # both cases were seen


# ----------------------------------------------------------------------------- groups


@pytest.mark.parametrize("version", [0, 1, 2])
def test_find_coordinator_names_the_group_core_at_its_port(adapter: KafkaAdapter, version: int) -> None:
    schema = request_schema(10, version)
    assert schema is not None
    for group in ("orders", "billing", "x"):
        body = make(schema, key=group, key_type=i32(0))
        _, resp = answer(adapter, frame_of(10, version, 5, body), 10, version)
        core = coordinator_for(group, 2)
        assert (resp.error_code, resp.node_id, resp.host, resp.port) == (
            ErrorCode.none,
            core,
            "127.0.0.1",
            9100 + core,
        )
    if version >= 1:  # a transactional id: the core owning its __transaction_state partition
        for core in (0, 1):
            body = make(schema, key=_txn_id_on(adapter, core), key_type=i8(1))
            _, resp = answer(adapter, frame_of(10, version, 6, body), 10, version)
            assert (resp.error_code, resp.node_id, resp.port) == (ErrorCode.none, core, 9100 + core)
        assert "__transaction_state" in adapter.core.registry.by_name  # made on first use


def _group_on(core: int) -> str:
    return next(g for g in (f"g{i}" for i in range(100)) if coordinator_for(g, 2) == core)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_group_requests_of_another_core_are_not_coordinator(adapter: KafkaAdapter, version: int) -> None:
    other = _group_on(1)  # the adapter is core 0's
    schema = request_schema(12, version)
    assert schema is not None
    body = make(schema, group_id=other, generation_id=i32(1), member_id="m", group_instance_id=None)
    _, resp = answer(adapter, frame_of(12, version, 3, body), 12, version)
    assert resp.error_code == ErrorCode.not_coordinator
    mine = _group_on(0)
    body = make(schema, group_id=mine, generation_id=i32(1), member_id="m", group_instance_id=None)
    _, resp = answer(adapter, frame_of(12, version, 4, body), 12, version)
    assert resp.error_code == ErrorCode.unknown_member_id


@pytest.mark.parametrize("version", [2, 3, 4, 5, 6, 7])
def test_offset_commit_then_fetch_every_version(adapter: KafkaAdapter, version: int) -> None:
    create_topic(adapter, "t", 2)
    group = _group_on(0)
    schema = request_schema(8, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    parts = tuple(
        make(
            module.OffsetCommitRequestPartition,
            partition_index=i32(p),
            committed_offset=0,
            committed_leader_epoch=i32(-1),
            committed_metadata=f"m{p}",
            commit_timestamp=-1,
        )
        for p in range(3)  # partition 2 does not exist
    )
    body = make(
        schema,
        group_id=group,
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        group_instance_id=None,
        retention_time_ms=-1,
        topics=(make(module.OffsetCommitRequestTopic, name="t", partitions=parts),),
    )
    _, resp = answer(adapter, frame_of(8, version, 1, body), 8, version)
    codes = [p.error_code for p in resp.topics[0].partitions]
    assert codes == [ErrorCode.none, ErrorCode.none, ErrorCode.unknown_topic_or_partition]
    for fetch_version in (1, 5):
        fschema = request_schema(9, fetch_version)
        assert fschema is not None
        fmodule = __import__(fschema.__module__, fromlist=["x"])
        topics = (make(fmodule.OffsetFetchRequestTopic, name="t", partition_indexes=(i32(0), i32(1))),)
        _, fresp = answer(
            adapter,
            frame_of(9, fetch_version, 2, make(fschema, group_id=group, topics=topics)),
            9,
            fetch_version,
        )
        got = [(p.committed_offset, p.metadata) for p in fresp.topics[0].partitions]
        assert got == [(0, "m0"), (0, "m1")]
    _, every = answer(
        adapter, frame_of(9, 5, 3, make(request_schema(9, 5), group_id=group, topics=None)), 9, 5
    )
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in every.topics] == [("t", [0, 1])]


# ----------------------------------------------------------------------------- Produce's acks


def test_an_acks_kafka_does_not_have_is_invalid_required_acks(adapter: KafkaAdapter) -> None:
    """Kafka's acks are -1, 0 and 1 (its 2 is not our durable); any other is refused per partition,
    before the partition is looked up. The core's own refusal of an acks (broker/core/acks.py) is
    the same code in Kafka's words, INVALID_REQUEST in ours."""
    schema = request_schema(0, 8)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    data = make(
        module.TopicProduceData,
        name="nowhere",
        partition_data=(make(module.PartitionProduceData, index=i32(0), records=b"x"),),
    )
    body = make(
        schema,
        transactional_id=None,
        acks=i16(2),
        timeout=datetime.timedelta(seconds=1),
        topic_data=(data,),
    )
    outcome = adapter.handle(request_of(frame_of(0, 8, 5, body)))
    assert isinstance(outcome, Gather) and not outcome.parts, "nothing to store"
    reply = outcome.finish()
    assert isinstance(reply, Reply)
    _corr, resp = read_response(0, 8, b"".join(reply.buffers))
    assert resp.responses[0].partition_responses[0].error_code == ErrorCode.invalid_required_acks
    with pytest.raises(InvalidAcksError) as refused:
        check_acks(3)
    assert kafka_error(refused.value)[0] == ErrorCode.invalid_required_acks
    assert error_of(refused.value)[0] == m.ErrorCode.INVALID_REQUEST


def test_two_batches_for_one_partition_are_invalid_record(adapter: KafkaAdapter) -> None:
    """Kafka takes exactly one batch per partition in a Produce v3+ (ProduceRequest.validateRecords):
    two are INVALID_RECORD with its message and nothing goes to the partition; one is stored."""
    topic_id = create_topic(adapter, "one-batch", 4)
    config = adapter.core.config
    mine = next(p for p in range(4) if shard_for(topic_id, p, config.cores) == config.core_id)
    schema = request_schema(0, 8)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])

    def produce(records: bytes) -> Any:
        data = make(
            module.TopicProduceData,
            name="one-batch",
            partition_data=(make(module.PartitionProduceData, index=i32(mine), records=records),),
        )
        body = make(
            schema,
            transactional_id=None,
            acks=i16(1),
            timeout=datetime.timedelta(seconds=1),
            topic_data=(data,),
        )
        return adapter.handle(request_of(frame_of(0, 8, 5, body)))

    batch = encode_batch([Record(b"v")])
    outcome = produce(batch + batch)
    assert isinstance(outcome, Gather) and not outcome.parts, "nothing to store"
    reply = outcome.finish()
    assert isinstance(reply, Reply)
    _corr, resp = read_response(0, 8, b"".join(reply.buffers))
    answer_ = resp.responses[0].partition_responses[0]
    assert answer_.error_code == ErrorCode.invalid_record
    assert "exactly one record batch per partition" in (answer_.error_message or "")
    assert isinstance(produce(batch), Append), "one batch goes to the partition"


def test_metadata_as_librdkafka_asks_every_topic_at_v11_and_later(adapter: KafkaAdapter) -> None:
    """librdkafka 2.x writes a flexible Metadata's null topic array (every topic) as four zero
    bytes, three of them left after the body: read as Kafka reads it (they are never read). (At
    v9-10 Kafka reads one of them as an unknown tagged field, which kio refuses; librdkafka asks
    our highest version, 12.)"""
    create_topic(adapter, "orders", 1)
    for version in (11, 12):
        header = struct.pack(">hhih", 3, version, 7, 7) + b"rdkafka" + b"\x00"
        raw = header + b"\x00\x00\x00\x00" + b"\x01\x00\x00"
        corr, resp = answer(adapter, struct.pack(">i", len(raw)) + raw, 3, version)
        assert corr == 7
        assert [t.name for t in resp.topics] == ["orders"]
