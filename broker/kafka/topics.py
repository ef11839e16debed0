"""CreateTopics (api 19, v2-7) and DeleteTopics (api 20, v1-6) through the core's create and delete.

Rules this module keeps:
- One node: each topic through `Core.create_topic` / `Core.delete_topic` (which tells the other
  cores first), one answer once every one is done. A cluster: each through the cluster's store,
  off the loop, answered once this node's registry shows the change.
- num_partitions -1 is one partition; one node keeps one copy (replication factor -1 or 1).
  Replicas placed by hand (`assignments`) follow Kafka's rules (broker/kafka/replicas.py
  `topic_assignment`): on one node each list can name only this node; in a cluster the store
  places the partitions as given. The configs are the topic's overrides, checked as Kafka checks them
  (broker/core/topic_configs.py): an unknown name, a null or bad value is INVALID_CONFIG with the
  reason, and nothing is created. `validate_only` checks everything a creation would (name,
  limits, configs) and creates nothing.
- v5+ (flexible; KIP-525) answer a topic created, or one `validate_only` would create, as Kafka's
  controller does (`ReplicationControlManager.createTopic`): its partition count, replication
  factor and every topic config with its effective value, source, read-only and sensitive flags
  (sorted by name; the model DescribeConfigs answers from, broker/kafka/configs.py) when the
  principal may describe the topic's configs, else none of them and topic_config_error_code
  TOPIC_AUTHORIZATION_FAILED; a refused topic answers only its error (-1 counts, no configs).
  v7 adds the topic's id, Metadata's (`topic_uuid`); validate_only and a refusal answer the
  zero id (Kafka makes up an id for validate_only that no topic ever has).
- A name given twice in one request is INVALID_REQUEST ("Duplicate topic name."), answered
  once, and that topic is neither created nor validated; the other topics go on (Kafka's
  `ControllerApis.createTopics`).
"""

from __future__ import annotations

import datetime
import sys
import uuid
from typing import Any, Final, NamedTuple

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Gather, Outcome, Reply
from broker.core.topic_configs import describe_topic
from broker.core.topics import Topic
from broker.kafka import replicas
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.configs import created_topic_configs
from broker.kafka.context import Context
from broker.kafka.errors import DONE, kafka_error
from broker.kafka.metadata import topic_names_by_uuid
from broker.kafka.metadata_entries import topic_uuid

CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
CREATE_VERSIONS: Final = (2, 7)  # v0-1: kio has no schema for them; v5+ flexible, with configs; v7 ids
DELETE_VERSIONS: Final = (1, 6)  # v0: kio has no schema for it; v4+ flexible; v6: topics by name or id


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def create_topics(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """Each topic through the core's `create_topic` (module rules)."""
    schema = response_schema(CREATE_TOPICS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    twice = _named_twice(body.topics)
    wanted = [t for t in body.topics if t.name not in twice]
    doubled = [
        _result(ctx, module, n, ErrorCode.invalid_request, "Duplicate topic name.", None) for n in twice
    ]
    if ctx.core.config.cluster is not None:
        return _create_topics_in_cluster(ctx, request, body, schema, module, wanted, doubled)
    results = []
    for t in wanted:
        code, message, made = ErrorCode.none, None, None
        try:
            assignment = replicas.topic_assignment(ctx.core, t)
            if assignment is None and int(t.replication_factor) not in (-1, 1):
                code, message = (
                    ErrorCode.invalid_replication_factor,
                    "ringlog keeps one copy: replication factor -1 or 1",
                )
            else:
                configs = _configs(t.configs)
                partitions = 1 if int(t.num_partitions) == -1 else int(t.num_partitions)
                if assignment is not None:
                    partitions = len(assignment)
                if body.validate_only:
                    ctx.core.refresh_topics()
                    made = ctx.core.registry.make(t.name, partitions, 0, configs)
                else:
                    made = ctx.core.create_topic(t.name, partitions, configs)
        except _Refused as exc:
            code, message = exc.code, str(exc)
        except Exception as exc:
            code, message = kafka_error(exc)
        created = None if made is None else _Created(made, 1, bool(body.validate_only))
        results.append(_result(ctx, module, t.name, code, message, created))
    resp = make(schema, throttle_time=datetime.timedelta(0), topics=(*results, *doubled))
    return Reply(encode_response(request.correlation_id, resp))


def _named_twice(topics: Any) -> list[str]:
    """The names a request gives more than once, in the order first given."""
    seen: set[str] = set()
    twice: dict[str, None] = {}
    for t in topics:
        if t.name in seen:
            twice[t.name] = None
        seen.add(t.name)
    return list(twice)


def _create_topics_in_cluster(
    ctx: Context,
    request: KafkaRequest,
    body: Any,
    schema: Any,
    module: Any,
    wanted: list[Any],
    doubled: list[Any],
) -> Outcome:
    """A cluster's CreateTopics: each topic created in the store (replication -1 is the
    cluster's default; placement over the live nodes), off the loop, in one answer."""
    calls = ctx.core.config.cluster.calls  # type: ignore[union-attr]
    registry = ctx.core.registry
    # broker ids to nodes here, on the loop: the view they are read from is the loop's
    assignments: dict[str, list[tuple[int, ...]] | None] = {}
    early: dict[str, Exception] = {}
    for t in wanted:
        try:
            assignments[t.name] = replicas.topic_assignment(ctx.core, t)
        except Exception as exc:
            early[t.name] = exc

    def create_all() -> list[tuple[str, ErrorCode, str | None, Topic | None]]:
        out: list[tuple[str, ErrorCode, str | None, Topic | None]] = []
        for t in wanted:
            code, message, made = ErrorCode.none, None, None
            if t.name in early:
                out.append((t.name, *kafka_error(early[t.name]), None))
                continue
            try:
                assignment = assignments[t.name]
                configs = _configs(t.configs)
                partitions = 1 if int(t.num_partitions) == -1 else int(t.num_partitions)
                if assignment is not None:
                    partitions = len(assignment)
                if body.validate_only:
                    made = registry.make(t.name, partitions, 1, configs)
                else:
                    made = calls.create_topic(
                        registry,
                        t.name,
                        partitions,
                        configs,
                        replication=int(t.replication_factor),
                        assignment=assignment,
                    )
            except _Refused as exc:
                code, message = exc.code, str(exc)
            except Exception as exc:
                code, message = kafka_error(exc)
                if "replication factor" in str(exc):
                    code = ErrorCode.invalid_replication_factor
            out.append((t.name, code, message, made))
        return out

    factors = {str(t.name): int(t.replication_factor) for t in wanted}

    def replication(topic: Topic) -> int:
        """The factor asked, else (-1: the cluster's default) the replicas the view gives the
        topic's first partition (-1 for validate_only, which makes none)."""
        if factors.get(topic.name, -1) != -1:
            return factors[topic.name]
        state = ctx.core.cluster.state_of(topic.topic_id, 0)
        return -1 if state is None else len(state.replicas)

    def answer(results: Any) -> Reply:
        if isinstance(results, BaseException):
            code, message = kafka_error(results)
            results = [(t.name, code, message, None) for t in wanted]
        topics = tuple(
            _result(
                ctx,
                module,
                n,
                c,
                msg,
                None if made is None else _Created(made, replication(made), bool(body.validate_only)),
            )
            for n, c, msg, made in results
        )
        resp = make(schema, throttle_time=datetime.timedelta(0), topics=(*topics, *doubled))
        return Reply(encode_response(request.correlation_id, resp))

    def created(results: list[tuple[str, ErrorCode, str | None, Topic | None]]) -> bool:
        """Every topic made is in this node's registry, and in its view (its replicas, which
        the answer's replication factor of the default reads) when made with the default."""
        if body.validate_only:
            return True
        view = ctx.core.cluster
        return all(
            n in registry.by_name
            and (factors.get(n, -1) != -1 or view.state_of(made.topic_id, 0) is not None)
            for n, code, _, made in results
            if code == ErrorCode.none and made is not None
        )

    return ctx.core.in_cluster(create_all, answer, until=created)


class _Created(NamedTuple):
    """A topic CreateTopics made (or, `validate_only`, would make), as its answer describes it."""

    topic: Topic
    replication: int
    validate_only: bool


def _result(
    ctx: Context, module: Any, name: str, code: ErrorCode, message: str | None, created: _Created | None
) -> Any:
    """One topic's CreatableTopicResult, every version's fields (`make` keeps its version's):
    v5+ the topic's counts and configs when the principal may describe its configs (module
    rules), v7 its id."""
    fields: dict[str, Any] = {"name": name, "error_code": code, "error_message": message, "topic_id": None}
    if created is None or code != ErrorCode.none or not hasattr(module, "CreatableTopicConfigs"):
        return make(
            module.CreatableTopicResult, **fields, num_partitions=-1, replication_factor=-1, configs=()
        )
    topic = created.topic
    if not created.validate_only:
        fields["topic_id"] = topic_uuid(ctx.cluster_id, topic.topic_id)
    authorizer = ctx.authorizer
    if authorizer.enabled and not authorizer.allowed(ctx.auth.principal, "describe_configs", "topic", name):
        return make(
            module.CreatableTopicResult,
            **fields,
            topic_config_error_code=int(ErrorCode.topic_authorization_failed),
            num_partitions=-1,
            replication_factor=-1,
            configs=(),
        )
    entries = describe_topic(topic.configs, ctx.core.registry.topic_defaults)
    return make(
        module.CreatableTopicResult,
        **fields,
        num_partitions=topic.partitions,
        replication_factor=created.replication,
        configs=created_topic_configs(module, entries),
    )


def delete_topics(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """Each topic through the core's `delete_topic` (which tells the other cores first); one
    answer once every deletion is done. v6 names topics by name or by id (Kafka's
    ControllerApis.deleteTopics rules: not both, neither, or twice is INVALID_REQUEST with its
    message; an unknown id UNKNOWN_TOPIC_ID; a topic named by id needs delete on it, checked
    here once its name is known, names being checked before: broker/kafka/authorize.py)."""
    schema = response_schema(DELETE_TOPICS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    early: list[tuple[str | None, uuid.UUID | None, ErrorCode, str | None]] = []  # answered as is
    names = _deletions(ctx, body, early)
    codes: dict[str, ErrorCode] = {}
    parts: list[Outcome] = []

    def answer() -> Reply:
        results = [
            make(
                module.DeletableTopicResult,
                name=name,
                topic_id=topic_id,
                error_code=code,
                error_message=message,
            )
            for name, topic_id, code, message in early
        ]
        results.extend(
            make(module.DeletableTopicResult, name=n, topic_id=names[n], error_code=codes[n]) for n in names
        )
        resp = make(schema, throttle_time=datetime.timedelta(0), responses=tuple(results))
        return Reply(encode_response(request.correlation_id, resp))

    cluster = ctx.core.config.cluster
    if cluster is not None:
        calls = cluster.calls

        def delete_all() -> dict[str, ErrorCode]:
            for name in names:
                try:
                    calls.delete_topic(name)
                    codes[name] = ErrorCode.none
                except Exception as exc:
                    codes[name] = kafka_error(exc)[0]
            return codes

        def answered(result: Any) -> Reply:
            if isinstance(result, BaseException):
                for name in names:
                    codes.setdefault(name, kafka_error(result)[0])
            return answer()

        registry = ctx.core.registry

        def deleted(codes: dict[str, ErrorCode]) -> bool:
            return all(n not in registry.by_name for n, code in codes.items() if code == ErrorCode.none)

        return ctx.core.in_cluster(delete_all, answered, until=deleted)
    for name in names:
        codes[name] = ErrorCode.none
        try:
            parts.append(ctx.core.delete_topic(name, lambda: DONE))
        except Exception as exc:
            codes[name] = kafka_error(exc)[0]
    return Gather(parts, answer)


def _deletions(
    ctx: Context, body: Any, early: list[tuple[str | None, uuid.UUID | None, ErrorCode, str | None]]
) -> dict[str, uuid.UUID | None]:
    """The topics a DeleteTopics deletes (name -> its Kafka id, v6 where given or known), the
    ones refused before any deletion appended to `early` (`delete_topics` says which)."""
    if getattr(body, "topic_names", None) is not None or not hasattr(body, "topics"):
        return dict.fromkeys(dict.fromkeys(str(n) for n in body.topic_names or ()))
    by_name: dict[str, uuid.UUID | None] = {}
    twice_named: set[str] = set()
    ids: list[uuid.UUID] = []
    twice_ids: set[uuid.UUID] = set()
    for t in body.topics:
        if t.name is None and not t.topic_id:
            early.append((None, None, ErrorCode.invalid_request, "Neither topic name nor id were specified."))
        elif t.name is not None and t.topic_id:
            message = "You may not specify both topic name and topic id."
            early.append((t.name, t.topic_id, ErrorCode.invalid_request, message))
        elif t.name is not None:
            name = str(t.name)
            if name in by_name or name in twice_named:
                twice_named.add(name)
            else:
                by_name[name] = None
        elif t.topic_id in ids:
            twice_ids.add(t.topic_id)
        else:
            ids.append(t.topic_id)
    for name in twice_named:
        by_name.pop(name, None)
        early.append((name, None, ErrorCode.invalid_request, "Duplicate topic name."))
    for topic_id in twice_ids:
        ids.remove(topic_id)
        early.append((None, topic_id, ErrorCode.invalid_request, "Duplicate topic id."))
    found = topic_names_by_uuid(ctx, ids)
    authorizer = ctx.authorizer
    for topic_id in ids:
        named = found[topic_id]
        if named is None:
            early.append((None, topic_id, ErrorCode.unknown_topic_id, None))
            continue
        name = named
        if authorizer.enabled and not authorizer.allowed(ctx.auth.principal, "delete", "topic", name):
            ctx.core.metrics.denied()
            shown = name if authorizer.allowed(ctx.auth.principal, "describe", "topic", name) else None
            early.append((shown, topic_id, ErrorCode.topic_authorization_failed, None))
        elif name in by_name:
            del by_name[name]
            message = "The provided topic name maps to an ID that was already supplied."
            early.append((name, topic_id, ErrorCode.invalid_request, message))
        else:
            by_name[name] = topic_id
    registry = ctx.core.registry
    for name in [n for n, given in by_name.items() if given is None]:
        topic = registry.by_name.get(name)
        if topic is not None:
            by_name[name] = topic_uuid(ctx.cluster_id, topic.topic_id)
    return by_name


def _configs(configs: Any) -> dict[str, str | None]:
    """A CreateTopics topic's configs, as given (the core checks them); a name given twice is
    refused as Kafka refuses it."""
    out: dict[str, str | None] = {}
    for c in configs or ():
        name = str(c.name)
        if name in out:
            raise _Refused(ErrorCode.invalid_request, f"duplicate config key {name}")
        out[name] = c.value
    return out
