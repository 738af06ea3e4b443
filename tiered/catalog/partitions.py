"""Partitions: leadership (broker and epoch), first available seq, high-water mark, remote bytes.

Lock order: any transaction that locks several partitions rows locks them with `lock_partitions`, in
(topic, partition) order, and before any blocks or segments row. Two brokers' commits touching overlapping
partitions therefore queue instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, bindparam, select, update

from tiered.catalog.arrays import RowSource, statement
from tiered.catalog.changes import take_version
from tiered.catalog.engine import Catalog, utcnow
from tiered.catalog.errors import UnknownPartition
from tiered.catalog.models import PartitionEpochModel, PartitionModel, UtcDateTime

# Statements that name many partitions are sent in batches of this many: well under PostgreSQL's 65,535 bind
# parameters and SQLite's 32,766, with room for the other parameters of a statement.
BATCH = 500


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
    PartitionModel.topic,
    PartitionModel.partition,
    PartitionModel.leader_broker,
    PartitionModel.leader_epoch,
    PartitionModel.first_available_seq,
    PartitionModel.hwmark_seq,
    PartitionModel.remote_bytes,
)


# The partitions a statement names, as one bound value (tiered.catalog.arrays).
KEYS = RowSource("k", (("topic", "text"), ("partition", "integer")))
# lock_partitions' one statement, whatever the number of partitions. PostgreSQL: each row given probes the primary key
# and locks what it finds, in the order given (sorted): the locking sub-SELECT is never flattened into a join, so no
# plan can turn the probes into a scan of every partition (a hash join, on a table without statistics). SQLite's
# write transaction already holds the database.
_LOCK = {
    "postgresql": """SELECT p.topic, p."partition", p.leader_broker, p.leader_epoch, p.first_available_seq, p.hwmark_seq,
       p.remote_bytes
FROM {k} CROSS JOIN LATERAL (SELECT * FROM partitions WHERE topic = k.topic AND "partition" = k."partition"
                             FOR UPDATE) AS p
""",
    "sqlite": """SELECT p.topic, p."partition", p.leader_broker, p.leader_epoch, p.first_available_seq, p.hwmark_seq,
       p.remote_bytes
FROM {k} JOIN partitions AS p ON p.topic = k.topic AND p."partition" = k."partition"
""",
}


# claim_leadership's rows: each partition claimed, with its new epoch and the seq that epoch starts at.
CLAIMED = RowSource("c", (("partition", "integer"), ("leader_epoch", "bigint"), ("start_seq", "bigint")))
_CLAIM = """UPDATE partitions AS p SET leader_broker = :broker_id, leader_epoch = c.leader_epoch, handover_to = NULL,
  change_version = :version
FROM {c} WHERE p.topic = :topic AND p."partition" = c."partition"
"""
_RECORD_CLAIMS = """INSERT INTO partition_epochs (topic, "partition", leader_epoch, broker_id, disk_id, start_seq, claimed_at)
SELECT :topic, c."partition", c.leader_epoch, :broker_id, :disk_id, c.start_seq, :claimed_at FROM {c}
"""


@dataclass(frozen=True, slots=True)
class EpochRow:
    """One claim of a partition (tiered.catalog.models.PartitionEpoch)."""

    leader_epoch: int
    broker_id: int
    disk_id: str
    start_seq: int  # the catalog's high-water mark + 1 when the epoch began


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim returns, read in the claim's own transaction: the partition as it was just before, the new
    epoch, and the history since the epoch the caller asked about."""

    before: PartitionState
    epoch: int
    history: tuple[EpochRow, ...]  # epochs above the caller's `since`, oldest first, the new one last


def lock_partitions(conn: Connection, keys: Iterable[tuple[str, int]], *,
                    missing_ok: bool = False) -> dict[tuple[str, int], PartitionState]:
    """Locks the partitions rows of `keys` in (topic, partition) order (FOR UPDATE on PostgreSQL; the SQLite write
    transaction already holds the database) and returns them, in one statement whatever their number. Raises
    UnknownPartition for a missing one, unless `missing_ok` (then it is left out)."""
    wanted = sorted(set(keys))
    backend = conn.dialect.name
    rows = conn.execute(statement(backend, _LOCK[backend], KEYS), KEYS.params(wanted))
    states = {(r[0], r[1]): PartitionState(*r) for r in rows}
    if len(states) != len(wanted) and not missing_ok:
        raise UnknownPartition(*next(key for key in wanted if key not in states))
    return states


def claim_leadership(
    cat: Catalog,
    broker_id: int,
    disk_id: str,
    topic: str,
    since: Mapping[int, int | None],
    *,
    expected_epochs: Mapping[int, int] | None = None,
    now: datetime | None = None,
) -> dict[int, Claim]:
    """Makes `broker_id` (serving from volume `disk_id`) the leader of the partitions `since` names: bumps each
    one's epoch, makes it the assigned leader and records the claim in partition_epochs with start_seq = high-water
    mark + 1, all in one transaction. `since[p]` is the epoch the caller's disk last applied for p (None: unknown);
    the history above it comes back with the claim. Returns {partition: Claim}.

    Without `expected_epochs` a claim always wins. With it, a partition is claimed only if its epoch is still the
    one expected (compare-and-set: two brokers deciding at once cannot both take it); the others are left out of
    the answer. Whatever the previous leader still writes under its old epoch is refused from now on (StaleEpoch).
    Raises UnknownPartition, changing nothing, if any partition does not exist.
    """
    if not since:
        return {}
    claimed_at = utcnow(now)
    claims: dict[int, Claim] = {}
    with cat.write() as conn:
        states = lock_partitions(conn, ((topic, p) for p in since))
        numbers = sorted(p for p in since if expected_epochs is None or p not in expected_epochs
                         or states[(topic, p)].leader_epoch == expected_epochs[p])
        backend = conn.dialect.name
        rows = [(p, states[(topic, p)].leader_epoch + 1, states[(topic, p)].hwmark_seq + 1) for p in numbers]
        if numbers:
            conn.execute(statement(backend, _RECORD_CLAIMS, CLAIMED).bindparams(bindparam("claimed_at", type_=UtcDateTime())),
                         {"topic": topic, "broker_id": broker_id, "disk_id": disk_id, "claimed_at": claimed_at,
                          **CLAIMED.params(rows)})
        history = _history(conn, topic, {p: e for p, e in since.items() if e is not None and p in numbers})
        if numbers:
            # Last: the version holds the counter row until the commit (tiered.catalog.changes).
            conn.execute(statement(backend, _CLAIM, CLAIMED),
                         {"topic": topic, "broker_id": broker_id, "version": take_version(conn),
                          **CLAIMED.params(rows)})
        for p in numbers:
            before = states[(topic, p)]
            claims[p] = Claim(before, before.leader_epoch + 1, tuple(history.get(p, ())))
    return claims


def _history(conn: Connection, topic: str, since: Mapping[int, int]) -> dict[int, list[EpochRow]]:
    """The claims of each partition above its `since` epoch, oldest first."""
    out: dict[int, list[EpochRow]] = {}
    numbers = sorted(since)
    for start in range(0, len(numbers), BATCH):
        chunk = numbers[start : start + BATCH]
        low = min(since[p] for p in chunk)
        rows = conn.execute(
            select(PartitionEpochModel.partition, PartitionEpochModel.leader_epoch, PartitionEpochModel.broker_id,
                   PartitionEpochModel.disk_id, PartitionEpochModel.start_seq)
            .where(PartitionEpochModel.topic == topic, PartitionEpochModel.partition.in_(chunk),
                   PartitionEpochModel.leader_epoch > low)
            .order_by(PartitionEpochModel.partition, PartitionEpochModel.leader_epoch)
        )
        for partition, *row in rows:
            if row[0] > since[partition]:
                out.setdefault(partition, []).append(EpochRow(*row))
    return out


def claim_partitions(cat: Catalog, broker_id: int, topic: str, partitions: Iterable[int], *,
                     disk_id: str = "") -> dict[int, int]:
    """claim_leadership without history: returns {partition: new epoch}."""
    claims = claim_leadership(cat, broker_id, disk_id, topic, {p: None for p in partitions})
    return {p: claim.epoch for p, claim in claims.items()}


def get_partition_states(cat: Catalog, topic: str | None = None) -> list[PartitionState]:
    """Every partition (of `topic`, or of all topics), in (topic, partition) order."""
    query = select(*_COLUMNS).order_by(PartitionModel.topic, PartitionModel.partition)
    if topic is not None:
        query = query.where(PartitionModel.topic == topic)
    with cat.read() as conn:
        return [PartitionState(*r) for r in conn.execute(query)]


def get_partition_state(cat: Catalog, topic: str, partition: int) -> PartitionState | None:
    """One partition, by its primary key (None if it does not exist): for a caller that wants one partition of a
    topic, so that its cost does not grow with the topic's partitions."""
    with cat.read() as conn:
        row = conn.execute(
            select(*_COLUMNS).where(PartitionModel.topic == topic, PartitionModel.partition == partition)
        ).first()
    return PartitionState(*row) if row else None


def set_first_available(cat: Catalog, topic: str, partition: int, seq: int) -> int:
    """Raises the partition's first available seq to `seq` (retention moves it forward, never back).

    Returns the first available seq now in force. Raises UnknownPartition.
    """
    with cat.write() as conn:
        state = lock_partitions(conn, [(topic, partition)])[(topic, partition)]
        if seq <= state.first_available_seq:
            return state.first_available_seq
        conn.execute(
            update(PartitionModel)
            .where(PartitionModel.topic == topic, PartitionModel.partition == partition)
            .values(first_available_seq=seq)
        )
    return seq
