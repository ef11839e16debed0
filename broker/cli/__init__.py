"""The `broker` command: run a broker (`serve`), use one (`topics`, `produce`, `consume`, `stats`;
see client.py), manage its users and ACLs (`users`, `acls`; see security.py), move a
cluster's replicas (`reassign`), and inspect storage (`dump`, `demo`).

`serve` starts a broker; `dump` shows what is in a partition directory batch by batch, with anything
damaged named by file and position, without opening (or repairing) it; `demo` exercises the storage
engine alone.

Each group of subcommands is a module of this package holding its parsers and handlers: serve.py,
client.py, security.py, reassign.py, storage.py (`dump`, `demo`). This module builds the one parser
from them and dispatches (`python -m broker.cli` runs `main` through __main__.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from broker import __version__
from broker.cli.client import add_client_commands, run_client_command
from broker.cli.reassign import add_reassign_command
from broker.cli.security import add_security_commands
from broker.cli.serve import LOG_LEVELS, add_serve_command
from broker.cli.storage import add_demo_command, add_dump_command
from broker.node.logfmt import LogfmtFormatter
from broker.storage.errors import StorageError

CLIENT_COMMANDS = ("topics", "produce", "consume", "stats")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="broker", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS)
    parser.add_argument("--version", action="version", version=f"ringlog broker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_command(sub)
    add_demo_command(sub)
    add_client_commands(sub)
    add_security_commands(sub)
    add_dump_command(sub)
    add_reassign_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    logging.basicConfig(level=args.log_level, handlers=[handler])
    if args.command in CLIENT_COMMANDS:
        return run_client_command(args)
    try:
        return args.func(args)
    except StorageError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 1
