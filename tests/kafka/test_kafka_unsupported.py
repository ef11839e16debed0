"""Every api and version kio knows that we do not answer gets a Kafka error in its own response
shape (broker/kafka/unsupported.py), without a server: the request's items answered one for one,
each with the error a Kafka broker gives for that disabled feature or UNSUPPORTED_VERSION."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Reply, Silent
from broker.kafka.adapter import SUPPORTED_VERSIONS, KafkaAdapter
from broker.kafka.codec import request_schema, response_schema
from broker.kafka.unsupported import DISABLED_FEATURE_ERRORS, error_response
from labkit.kafka_requests import build, error_codes, frame, read_response, request_of

UNANSWERED = [
    (key, version)
    for key in sorted(api_key_map)
    for version in sorted(schema_name_map[api_key_map[key]])
    if not (SUPPORTED_VERSIONS.get(key, (1, 0))[0] <= version <= SUPPORTED_VERSIONS.get(key, (1, 0))[1])
    and key != 18  # ApiVersions above ours: a v0 answer (test_adapter.py)
]

# api key -> error codes answered for a request with two items in every array (two topics of two
# partitions, two resources, ...): each item of the request answered, nothing dropped.
PER_ITEM = {
    0: 4,  # Produce (flexible): 2 topics x 2 partitions
    21: 4,  # DeleteRecords
    24: 4,  # AddPartitionsToTxn v0-3; v4+ adds a top-level error and a level of transactions
    27: 8,  # WriteTxnMarkers: 2 markers x 2 topics x 2 partition indexes
    28: 4,  # TxnOffsetCommit
    30: 2,  # CreateAcls: 2 creations
    31: 2,  # DeleteAcls: 2 filters
    32: 2,  # DescribeConfigs: 2 resources
    33: 2,  # AlterConfigs
    37: 2,  # CreatePartitions: 2 topics
    43: 4,  # ElectLeaders v0 (v1+ adds a top-level error)
    44: 2,  # IncrementalAlterConfigs
    49: 2,  # AlterClientQuotas: 2 entries
    50: 3,  # DescribeUserScramCredentials: top level + 2 users
    51: 4,  # AlterUserScramCredentials: 2 deletions + 2 upsertions
    61: 4,  # DescribeProducers
}


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> KafkaAdapter:
    data = tmp_path_factory.mktemp("unsupported")
    config = BrokerConfig(data_dir=str(Path(data)), port=9092, cores=1)
    return KafkaAdapter(Core(config), config)


def answered(adapter: KafkaAdapter, key: int, version: int, body: Any) -> Any:
    outcome = adapter.handle(request_of(frame(key, version, 77, body)))
    assert isinstance(outcome, Reply)
    corr, resp = read_response(key, version, b"".join(outcome.buffers))
    assert corr == 77
    return resp


@pytest.mark.parametrize(("key", "version"), UNANSWERED)
def test_every_unanswered_api_and_version_gets_its_error(
    adapter: KafkaAdapter, key: int, version: int
) -> None:
    schema = request_schema(key, version)
    assert schema is not None
    extra = {"acks": 1} if key == 0 else {}
    resp = answered(adapter, key, version, build(schema, filled=True, **extra))
    want = (
        ErrorCode.unsupported_version
        if key in SUPPORTED_VERSIONS
        else DISABLED_FEATURE_ERRORS.get(key, ErrorCode.unsupported_version)
    )
    codes = error_codes(resp)
    assert {c for _, c in codes} <= {want}
    if key in PER_ITEM and not (key == 24 and version >= 4) and not (key == 43 and version >= 1):
        assert len(codes) == PER_ITEM[key]


def test_items_keep_their_keys(adapter: KafkaAdapter) -> None:
    """The answer names the request's own topics, partitions and resources."""
    # resources (every version of the config apis is answered now: the builder, called as the
    # adapter calls it for an api it does not answer)
    body = build(request_schema(32, 1), filled=True)  # type: ignore[arg-type]
    resp = error_response(32, response_schema(32, 1), body, ErrorCode.unsupported_version, "DescribeConfigs")  # type: ignore[arg-type]
    assert [(r.resource_type, r.resource_name) for r in resp.results] == [
        (r.resource_type, r.resource_name) for r in body.resources
    ]
    assert all(r.configs == () and "DescribeConfigs" in (r.error_message or "") for r in resp.results)
    body = build(request_schema(34, 1), filled=True)  # type: ignore[arg-type]
    resp = answered(adapter, 34, 1, body)  # AlterReplicaLogDirs: every dir's topics, in order
    assert [(r.topic_name, [p.partition_index for p in r.partitions]) for r in resp.results] == [
        (t.name, list(t.partitions)) for d in body.dirs for t in d.topics
    ]
    body = build(request_schema(24, 0), filled=True)  # type: ignore[arg-type]
    # AddPartitionsToTxn is answered now (broker/kafka/transactions.py): the builder, as for configs
    resp = error_response(
        24, response_schema(24, 0), body, ErrorCode.unsupported_version, "AddPartitionsToTxn"
    )  # type: ignore[arg-type]
    assert [
        (t.name, [p.partition_index for p in t.results_by_partition])
        for t in resp.results_by_topic_v3_and_below
    ] == [(t.name, list(t.partitions)) for t in body.v3_and_below_topics]
    body = build(request_schema(43, 2), filled=True)  # type: ignore[arg-type]
    resp = error_response(43, response_schema(43, 2), body, ErrorCode.unsupported_version, "ElectLeaders")  # type: ignore[arg-type]
    assert resp.error_code == ErrorCode.unsupported_version
    assert [
        (r.topic, [p.partition_id for p in r.partition_result]) for r in resp.replica_election_results
    ] == [(t.topic, list(t.partitions)) for t in body.topic_partitions]
    body = build(request_schema(1, 12), filled=True)  # type: ignore[arg-type]
    resp = answered(adapter, 1, 12, body)  # a Fetch version we do not answer
    assert [(t.topic, [(p.partition_index, p.error_code) for p in t.partitions]) for t in resp.responses] == [
        (t.topic, [(p.partition, ErrorCode.unsupported_version) for p in t.partitions]) for t in body.topics
    ]


def test_security_and_sasl_errors(adapter: KafkaAdapter) -> None:
    for version in (1, 3):  # ACLs are off without authentication (broker/kafka/acl_admin.py)
        resp = answered(adapter, 29, version, build(request_schema(29, version)))  # type: ignore[arg-type]
        assert resp.error_code == ErrorCode.security_disabled and resp.resources == ()
    resp = answered(adapter, 17, 1, build(request_schema(17, 1), mechanism="PLAIN"))  # type: ignore[arg-type]
    assert (resp.error_code, resp.mechanisms) == (ErrorCode.unsupported_sasl_mechanism, ())
    resp = answered(adapter, 36, 2, build(request_schema(36, 2)))  # type: ignore[arg-type]
    assert resp.error_code == ErrorCode.illegal_sasl_state


def test_flexible_produce_with_acks_0_gets_no_answer(adapter: KafkaAdapter) -> None:
    body = build(request_schema(0, 9), filled=True, acks=0)  # type: ignore[arg-type]
    assert isinstance(adapter.handle(request_of(frame(0, 9, 1, body))), Silent)
