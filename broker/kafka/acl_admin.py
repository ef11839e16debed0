"""Kafka's ACL admin APIs: DescribeAcls (29), CreateAcls (30) and DeleteAcls (31), v1 to v3.

Rules this module keeps:
- They read and change the same ACLs as `broker acls` (broker/security/acls.py, the data dir's
  acls.json), so `kafka-acls.sh`, confluent-kafka's `AdminClient.create_acls()` and the CLI see
  one set. A change applies to every core at its next request (the file is reread on change).
- Only where ACLs are on (the listener authenticates): otherwise they are answered
  SECURITY_DISABLED, as a Kafka broker without an authorizer answers (the adapter sends them to
  broker/kafka/unsupported.py). Describing needs describe on the cluster, creating and deleting
  alter on the cluster (broker/kafka/authorize.py), as in Kafka.
- Kafka's codes map onto ours: resource types topic, group and cluster (others, such as
  transactional ids, are refused per item with INVALID_REQUEST); literal and prefixed patterns;
  operations read, write, create, delete, alter, describe, describe_configs, alter_configs and
  all; allow and deny. Hosts are not matched: a binding's host must be "*".
- A filter (describe, delete) matches a binding when each of its fields is ANY or equal; the
  pattern filter MATCH takes every binding that applies to the named resource (literal, "*",
  or a prefix of it), as Kafka's does.
- Changes are written to the file by the core's loop thread: an admin action, rare and small
  (the file is a few KB), not worth a thread hop. In a cluster the ACLs live in etcd
  (broker/cluster/security_docs.py) and the node's file is a copy: a change is written there,
  on the core's blocking threads (etcd calls block), and answered once stored; every node's copy
  follows within a watch event. Describing reads the node's copy.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.blocking import RunBlocking
from broker.core.outcomes import Later, Outcome, Reply, Silent
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.security.acls import AclBinding, AclError, AclStore

DESCRIBE_ACLS: Final = 29
CREATE_ACLS: Final = 30
DELETE_ACLS: Final = 31
VERSIONS: Final = {DESCRIBE_ACLS: (1, 3), CREATE_ACLS: (1, 3), DELETE_ACLS: (1, 3)}

ANY: Final = 1  # in every filter: any value
MATCH: Final = 2  # a pattern filter: every binding that applies to the named resource
ANY_HOST: Final = "*"
RESOURCE_TYPES: Final = {2: "topic", 3: "group", 4: "cluster", 5: "transactional_id"}
PATTERNS: Final = {3: "literal", 4: "prefixed"}
OPERATIONS: Final = {
    2: "all",
    3: "read",
    4: "write",
    5: "create",
    6: "delete",
    7: "alter",
    8: "describe",
    10: "describe_configs",
    11: "alter_configs",
}
PERMISSIONS: Final = {2: "deny", 3: "allow"}
_CODES: Final = {
    name: {v: k for k, v in table.items()}
    for name, table in (
        ("resource", RESOURCE_TYPES),
        ("pattern", PATTERNS),
        ("operation", OPERATIONS),
        ("permission", PERMISSIONS),
    )
}
_NO_THROTTLE: Final = datetime.timedelta(0)


class _Invalid(Exception):
    pass


def _named(table: dict[int, str], code: int, what: str) -> str:
    name = table.get(code)
    if name is None:
        raise _Invalid(f"{what} {code} is not one ringlog keeps (docs/SECURITY.md)")
    return name


def _binding(creation: Any) -> AclBinding:
    if creation.host != ANY_HOST:
        raise _Invalid(f"host {creation.host!r}: ringlog does not match hosts, only '*'")
    return AclBinding(
        principal=str(creation.principal),
        resource_type=_named(RESOURCE_TYPES, int(creation.resource_type), "resource type"),
        name=str(creation.resource_name),
        operation=_named(OPERATIONS, int(creation.operation), "operation"),
        permission=_named(PERMISSIONS, int(creation.permission_type), "permission"),
        pattern=_named(PATTERNS, int(creation.resource_pattern_type), "pattern type"),
    ).check()


def _filter(f: Any) -> Callable[[AclBinding], bool]:
    """A predicate for the bindings a Describe or Delete filter names. Raises `_Invalid`."""
    rtype, pattern = int(f.resource_type_filter), int(f.pattern_type_filter)
    op, perm = int(f.operation), int(f.permission_type)
    want_type = None if rtype == ANY else _named(RESOURCE_TYPES, rtype, "resource type")
    want_op = None if op == ANY else _named(OPERATIONS, op, "operation")
    want_perm = None if perm == ANY else _named(PERMISSIONS, perm, "permission")
    want_pattern = None if pattern in (ANY, MATCH) else _named(PATTERNS, pattern, "pattern type")
    name, principal, host = f.resource_name_filter, f.principal_filter, f.host_filter

    def applies(b: AclBinding) -> bool:
        if pattern != MATCH or name is None:
            return name is None or b.name == name
        return b.covers(str(name))

    def matches(b: AclBinding) -> bool:
        return (
            (want_type is None or b.resource_type == want_type)
            and (want_pattern is None or b.pattern == want_pattern)
            and (want_op is None or b.operation == want_op)
            and (want_perm is None or b.permission == want_perm)
            and (principal is None or b.principal == principal)
            and host in (None, ANY_HOST)
            and applies(b)
        )

    return matches


def _codes(b: AclBinding) -> dict[str, Any]:
    return {
        "resource_type": _CODES["resource"][b.resource_type],
        "resource_name": b.name,
        "pattern_type": _CODES["pattern"][b.pattern],
        "principal": b.principal,
        "host": ANY_HOST,
        "operation": _CODES["operation"][b.operation],
        "permission_type": _CODES["permission"][b.permission],
    }


class AclAdmin:
    """The three APIs over one core's ACL store (`cluster`: the cluster's, for changes; with
    `run_blocking` to reach it off the loop)."""

    def __init__(
        self, store: AclStore, cluster: AclStore | None = None, run_blocking: RunBlocking | None = None
    ) -> None:
        self.store = store
        self._cluster = cluster
        self._run_blocking = run_blocking

    def _write(
        self,
        change: Callable[[tuple[AclBinding, ...]], tuple[AclBinding, ...]],
        answer: Callable[[str | None], Reply],
    ) -> Outcome:
        """Store `change`, then `answer(None)`, or `answer(why not)` when it could not be stored."""
        cluster, run_blocking = self._cluster, self._run_blocking
        if cluster is None or run_blocking is None:
            try:
                self.store.replace(change)
            except OSError as exc:
                return answer(f"cannot write the ACLs: {exc}")
            return answer(None)

        def start(reply: Callable[[Reply | Silent], None]) -> None:
            def stored(result: object) -> None:
                reply(
                    answer(
                        f"cannot write the cluster's ACLs: {result}"
                        if isinstance(result, BaseException)
                        else None
                    )
                )

            run_blocking(lambda: cluster.replace(change), stored)

        return Later(start)

    def _reply(self, request: KafkaRequest, **values: Any) -> Reply:
        schema = response_schema(request.api_key, request.api_version)
        assert schema is not None
        return Reply(
            encode_response(request.correlation_id, make(schema, throttle_time=_NO_THROTTLE, **values))
        )

    def describe(self, request: KafkaRequest, body: Any) -> Outcome:
        schema = response_schema(request.api_key, request.api_version)
        assert schema is not None
        module = sys.modules[schema.__module__]
        try:
            matches = _filter(body)
        except _Invalid as exc:
            return self._reply(
                request, error_code=ErrorCode.invalid_request, error_message=str(exc), resources=()
            )
        grouped: dict[tuple[str, str, str], list[AclBinding]] = {}
        for b in self.store.bindings():
            if matches(b):
                grouped.setdefault((b.resource_type, b.name, b.pattern), []).append(b)
        resources = tuple(
            make(
                module.DescribeAclsResource,
                resource_type=_CODES["resource"][rtype],
                resource_name=name,
                pattern_type=_CODES["pattern"][pattern],
                acls=tuple(
                    make(
                        module.AclDescription,
                        principal=b.principal,
                        host=ANY_HOST,
                        operation=_CODES["operation"][b.operation],
                        permission_type=_CODES["permission"][b.permission],
                    )
                    for b in bindings
                ),
            )
            for (rtype, name, pattern), bindings in grouped.items()
        )
        return self._reply(request, error_code=ErrorCode.none, error_message=None, resources=resources)

    def create(self, request: KafkaRequest, body: Any) -> Outcome:
        schema = response_schema(request.api_key, request.api_version)
        assert schema is not None
        module = sys.modules[schema.__module__]
        results: list[tuple[ErrorCode, str | None]] = []
        new: list[AclBinding] = []
        for creation in body.creations:
            try:
                new.append(_binding(creation))
                results.append((ErrorCode.none, None))
            except (_Invalid, AclError) as exc:
                results.append((ErrorCode.invalid_request, str(exc)))

        def answer(error: str | None) -> Reply:
            outcome = results if error is None else [(ErrorCode.unknown_server_error, error)] * len(results)
            items = tuple(
                make(module.AclCreationResult, error_code=code, error_message=message)
                for code, message in outcome
            )
            return self._reply(request, results=items)

        if not new:
            return answer(None)
        return self._write(
            lambda current: (*current, *(b for b in dict.fromkeys(new) if b not in current)), answer
        )

    def delete(self, request: KafkaRequest, body: Any) -> Outcome:
        schema = response_schema(request.api_key, request.api_version)
        assert schema is not None
        module = sys.modules[schema.__module__]
        filters: list[Callable[[AclBinding], bool] | str] = []
        for f in body.filters:
            try:
                filters.append(_filter(f))
            except _Invalid as exc:
                filters.append(str(exc))
        removed: list[list[AclBinding]] = [[] for _ in filters]

        def change(current: tuple[AclBinding, ...]) -> tuple[AclBinding, ...]:
            for i, f in enumerate(filters):
                if not isinstance(f, str):
                    removed[i] = [b for b in current if f(b)]
            gone = {b for found in removed for b in found}
            return tuple(b for b in current if b not in gone)

        return self._write(change, lambda error: self._deleted(request, module, filters, removed, error))

    def _deleted(
        self,
        request: KafkaRequest,
        module: Any,
        filters: list[Callable[[AclBinding], bool] | str],
        removed: list[list[AclBinding]],
        error: str | None,
    ) -> Reply:
        results = []
        for f, found in zip(filters, removed, strict=True):
            if isinstance(f, str) or error is not None:
                code = ErrorCode.invalid_request if isinstance(f, str) else ErrorCode.unknown_server_error
                results.append(
                    make(
                        module.DeleteAclsFilterResult,
                        error_code=code,
                        error_message=f if isinstance(f, str) else error,
                        matching_acls=(),
                    )
                )
                continue
            matching = tuple(
                make(module.DeleteAclsMatchingAcl, error_code=ErrorCode.none, error_message=None, **_codes(b))
                for b in found
            )
            results.append(
                make(
                    module.DeleteAclsFilterResult,
                    error_code=ErrorCode.none,
                    error_message=None,
                    matching_acls=matching,
                )
            )
        return self._reply(request, filter_results=tuple(results))
