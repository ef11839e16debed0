"""A worker process's entry point, as the supervisor starts it (broker/node/supervisor.py):
`python -m broker.node.worker_process --spec JSON`, which runs broker/node/worker.py's `main`.

Why a module of its own: kio, whose Kafka protocol schemas the worker's Kafka adapter uses,
imports hypothesis whenever it is installed, to register test strategies for its types, which a
broker never uses. Where the test dependencies are installed (the venv `make` builds) that was
0.14 s of a worker's 0.53 s of imports, at every start and restart of every core. Here, before
anything imports kio, hypothesis is marked absent for this process only (a None entry in
`sys.modules` makes its import fail, which kio expects); broker/node/worker.py stays importable
as it is, by tests that use hypothesis themselves.
"""

from __future__ import annotations

import sys


def run() -> int:
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    from broker.node.worker import main  # noqa: PLC0415 - after the line above, on purpose

    return main()


if __name__ == "__main__":
    sys.exit(run())
