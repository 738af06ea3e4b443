"""Block and remote segment states, and their legal transitions as data.

Every state change in the catalog goes through `Transitions.check` (one row) or `Transitions.sources` (a bulk
UPDATE's `WHERE state IN (...)`), so the tables below are the whole truth about what may follow what.

Blocks (docs/architecture.md, data path steps 3 and 8):

    pending ──commit──> committed ──all runs pruned──> deleting ──swept──> (row deleted)
       └──────────abandoned (commit failed)─────────────^

Remote segments (Kafka's RemoteLogSegmentState; docs/architecture.md steps 5 and 7):

    COPY_STARTED ──> COPY_FINISHED ──> DELETE_STARTED ──> DELETE_FINISHED
      ^ │   ^  │                                ^                │
      │ └───┘  └────────────────────────────────┘                │
      │ re-upload after a crash      cleanup of a copy that will never finish
      └──────────────────────────────────────────────────────────┘
        a new copy of the base of a cleaned-up copy

COPY_STARTED -> COPY_STARTED is a real transition: a copier that crashed mid-upload records the new attempt (its
sizes, epoch, time). DELETE_FINISHED -> COPY_STARTED lets a later leader copy the base of a copy that was cleaned up
(tiered.tiering.segments.abandoned_copies); segment_copy_started allows it only for a row at or above the partition's first
available seq, which a segment remote retention deleted never is. Anywhere else, asking for the state a row is
already in is an idempotent retry (after CatalogUnavailable the caller cannot know whether its COMMIT landed): the
query function changes nothing and returns the row as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from tiered.catalog.errors import IllegalTransition


class BlockState(StrEnum):
    PENDING = "pending"
    COMMITTED = "committed"
    DELETING = "deleting"


class SegmentState(StrEnum):
    COPY_STARTED = "COPY_STARTED"
    COPY_FINISHED = "COPY_FINISHED"
    DELETE_STARTED = "DELETE_STARTED"
    DELETE_FINISHED = "DELETE_FINISHED"


@dataclass(frozen=True)
class Transitions:
    """One transition table: `allowed[current]` is the set of states `current` may move to."""

    kind: str
    allowed: Mapping[str, frozenset[str]]

    def check(self, current: str, target: str, name: str = "") -> None:
        """Raises IllegalTransition unless `current` -> `target` is allowed."""
        if target not in self.allowed.get(current, frozenset()):
            raise IllegalTransition(self.kind, name, str(current), str(target))

    def sources(self, target: str) -> list[str]:
        """The states that may move to `target`, sorted (for a bulk UPDATE's `WHERE state IN (...)`)."""
        return sorted(str(s) for s, allowed in self.allowed.items() if target in allowed)


BLOCK_TRANSITIONS = Transitions(
    "block",
    {
        BlockState.PENDING: frozenset({BlockState.COMMITTED, BlockState.DELETING}),
        BlockState.COMMITTED: frozenset({BlockState.DELETING}),
        BlockState.DELETING: frozenset(),
    },
)

SEGMENT_TRANSITIONS = Transitions(
    "remote segment",
    {
        SegmentState.COPY_STARTED: frozenset(
            {SegmentState.COPY_STARTED, SegmentState.COPY_FINISHED, SegmentState.DELETE_STARTED}
        ),
        SegmentState.COPY_FINISHED: frozenset({SegmentState.DELETE_STARTED}),
        SegmentState.DELETE_STARTED: frozenset({SegmentState.DELETE_FINISHED}),
        SegmentState.DELETE_FINISHED: frozenset({SegmentState.COPY_STARTED}),
    },
)
