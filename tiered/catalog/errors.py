"""What the catalog raises. Callers catch these names, never a driver's exception class."""

from __future__ import annotations


class CatalogError(Exception):
    """Base class of every error the catalog raises on purpose."""


class CatalogUnavailable(CatalogError):
    """The database could not complete the call: connection lost, server restarting, lock wait timed out.

    The outcome of a write in flight is unknown (its COMMIT may or may not have landed). Every write function is
    safe to retry: repeating a transition that already happened is a no-op.
    """


class NotFound(CatalogError):
    """A row the call needs does not exist."""


class UnknownTopic(NotFound):
    def __init__(self, topic: str):
        super().__init__(f"unknown topic {topic!r}")
        self.topic = topic


class UnknownPartition(NotFound):
    def __init__(self, topic: str, partition: int):
        super().__init__(f"unknown partition {topic!r}/{partition}")
        self.topic = topic
        self.partition = partition


class UnknownBlock(NotFound):
    def __init__(self, block_id: int):
        super().__init__(f"unknown block {block_id}")
        self.block_id = block_id


class UnknownSegment(NotFound):
    def __init__(self, topic: str, partition: int, base_seq: int):
        super().__init__(f"unknown remote segment {topic!r}/{partition} base {base_seq}")
        self.topic = topic
        self.partition = partition
        self.base_seq = base_seq


class TopicExists(CatalogError):
    def __init__(self, topic: str):
        super().__init__(f"topic {topic!r} already exists")
        self.topic = topic


class StaleEpoch(CatalogError):
    """The caller no longer leads the partition: its epoch (or broker id) is not the partition's current one.

    `expected` is the epoch the caller holds, `actual` the partition's; `leader_broker` is the current leader.
    """

    def __init__(self, topic: str, partition: int, expected: int, actual: int, leader_broker: int | None = None):
        super().__init__(
            f"stale leader epoch for {topic!r}/{partition}: caller holds {expected}, "
            f"partition is at {actual} (leader broker {leader_broker})"
        )
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.actual = actual
        self.leader_broker = leader_broker


class Discontinuity(CatalogError):
    """A commit that does not continue the partition's committed seqs: its first run answers from `from_seq`, but
    the catalog's high-water mark is `hwmark`. Committing it would reuse seqs or leave some without a location."""

    def __init__(self, topic: str, partition: int, hwmark: int, from_seq: int):
        super().__init__(
            f"{topic!r}/{partition}: a run answering from seq {from_seq} does not continue the committed "
            f"high-water mark {hwmark}"
        )
        self.topic = topic
        self.partition = partition
        self.hwmark = hwmark
        self.from_seq = from_seq


class IllegalTransition(CatalogError):
    """A state change the transition table does not allow (see tiered.catalog.states)."""

    def __init__(self, kind: str, name: str, current: str, target: str):
        super().__init__(f"{kind} {name}: illegal transition {current} -> {target}")
        self.kind = kind
        self.name = name
        self.current = current
        self.target = target
