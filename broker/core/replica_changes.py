"""What a client may ask of a partition's replicas, in the core's words: where they are placed
(a manual assignment), who leads them (an election), where they move (a reassignment).

Rules this module keeps:
- Protocol neutral: replicas are node ids, never a protocol's broker ids (the Kafka adapter maps
  its broker ids, a core each, to nodes before it asks, and back when it answers).
- Each refusal is one `ReplicaRefused` whose `kind` names the wire error it becomes, so the rules
  that decide (broker/cluster/controller.py) and the adapters that answer agree on one list.
- A single node holds every partition on itself: an assignment or a reassignment there may name
  only this node, an election is never needed (broker/kafka/replicas.py answers so).
"""

from __future__ import annotations

from enum import Enum


class Election(Enum):
    """Kafka's election types (KIP-460): the preferred replica (the first of the assignment)
    when it is live and in sync, or, unclean, any live replica when no in-sync one is."""

    PREFERRED = 0
    UNCLEAN = 1


class ReplicaFault(Enum):
    """Why a change to a partition's replicas was not made."""

    NOT_NEEDED = "not needed"  # the election's outcome holds already
    NOT_AVAILABLE = "not available"  # no replica the election may choose is live (and in sync)
    NO_REASSIGNMENT = "no reassignment"  # a cancellation of a reassignment that is not under way
    ASSIGNMENT = "assignment"  # an assignment naming unknown nodes, one twice, or none
    UNKNOWN = "unknown"  # no such topic or partition


class ReplicaRefused(Exception):
    """A replica change that cannot be made; `kind` names the wire error it becomes."""

    def __init__(self, kind: ReplicaFault, message: str) -> None:
        super().__init__(message)
        self.kind = kind
