"""Remote segments: the copy (COPY_STARTED before the upload, COPY_FINISHED after), lookups by seq, remote
retention and deletion (DELETE_STARTED before deleting the objects, DELETE_FINISHED after).

Transitions follow tiered.catalog.states.SEGMENT_TRANSITIONS. A copy is fenced by the leader epoch: a broker that
lost the partition cannot record a copy of its (possibly diverged) segment. Only COPY_FINISHED segments are
readable, and only they count in partitions.remote_bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Sequence

from sqlalchemy import ColumnElement, Connection, and_, bindparam, insert, literal_column, or_, select, union, update

from tiered.catalog.blocks import DEFAULT_DELETE_GRACE, PruneResult, expand_pending_of, prune_runs_in
from tiered.catalog.engine import Catalog, inline_limit, utcnow
from tiered.catalog.errors import IllegalTransition, StaleEpoch, UnknownSegment
from tiered.catalog.models import BlockRunModel, PartitionModel, SegmentModel
from tiered.catalog.partitions import PartitionState, lock_partitions
from tiered.catalog.states import SEGMENT_TRANSITIONS, SegmentState


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    """What the copier knows of a sealed segment before uploading it."""

    topic: str
    partition: int
    base_seq: int
    last_seq: int
    object_key: str
    index_object_key: str
    size_bytes: int
    index_size_bytes: int
    min_ts_ms: int
    max_ts_ms: int
    freeze_ts: datetime  # TANK's freezeTS (the .ilog name's last field) as a UTC datetime
    leader_epoch: int  # the epoch the copying broker holds


@dataclass(frozen=True, slots=True)
class SegmentRow(SegmentMeta):
    state: str
    updated_at: datetime
    from_seq: int  # the first seq it answers for (set when the copy finishes; base_seq until then)

    @property
    def total_bytes(self) -> int:
        return self.size_bytes + self.index_size_bytes

    def holds(self, seq: int) -> bool:
        return self.from_seq <= seq <= self.last_seq


_COLUMNS = tuple(getattr(SegmentModel, f.name) for f in fields(SegmentRow))
# Spelled as a literal, like ix_segments_lookup's predicate, so that the planners match the partial index.
_READABLE = SegmentModel.state == literal_column(f"'{SegmentState.COPY_FINISHED}'")


def _state_in(states: tuple[str, ...]):
    """`state` among `states`, spelled with literals (like _READABLE) so that a single state matches the partial
    index on it: ix_segments_lookup for COPY_FINISHED, ix_segments_delete_started for DELETE_STARTED. Each state
    is checked to be a SegmentState first, so nothing but those names reaches the SQL text."""
    names = [literal_column(f"'{SegmentState(s)}'") for s in states]
    return SegmentModel.state == names[0] if len(names) == 1 else SegmentModel.state.in_(names)


def _key(topic: str, partition: int, base_seq: int):
    return and_(SegmentModel.topic == topic, SegmentModel.partition == partition, SegmentModel.base_seq == base_seq)


def _locked_row(conn: Connection, topic: str, partition: int, base_seq: int) -> SegmentRow | None:
    row = conn.execute(select(*_COLUMNS).where(_key(topic, partition, base_seq)).with_for_update()).first()
    return SegmentRow(*row) if row else None


def _move(conn: Connection, row: SegmentRow, target: SegmentState, now: datetime | None) -> SegmentRow:
    SEGMENT_TRANSITIONS.check(row.state, target, f"{row.topic}/{row.partition} base {row.base_seq}")
    updated_at = utcnow(now)
    conn.execute(
        update(SegmentModel)
        .where(_key(row.topic, row.partition, row.base_seq))
        .values(state=target, updated_at=updated_at)
    )
    return replace(row, state=str(target), updated_at=updated_at)


def _add_remote_bytes(conn: Connection, topic: str, partition: int, delta: int) -> None:
    conn.execute(
        update(PartitionModel)
        .where(PartitionModel.topic == topic, PartitionModel.partition == partition)
        .values(remote_bytes=PartitionModel.remote_bytes + delta)
    )


def _lock_partition(conn: Connection, topic: str, partition: int) -> PartitionState:
    """Locks the partition row first (the catalog's lock order: partition, then segment)."""
    return lock_partitions(conn, [(topic, partition)])[(topic, partition)]


def _check_epoch(state: PartitionState, leader_epoch: int) -> None:
    if state.leader_epoch != leader_epoch:
        raise StaleEpoch(state.topic, state.partition, leader_epoch, state.leader_epoch, state.leader_broker)


def segment_copy_started(cat: Catalog, meta: SegmentMeta, *, now: datetime | None = None) -> SegmentRow:
    """Records a copy about to start (before the upload). A crashed copy's retry overwrites its COPY_STARTED row
    with the new attempt, and so does a copy of the base of a cleaned-up copy (a DELETE_FINISHED row at or above the
    first available seq: its objects are gone). Raises StaleEpoch if `meta.leader_epoch` is not the partition's
    epoch, and IllegalTransition if the segment is further along, mid-deletion, or deleted by remote retention."""
    row = SegmentRow(**asdict(meta), state=str(SegmentState.COPY_STARTED), updated_at=utcnow(now),
                     from_seq=meta.base_seq)
    name = f"{meta.topic}/{meta.partition} base {meta.base_seq}"
    with cat.write() as conn:
        state = _lock_partition(conn, meta.topic, meta.partition)
        _check_epoch(state, meta.leader_epoch)
        existing = _locked_row(conn, meta.topic, meta.partition, meta.base_seq)
        if existing is None:
            conn.execute(insert(SegmentModel).values(**asdict(row)))
        else:
            if existing.state == SegmentState.DELETE_FINISHED and existing.last_seq < state.first_available_seq:
                # Remote retention moves the first available seq past a segment before deleting it: these seqs
                # are gone from the partition, and copying them again would bring back what retention expired.
                raise IllegalTransition(SEGMENT_TRANSITIONS.kind, name, existing.state, str(SegmentState.COPY_STARTED))
            SEGMENT_TRANSITIONS.check(existing.state, SegmentState.COPY_STARTED, name)
            conn.execute(update(SegmentModel).where(_key(meta.topic, meta.partition, meta.base_seq)).values(**asdict(row)))
    return row


@dataclass(frozen=True, slots=True)
class CopyFinished:
    segment: SegmentRow
    pruned: PruneResult  # the block runs the segment now answers for, deleted in the same transaction


def segment_copy_finished(
    cat: Catalog, topic: str, partition: int, base_seq: int, leader_epoch: int, *,
    grace: timedelta = DEFAULT_DELETE_GRACE, now: datetime | None = None,
) -> CopyFinished:
    """Records a finished copy (after both objects are uploaded), in one transaction: the segment becomes readable
    and counts in the partition's remote_bytes; it answers from the from_seq of the block run that held its first
    record (a jump in seqs before its base is its own), else from its base; and the block runs that lie wholly
    inside what it answers for are pruned (tiered.catalog.blocks.prune_runs_in), so no seq ever has two locations
    and none is left without one. Raises StaleEpoch, UnknownSegment, IllegalTransition; a retry is a no-op."""
    with cat.write() as conn:
        state = _lock_partition(conn, topic, partition)
        row = _locked_row(conn, topic, partition, base_seq)
        if row is None:
            raise UnknownSegment(topic, partition, base_seq)
        if row.state == SegmentState.COPY_FINISHED:
            return CopyFinished(row, PruneResult(0, 0))
        _check_epoch(state, leader_epoch)
        # The run holding the base may be unexpanded: expanded first, so that it is read here and pruned below.
        expand_pending_of(conn, topic, partition, base_seq, row.last_seq)
        first_run = conn.execute(
            select(BlockRunModel.from_seq, BlockRunModel.first_seq)
            .where(BlockRunModel.topic == topic, BlockRunModel.partition == partition, BlockRunModel.last_seq >= base_seq)
            .order_by(BlockRunModel.last_seq)
            .limit(1)
        ).first()
        from_seq = first_run.from_seq if first_run is not None and first_run.first_seq == base_seq else base_seq
        row = _move(conn, row, SegmentState.COPY_FINISHED, now)
        conn.execute(update(SegmentModel).where(_key(topic, partition, base_seq)).values(from_seq=from_seq))
        row = replace(row, from_seq=from_seq)
        _add_remote_bytes(conn, topic, partition, row.total_bytes)
        pruned = prune_runs_in(conn, topic, partition, from_seq, row.last_seq, grace=grace, now=now)
    return CopyFinished(row, pruned)


def segment_delete_started(
    cat: Catalog, topic: str, partition: int, base_seq: int, *, now: datetime | None = None
) -> SegmentRow:
    """Records a deletion about to start (before deleting the objects): the segment stops being readable and
    stops counting in remote_bytes. Call set_first_available past it first when it is the oldest. A retry is a
    no-op."""
    with cat.write() as conn:
        _lock_partition(conn, topic, partition)  # remote_bytes changes below
        row = _locked_row(conn, topic, partition, base_seq)
        if row is None:
            raise UnknownSegment(topic, partition, base_seq)
        if row.state == SegmentState.DELETE_STARTED:
            return row
        was_counted = row.state == SegmentState.COPY_FINISHED
        row = _move(conn, row, SegmentState.DELETE_STARTED, now)
        if was_counted:
            _add_remote_bytes(conn, topic, partition, -row.total_bytes)
    return row


def segment_copy_abandoned(
    cat: Catalog, topic: str, partition: int, base_seq: int, leader_epoch: int, *, older_than: datetime,
    now: datetime | None = None,
) -> SegmentRow | None:
    """Starts the deletion of a copy that can never finish (tiered.tiering.segments.abandoned_copies): COPY_STARTED ->
    DELETE_STARTED, before its objects are deleted. The caller must lead the partition at `leader_epoch` (else
    StaleEpoch); the row must have been started under an older epoch (its copy_finished would be refused) and last
    touched before `older_than`. Once DELETE_STARTED, no copy of the base can start until the deletion finished, so
    the objects deleted are never a new copy's. Returns None, changing nothing, for a row that is not such a copy
    (finished, started again under the current epoch, too young, or gone); a retry returns the DELETE_STARTED row."""
    with cat.write() as conn:
        _check_epoch(_lock_partition(conn, topic, partition), leader_epoch)
        row = _locked_row(conn, topic, partition, base_seq)
        if row is not None and row.state == SegmentState.DELETE_STARTED:
            return row
        abandoned = (
            row is not None and row.state == SegmentState.COPY_STARTED and row.leader_epoch < leader_epoch
            and row.updated_at <= older_than
        )  # fmt: skip
        if row is None or not abandoned:
            return None
        return _move(conn, row, SegmentState.DELETE_STARTED, now)


def segment_delete_finished(
    cat: Catalog, topic: str, partition: int, base_seq: int, *, now: datetime | None = None
) -> SegmentRow:
    """Records that both objects are gone. A retry is a no-op."""
    with cat.write() as conn:
        row = _locked_row(conn, topic, partition, base_seq)
        if row is None:
            raise UnknownSegment(topic, partition, base_seq)
        if row.state == SegmentState.DELETE_FINISHED:
            return row
        return _move(conn, row, SegmentState.DELETE_FINISHED, now)


def get_segment(cat: Catalog, topic: str, partition: int, base_seq: int) -> SegmentRow | None:
    with cat.read() as conn:
        row = conn.execute(select(*_COLUMNS).where(_key(topic, partition, base_seq))).first()
    return SegmentRow(*row) if row else None


def find_remote_segment(cat: Catalog, topic: str, partition: int, seq: int) -> SegmentRow | None:
    """The readable (COPY_FINISHED) remote segment with the smallest last_seq >= seq: the one that holds `seq`
    when `holds(seq)` says so. None when none reaches `seq`. One index probe."""
    rows = readable_segments_from(cat, topic, partition, seq, 1)
    return rows[0] if rows else None


def readable_segments_from(cat: Catalog, topic: str, partition: int, seq: int, limit: int) -> list[SegmentRow]:
    """Up to `limit` readable (COPY_FINISHED) segments with last_seq >= seq, in seq order: the one holding `seq`
    and those after it. One index range scan (ix_segments_lookup).

    Page by passing the last row's last_seq + 1. Keyed by seq, not by base_seq, so that a compaction swap between
    two pages cannot hide seqs: its new segments start at (or before) the first seq of the group they replace,
    which may be a base_seq the previous page already passed, but they end where that group ended, so the next
    page, from the seq after the last one listed, finds them."""
    with cat.read() as conn:
        rows = conn.execute(_readable_from(limit), {"l_topic": topic, "l_partition": partition, "l_seq": seq})
        return [SegmentRow(*r) for r in rows]


@cache
def _readable_from(limit: int):
    # Built once per limit (callers use a few): building the query per lookup cost about as much of the caller's CPU
    # as executing it.
    return (
        select(*_COLUMNS)
        .where(SegmentModel.topic == bindparam("l_topic"), SegmentModel.partition == bindparam("l_partition"),
               SegmentModel.last_seq >= bindparam("l_seq"))
        .where(_READABLE)
        .order_by(SegmentModel.last_seq)
        .limit(inline_limit(limit))
    )


def list_segments(
    cat: Catalog,
    topic: str,
    partition: int,
    *,
    states: tuple[str, ...] | None = None,
    after_base_seq: int = 0,
    limit: int = 1000,
) -> list[SegmentRow]:
    """Up to `limit` segments with base_seq > after_base_seq, in seq order, optionally only in `states`.
    Page by passing the last row's base_seq as `after_base_seq`. With `states=(DELETE_STARTED,)` (remote
    retention's unfinished deletions) one scan of ix_segments_delete_started, however many segments were deleted.
    Raises ValueError for a state that is not a SegmentState."""
    query = (
        select(*_COLUMNS)
        .where(SegmentModel.topic == topic, SegmentModel.partition == partition, SegmentModel.base_seq > after_base_seq)
        .order_by(SegmentModel.base_seq)
        .limit(inline_limit(limit))
    )
    if states is not None:
        if not states:
            return []
        query = query.where(_state_in(tuple(states)))
    with cat.read() as conn:
        return [SegmentRow(*r) for r in conn.execute(query)]


def partitions_mid_deletion(cat: Catalog) -> set[tuple[str, int]]:
    """The partitions holding a segment in DELETE_STARTED (a deletion an interrupted pass left): one scan of
    ix_segments_delete_started, which holds only the rows mid-deletion, so a periodic pass over every led partition
    costs what is left to finish, not how many partitions exist."""
    with cat.read() as conn:
        rows = conn.execute(
            select(SegmentModel.topic, SegmentModel.partition)
            .where(_state_in((SegmentState.DELETE_STARTED,)))
            .distinct()
        )
        return {(topic, partition) for topic, partition in rows}


def partitions_with_stale_copies(cat: Catalog, *, older_than: datetime) -> set[tuple[str, int]]:
    """The partitions holding a COPY_STARTED row last touched at or before `older_than` (candidates for the cleanup
    of abandoned copies, tiered.tiering.segments.abandoned_copies, which checks each row again): one scan of
    ix_segments_copy_started, which holds only the copies in flight or abandoned."""
    with cat.read() as conn:
        rows = conn.execute(
            select(SegmentModel.topic, SegmentModel.partition)
            .where(_state_in((SegmentState.COPY_STARTED,)), SegmentModel.updated_at <= older_than)
            .distinct()
        )
        return {(topic, partition) for topic, partition in rows}


@dataclass(frozen=True, slots=True)
class RetentionLimits:
    """The remote retention of some topics, for partitions_due_for_retention: None disables a limit."""

    topics: tuple[str, ...]
    max_age: timedelta | None
    max_bytes: int | None


# Subselects per statement: a broker leading topics of many different retentions sends a few statements, each
# bounded.
_DUE_SELECTS = 32


def partitions_due_for_retention(
    cat: Catalog, limits: Sequence[RetentionLimits], *, now: datetime, after: tuple[str, int] | None = None,
    limit: int = 500,
) -> list[tuple[str, int]]:
    """Up to `limit` partitions of the topics in `limits`, past `after` in (topic, partition) order, that remote
    retention may expire something of: a readable segment frozen before `now - max_age`
    (ix_segments_expiry), or more remote bytes than `max_bytes` (ix_partitions_remote_bytes). Page by passing the
    last one as `after`.

    The partitions whose oldest readable segment is too old, or whose remote bytes are over the limit, are exactly
    those segments_for_remote_retention expires something of; a readable segment frozen before the cutoff behind a
    younger oldest one (a freeze time out of seq order) names its partition too, where segments_for_remote_retention
    then expires nothing. Range scans of what is past its limit, in one statement per 32 distinct limits: the cost of
    a pass with nothing to expire does not grow with the partitions or their history.
    """
    selects = []
    by_age: dict[timedelta, set[str]] = {}
    by_bytes: dict[int, set[str]] = {}
    for group in limits:
        if group.max_age is not None:
            by_age.setdefault(group.max_age, set()).update(group.topics)
        if group.max_bytes is not None:
            by_bytes.setdefault(group.max_bytes, set()).update(group.topics)
    for max_age, names in by_age.items():
        selects.append(
            select(SegmentModel.topic, SegmentModel.partition)
            .where(_READABLE, SegmentModel.topic.in_(sorted(names)), SegmentModel.freeze_ts < now - max_age)
            .where(*_past(SegmentModel, after))
            .distinct()
        )
    for max_bytes, names in by_bytes.items():
        selects.append(
            select(PartitionModel.topic, PartitionModel.partition)
            .where(PartitionModel.topic.in_(sorted(names)), PartitionModel.remote_bytes > max_bytes)
            .where(*_past(PartitionModel, after))
        )
    due: set[tuple[str, int]] = set()
    with cat.read() as conn:
        for i in range(0, len(selects), _DUE_SELECTS):
            chunk = selects[i:i + _DUE_SELECTS]
            query = chunk[0] if len(chunk) == 1 else union(*chunk)
            query = query.order_by("topic", "partition").limit(inline_limit(limit))
            due.update((topic, partition) for topic, partition in conn.execute(query))
    return sorted(due)[:limit]


def _past(
    model: type[SegmentModel] | type[PartitionModel], after: tuple[str, int] | None
) -> tuple[ColumnElement[bool], ...]:
    if after is None:
        return ()
    topic, partition = after
    return (or_(model.topic > topic, and_(model.topic == topic, model.partition > partition)),)


def segments_for_remote_retention(
    cat: Catalog,
    topic: str,
    partition: int,
    *,
    now: datetime,
    max_age: timedelta | None,
    max_bytes: int | None,
    limit: int = 100,
) -> list[SegmentRow]:
    """The oldest readable segments that remote retention expires, oldest first, at most `limit`.

    A segment expires when `freeze_ts + max_age < now` (TANK's rule for log.retention.secs) or while the
    partition's remote_bytes, less what expires before it, exceeds `max_bytes`. Retention deletes a prefix: the
    first segment that is kept ends the list, so the partition's history never gets a hole. None disables a limit.
    """
    if max_age is None and max_bytes is None:
        return []
    query = (
        select(*_COLUMNS, PartitionModel.remote_bytes)
        .join(PartitionModel, and_(PartitionModel.topic == SegmentModel.topic, PartitionModel.partition == SegmentModel.partition))
        .where(SegmentModel.topic == topic, SegmentModel.partition == partition)
        .where(_READABLE)
        .order_by(SegmentModel.last_seq)
        .limit(inline_limit(limit))
    )
    with cat.read() as conn:
        rows = conn.execute(query).all()
    expired: list[SegmentRow] = []
    for *values, remote_bytes in rows:
        segment = SegmentRow(*values)
        remaining = remote_bytes - sum(s.total_bytes for s in expired)
        too_old = max_age is not None and segment.freeze_ts + max_age < now
        too_big = max_bytes is not None and remaining > max_bytes
        if not (too_old or too_big):
            break
        expired.append(segment)
    return expired


def highest_copied_seq(cat: Catalog, topic: str, partition: int) -> int:
    """The highest seq held by a readable remote segment; 0 if none. Block runs at or below it may be pruned."""
    # The newest entry of ix_segments_lookup, spelled as its order: with max() a planner may instead walk another
    # readable-segment index of the topic (ix_segments_expiry) and filter by partition.
    with cat.read() as conn:
        last = conn.execute(
            select(SegmentModel.last_seq)
            .where(SegmentModel.topic == topic, SegmentModel.partition == partition)
            .where(_READABLE)
            .order_by(SegmentModel.last_seq.desc())
            .limit(inline_limit(1))
        ).scalar()
    return last or 0
