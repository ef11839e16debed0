"""`broker users` and `broker acls`: the SCRAM credentials and ACLs in a data dir, or with `--etcd`
those of a cluster (docs/SECURITY.md).

They change the files the broker reads (broker/security/credentials.py), so they work whether or
not it runs: a running broker sees a change at its next authentication. A cluster's are in its
etcd (broker/cluster/security_docs.py), copied by every node into its files as they change. A
password is read from standard input (`--password-stdin`) or asked for on the terminal, never
taken from the command line, where `ps` and shell histories would show it.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

from broker.security.acls import CLUSTER_NAME, OPERATIONS, AclBinding, AclError, AclStore
from broker.security.credentials import (
    ITERATIONS_DEFAULT,
    SCRAM_MECHANISMS,
    CredentialError,
    CredentialStore,
    check_user_name,
)
from broker.security.watched import Documents


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    if not sys.stdin.isatty():
        raise CredentialError("no terminal to ask for the password on: use --password-stdin")
    first = getpass.getpass(f"password for {args.name}: ")
    if getpass.getpass("again: ") != first:
        raise CredentialError("the two passwords differ")
    return first


S = TypeVar("S")


@contextlib.contextmanager
def _documents(args: argparse.Namespace) -> Iterator[Documents | None]:
    """The cluster's documents with --etcd (None: the data dir's files)."""
    if not args.etcd:
        yield None
        return
    # the etcd client, for these commands only
    from broker.cluster.records import Keys  # noqa: PLC0415
    from broker.cluster.security_docs import EtcdDocuments  # noqa: PLC0415
    from broker.cluster.store import EtcdStore  # noqa: PLC0415

    store = EtcdStore([e.strip() for e in args.etcd.split(",") if e.strip()])
    try:
        yield EtcdDocuments(store, Keys(args.cluster_name))
    finally:
        store.close()


def _on_store(
    args: argparse.Namespace,
    command: str,
    open_store: Callable[[str, Documents | None], S],
    act: Callable[[argparse.Namespace, S], int],
) -> int:
    """`act` on the data dir's store, or the cluster's with --etcd. What cannot be read or
    changed ends the command with its message: the store's errors, a file's (also a node's copy
    of its cluster's documents, which is not changed in place: broker/security/watched.py)."""
    os.umask(0o077)  # the security dir and its files are private (0700, 0600), as serve's
    errors: tuple[type[Exception], ...] = (OSError,)
    if args.etcd:
        from broker.cluster.store import StoreError  # noqa: PLC0415

        errors = (StoreError, OSError)
    try:
        with _documents(args) as documents:
            return act(args, open_store(args.data_dir, documents))
    except errors as exc:
        print(f"broker {command}: {exc}", file=sys.stderr)
        return 1


def cmd_users(args: argparse.Namespace) -> int:
    return _on_store(args, "users", CredentialStore, _users)


def _users(args: argparse.Namespace, store: CredentialStore) -> int:
    try:
        if args.action == "add":
            mechanisms = tuple(args.mechanism or SCRAM_MECHANISMS)
            check_user_name(args.name)  # before asking for a password
            store.add(args.name, _password(args), mechanisms, args.iterations)
            print(f"user {args.name}: {', '.join(mechanisms)} credentials stored in {store.path}")
        elif args.action == "remove":
            store.remove(args.name)
            print(f"user {args.name} removed")
        else:
            for name, mechanisms in store.users().items():
                print(f"{name}\t{','.join(mechanisms)}")
    except CredentialError as exc:
        print(f"broker users: {exc}", file=sys.stderr)
        return 2
    return 0


def add_security_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    users = sub.add_parser("users", help="add, remove or list the users SASL authenticates (SCRAM)")
    actions = users.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="add a user or change its password")
    add.add_argument("name")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add.add_argument(
        "--mechanism",
        action="append",
        choices=SCRAM_MECHANISMS,
        help="credentials for this mechanism only (repeatable; default both)",
    )
    add.add_argument("--iterations", type=int, default=ITERATIONS_DEFAULT, help="PBKDF2 iterations")
    remove = actions.add_parser("remove", help="remove a user")
    remove.add_argument("name")
    actions.add_parser("list", help="list the users and their mechanisms (never a credential)")
    for p in actions.choices.values():
        _where(p)
    users.set_defaults(func=cmd_users)
    add_acl_commands(sub)


def _binding(args: argparse.Namespace) -> AclBinding:
    rtype, sep, name = args.resource.partition(":")
    if not sep:
        raise AclError(
            f"resource {args.resource!r}: write it topic:NAME, group:NAME or cluster:{CLUSTER_NAME}"
        )
    return AclBinding(
        args.principal, rtype, name, args.operation, "deny" if args.deny else "allow", args.pattern
    ).check()


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default="./data", help="the broker's data dir (default ./data)")
    p.add_argument(
        "--etcd",
        default="",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="a cluster's instead: its etcd (every node copies them; --data-dir is not used)",
    )
    p.add_argument("--cluster-name", default="ringlog", help="the cluster's name in etcd (with --etcd)")


def cmd_acls(args: argparse.Namespace) -> int:
    return _on_store(args, "acls", AclStore, _acls)


def _acls(args: argparse.Namespace, store: AclStore) -> int:
    try:
        if args.action == "add":
            b = _binding(args)
            print(f"added: {b}" if store.add(b) else f"already there: {b}")
        elif args.action == "remove":
            b = _binding(args)
            store.remove(b)
            print(f"removed: {b}")
        else:
            for b in store.bindings():
                print(b)
    except AclError as exc:
        print(f"broker acls: {exc}", file=sys.stderr)
        return 2
    return 0


def add_acl_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acls = sub.add_parser("acls", help="add, remove or list ACLs (who may do what to which resource)")
    actions = acls.add_subparsers(dest="action", required=True)
    for action in ("add", "remove"):
        p = actions.add_parser(action, help=f"{action} one ACL")
        p.add_argument("principal", help="User:NAME, or User:* for everyone")
        p.add_argument("operation", choices=OPERATIONS)
        p.add_argument("resource", help=f"topic:NAME, group:NAME or cluster:{CLUSTER_NAME} (NAME * for all)")
        p.add_argument(
            "--prefixed", dest="pattern", action="store_const", const="prefixed", default="literal"
        )
        p.add_argument("--deny", action="store_true", help="a deny (wins over every allow)")
    actions.add_parser("list", help="list every ACL")
    for p in actions.choices.values():
        _where(p)
    acls.set_defaults(func=cmd_acls)
