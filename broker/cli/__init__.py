"""The `broker` command: run a broker (`serve`), use one (`topics`, `produce`, `consume`, `stats`;
see client.py), manage its users and ACLs (`users`, `acls`; see security.py), move a
cluster's replicas (`reassign`), and inspect storage (`dump`, `demo`).

`serve` starts a broker; `dump` shows what is in a partition directory batch by batch, with anything
damaged named by file and position, without opening (or repairing) it; `demo` exercises the storage
engine alone.

Each group of subcommands is a module of this package holding its parsers and handlers: serve.py,
client.py, security.py, reassign.py, storage.py (`dump`, `demo`). This module builds the one parser
from them and dispatches (`python -m broker.cli` runs `main` through __main__.py).

A command parses with only its own group's module imported (`build_parser(command)`): the
groups' modules import what their handlers need, and `serve` must not pay for the client
library (client.py) at every broker start. Anything that parser refuses is parsed again by the
whole parser, so that every message and usage line is the whole command's, as `--help` is.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn, TypeAlias

from broker import __version__
from broker.node.logfmt import LOG_LEVELS, LogfmtFormatter
from broker.storage.errors import StorageError

CLIENT_COMMANDS = ("topics", "produce", "consume", "stats")

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def _serve(sub: Subparsers) -> None:
    from broker.cli.serve import add_serve_command  # noqa: PLC0415 - one group per command (module doc)

    add_serve_command(sub)


def _demo(sub: Subparsers) -> None:
    from broker.cli.storage import add_demo_command  # noqa: PLC0415

    add_demo_command(sub)


def _client(sub: Subparsers) -> None:
    from broker.cli.client import add_client_commands  # noqa: PLC0415

    add_client_commands(sub)


def _security(sub: Subparsers) -> None:
    from broker.cli.security import add_security_commands  # noqa: PLC0415

    add_security_commands(sub)


def _dump(sub: Subparsers) -> None:
    from broker.cli.storage import add_dump_command  # noqa: PLC0415

    add_dump_command(sub)


def _reassign(sub: Subparsers) -> None:
    from broker.cli.reassign import add_reassign_command  # noqa: PLC0415

    add_reassign_command(sub)


# The subcommands, in the order `broker --help` lists them: the commands each adder adds.
GROUPS: tuple[tuple[tuple[str, ...], Callable[[Subparsers], None]], ...] = (
    (("serve",), _serve),
    (("demo",), _demo),
    (CLIENT_COMMANDS, _client),
    (("users", "acls"), _security),
    (("dump",), _dump),
    (("reassign",), _reassign),
)


class _ParseAgain(Exception):
    """What a partial parser refused, for the whole parser to report (module doc)."""


class _QuietParser(argparse.ArgumentParser):
    """A parser that reports nothing itself: its errors are `_ParseAgain`."""

    def error(self, message: str) -> NoReturn:
        raise _ParseAgain(message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `broker` parser: every subcommand, or with `command` only those of its group."""
    parser_class = argparse.ArgumentParser if command is None else _QuietParser
    parser = parser_class(prog="broker", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS)
    parser.add_argument("--version", action="version", version=f"ringlog broker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands, add in GROUPS:
        if command is None or command in commands:
            add(sub)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names, if it names one (else None: the whole parser takes it)."""
    pre = _QuietParser(add_help=False)  # the top-level options, as the whole parser has them
    pre.add_argument("--log-level")
    pre.add_argument("-h", "--help", "--version", dest="whole", action="store_true")
    pre.add_argument("command", nargs="?")
    try:
        known, _ = pre.parse_known_args(argv)
    except _ParseAgain:
        return None
    if known.whole:  # before the command: the whole command's help or version
        return None
    if any(known.command in commands for commands, _ in GROUPS):
        return str(known.command)
    return None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_of(argv)
    if command is not None:
        try:
            return build_parser(command).parse_args(argv)
        except _ParseAgain:
            pass
    return build_parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    logging.basicConfig(level=args.log_level, handlers=[handler])
    if args.command in CLIENT_COMMANDS:
        from broker.cli.client import run_client_command  # noqa: PLC0415

        return run_client_command(args)
    try:
        return args.func(args)
    except StorageError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 1
