"""Partitions: leadership (broker and epoch), first available seq, high-water mark, remote bytes.

Lock order: any transaction that locks several partitions rows locks them with `lock_partitions`, in
(topic, partition) order, and before any blocks or segments row. Two brokers' commits touching overlapping
partitions therefore queue instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, and_, or_, select, update

from tiered.catalog.engine import Catalog
from tiered.catalog.errors import UnknownPartition
from tiered.catalog.models import Partition


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    leader_broker: int | None
    leader_epoch: int
    first_available_seq: int  # 0: nothing stored yet
    hwmark_seq: int  # highest committed seq; 0: none
    remote_bytes: int


_COLUMNS = (
    Partition.topic,
    Partition.partition,
    Partition.leader_broker,
    Partition.leader_epoch,
    Partition.first_available_seq,
    Partition.hwmark_seq,
    Partition.remote_bytes,
)


def lock_partitions(conn: Connection, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], PartitionState]:
    """Locks the partitions rows of `keys` in (topic, partition) order (FOR UPDATE on PostgreSQL; the SQLite write
    transaction already holds the database) and returns them. Raises UnknownPartition for a missing one."""
    wanted = sorted(set(keys))
    by_topic: dict[str, list[int]] = {}
    for topic, partition in wanted:
        by_topic.setdefault(topic, []).append(partition)
    # One `topic = ? AND partition IN (...)` per topic: both planners turn each into primary key probes (SQLite
    # does not for a row-value IN list).
    rows = conn.execute(
        select(*_COLUMNS)
        .where(or_(*(and_(Partition.topic == t, Partition.partition.in_(ps)) for t, ps in by_topic.items())))
        .order_by(Partition.topic, Partition.partition)
        .with_for_update()
    )
    states = {(r.topic, r.partition): PartitionState(*r) for r in rows}
    for key in wanted:
        if key not in states:
            raise UnknownPartition(*key)
    return states


def claim_partitions(cat: Catalog, broker_id: int, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """Makes `broker_id` the leader of the partitions: bumps each one's epoch. Returns {partition: new epoch}.

    A claim always wins; whatever the previous leader still writes under its old epoch is refused from now on
    (StaleEpoch). Raises UnknownPartition, changing nothing, if any partition does not exist.
    """
    numbers = sorted(set(partitions))
    if not numbers:
        return {}
    with cat.write() as conn:
        states = lock_partitions(conn, ((topic, p) for p in numbers))
        conn.execute(
            update(Partition)
            .where(Partition.topic == topic, Partition.partition.in_(numbers))
            .values(leader_broker=broker_id, leader_epoch=Partition.leader_epoch + 1)
        )
    return {p: states[(topic, p)].leader_epoch + 1 for p in numbers}


def get_partition_states(cat: Catalog, topic: str | None = None) -> list[PartitionState]:
    """Every partition (of `topic`, or of all topics), in (topic, partition) order."""
    query = select(*_COLUMNS).order_by(Partition.topic, Partition.partition)
    if topic is not None:
        query = query.where(Partition.topic == topic)
    with cat.read() as conn:
        return [PartitionState(*r) for r in conn.execute(query)]


def set_first_available(cat: Catalog, topic: str, partition: int, seq: int) -> int:
    """Raises the partition's first available seq to `seq` (retention moves it forward, never back).

    Returns the first available seq now in force. Raises UnknownPartition.
    """
    with cat.write() as conn:
        state = lock_partitions(conn, [(topic, partition)])[(topic, partition)]
        if seq <= state.first_available_seq:
            return state.first_available_seq
        conn.execute(
            update(Partition)
            .where(Partition.topic == topic, Partition.partition == partition)
            .values(first_available_seq=seq)
        )
    return seq
