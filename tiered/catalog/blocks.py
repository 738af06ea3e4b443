"""Blocks and their runs: the intent row, the commit, lookups by seq, pruning, the sweep
(docs/architecture.md, data path steps 3-8).

A block's life (tiered.catalog.states): `insert_pending_block` before the PUT; `commit_block` after it (or
`abandon_block` when the commit failed); `prune_runs_in` when a remote segment answering for the same seqs is
recorded (tiered.catalog.segments.segment_copy_finished), or `prune_runs_below` once retention moved the first
available seq past them, which moves a block with no runs left to `deleting`; the sweeper deletes the object after
`delete_after`, then `delete_block_rows`.

Every seq from a partition's first available seq to its high-water mark has one location: a remote segment or a
block run that answers for it (`from_seq <= seq <= last_seq`). commit_block proves it for new runs (continuity),
segment_copy_finished keeps it (runs go in the same transaction their segment becomes readable), and
tiered.catalog.check verifies it.

Unexpanded runs (0013). On PostgreSQL `commit_block` writes the runs of a wide block (more than
EXPAND_IN_COMMIT_RUNS, or the broker's setting block_expand_in_commit_runs) packed into its own row
(`blocks.runs_pending`, `pack_runs`) instead of one `block_runs` row each, and `expand_blocks` moves them into `block_runs` later: right after the acknowledgements (the block pipeline),
or by the sweep on any broker for a block a crash left unexpanded (`unexpanded_blocks`). The invariants:
- a committed block's runs are in exactly one of two places, `runs_pending` or `block_runs`: the expansion inserts
  the rows and clears `runs_pending` in one transaction, after locking the block row and seeing it still pending,
  so two expanders never insert a run twice;
- every reader of locations (`runs_from`, and through it `find_run`, `runs_for_range`, tiered.catalog.locate; the
  check, the bytes gauge) reads the unexpanded runs as locations too, in the same snapshot as the rows;
- whatever deletes or moves locations of a partition (`prune_runs_in`, `prune_runs_below`, the compaction swap, a
  copy's from_seq) first expands, in its own transaction, the unexpanded blocks holding a run of that partition in
  the range it touches (`expand_pending_of`), so that its DELETE sees those rows and no later expansion can put back
  a location it removed. A block with unexpanded runs has no `block_runs` rows, so no prune marks it `deleting`
  (the mark also requires `runs_pending IS NULL`), and the sweep never deletes it.
SQLite (one broker, one writer) inserts the rows inside the commit, as before: nothing is ever unexpanded there
unless a test asks (`expand=False`), and the readers' code is the same.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from functools import cache
from operator import attrgetter

from sqlalchemy import Connection, bindparam, delete, exists, insert, null, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from tiered.catalog.arrays import ArraySource, RowSource, statement
from tiered.catalog.engine import Catalog, inline_limit, utcnow
from tiered.catalog.errors import (CatalogUnavailable, Discontinuity, IllegalTransition, StaleEpoch, UnknownBlock,
                                   UnknownPartition)
from tiered.catalog.models import BlockModel, BlockRunModel, PartitionModel, SegmentModel
from tiered.catalog.partitions import lock_partitions
from tiered.catalog.states import BLOCK_TRANSITIONS, BlockState

# How long a block marked `deleting` stays in the bucket: longer than any cache of catalog lookups, so that a
# reader holding a stale run location still finds the object.
DEFAULT_DELETE_GRACE = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class RunMeta:
    """One run as its uploader describes it: which seqs of which partition it holds and answers for."""

    topic: str
    partition: int
    from_seq: int  # the first seq it answers for: the catalog's high-water mark + 1 when it commits (<= first_seq)
    first_seq: int  # of its first record
    last_seq: int
    messages: int
    min_ts_ms: int
    max_ts_ms: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class RunRow(RunMeta):
    """One run as the block footer lists it and the catalog stores it: with its place in the block object."""

    position: int  # of the run's first byte in the block object
    length_bytes: int


@dataclass(frozen=True, slots=True)
class RunLocation:
    """Where a committed run's bytes are: one range GET of `object_key` at [position, position + length_bytes).
    It answers for the seqs [from_seq, last_seq]; its first record starts at first_seq. The block object is
    `block_size_bytes` long: its footer (and the run's bundle index) is at its end."""

    topic: str
    partition: int
    from_seq: int
    first_seq: int
    last_seq: int
    position: int
    length_bytes: int
    block_id: int
    object_key: str
    min_ts_ms: int
    max_ts_ms: int
    block_size_bytes: int

    def holds(self, seq: int) -> bool:
        return self.from_seq <= seq <= self.last_seq


@dataclass(frozen=True, slots=True)
class PruneResult:
    runs_deleted: int
    blocks_marked: int  # blocks left without runs, now `deleting`


@dataclass(frozen=True, slots=True)
class BlockRow:
    block_id: int
    object_key: str
    state: str
    broker_id: int
    size_bytes: int
    created_at: datetime
    committed_at: datetime | None
    delete_after: datetime | None


_BLOCK_COLUMNS = (
    BlockModel.block_id,
    BlockModel.object_key,
    BlockModel.state,
    BlockModel.broker_id,
    BlockModel.size_bytes,
    BlockModel.created_at,
    BlockModel.committed_at,
    BlockModel.delete_after,
)
# Only columns of ix_block_runs_lookup (PostgreSQL answers from the index alone), plus the block's object key and size
# (from the block row the join reads by primary key anyway).
_LOCATION_COLUMNS = (
    BlockRunModel.from_seq,
    BlockRunModel.first_seq,
    BlockRunModel.last_seq,
    BlockRunModel.position,
    BlockRunModel.length_bytes,
    BlockRunModel.block_id,
    BlockModel.object_key,
    BlockRunModel.min_ts_ms,
    BlockRunModel.max_ts_ms,
    BlockModel.size_bytes,
)


# The statements of the block path (an intent row and a commit per block, every 250 ms or 8 MiB per broker) are
# built once: building them per call cost SQLAlchemy about three times what executing them did.
_BLOCKS = BlockModel.__table__
_INSERT_PENDING = (
    insert(_BLOCKS)
    .values(object_key=bindparam("object_key"), state=BlockState.PENDING, broker_id=bindparam("broker_id"),
            size_bytes=bindparam("size_bytes"), created_at=bindparam("created_at"))
    .returning(_BLOCKS.c.block_id)
)
_MARK_COMMITTED = (
    update(_BLOCKS)
    .where(_BLOCKS.c.block_id == bindparam("b_id"), _BLOCKS.c.broker_id == bindparam("b_broker"),
           _BLOCKS.c.state.in_(BLOCK_TRANSITIONS.sources(BlockState.COMMITTED)))
    .values(state=BlockState.COMMITTED, committed_at=bindparam("b_at"), runs_pending=bindparam("b_runs"))
)
_RUN_FIELDS = tuple(f.name for f in fields(RunRow))
# commit_block's rows as bound values (tiered.catalog.arrays): one statement that checks and raises every partition
# the block touches, and (on SQLite; PostgreSQL takes a COPY) one INSERT for every run, whatever their number (a
# block may hold runs of thousands of partitions).
_RUN_TYPES = {"topic": "text", "partition": "integer", "messages": "integer"}
RUNS = RowSource("r", tuple((f, _RUN_TYPES.get(f, "bigint")) for f in _RUN_FIELDS))
# One row per partition of the block, sorted by (topic, partition): the epoch the broker holds it at, the epoch its
# first run was stamped with, where its first run answers from, and what the commit sets. Bound as arrays on
# PostgreSQL (tiered.catalog.arrays.ArraySource: the server neither parses JSON nor casts each field).
HEADS = ArraySource("h", (("topic", "text"), ("partition", "integer"), ("epoch", "bigint"), ("run_epoch", "bigint"),
                          ("from_seq", "bigint"), ("first", "bigint"), ("hwmark", "bigint")))
_QUOTED_RUN_FIELDS = [f'"{f}"' for f in _RUN_FIELDS]
_INSERT_RUNS = (f"INSERT INTO block_runs (block_id, {', '.join(_QUOTED_RUN_FIELDS)})\n"
                f"SELECT :block_id, {', '.join('r.' + f for f in _QUOTED_RUN_FIELDS)} FROM {{r}}")
# A partition the commit may raise: led by the committing broker at the epoch it holds (and stamped on its first
# run), and continued exactly: its first run answers from the high-water mark + 1.
_CONTINUES = ("p.leader_broker = :broker_id AND p.leader_epoch = h.epoch AND h.run_epoch = h.epoch"
              " AND p.hwmark_seq + 1 = h.from_seq")
# The commit's first statement checks and raises every partition of the block at once: it raises only the rows that
# continue, and the caller compares the count with the block's partitions; fewer means a refusal, and the caller
# rolls the transaction back (nothing stays raised) and asks _REFUSED why. The check runs on the row the UPDATE
# writes: at READ COMMITTED a row another transaction changed after the statement's snapshot is locked and checked
# again in its newest version (EvalPlanQual), as a `SELECT ... FOR UPDATE` would, so no separate locking pass (which
# cost a WAL record and a page visit per partition). Lock order: on PostgreSQL the plan is a nested loop over the
# heads in the order given (sorted by (topic, partition)), probing the primary key of each, so the rows are locked in
# the catalog's lock order (tests/catalog/test_plans.py checks the plan, at 100,000 partitions too); SQLite's write
# transaction already holds the database.
_RAISE = f"""UPDATE partitions AS p SET hwmark_seq = h.hwmark,
    first_available_seq = CASE WHEN p.first_available_seq = 0 THEN h."first" ELSE p.first_available_seq END
FROM {{h}} WHERE p.topic = h.topic AND p."partition" = h."partition" AND {_CONTINUES}
"""
# After a refusal, in a transaction of its own: the partitions the commit refuses, as (topic, partition, known,
# leader_broker, leader_epoch, hwmark_seq, from_seq), in (topic, partition) order. On PostgreSQL each row is locked
# (FOR UPDATE in a LATERAL probe, in the order given, as tiered.catalog.partitions.lock_partitions does), so the
# reason read is the row's newest version.
_REFUSED = {
    "postgresql": f"""SELECT h.topic, h."partition", p.topic IS NOT NULL, p.leader_broker, p.leader_epoch, p.hwmark_seq,
       h.from_seq
FROM {{h}} LEFT JOIN LATERAL (SELECT topic, leader_broker, leader_epoch, hwmark_seq FROM partitions
                             WHERE topic = h.topic AND "partition" = h."partition" FOR UPDATE) AS p ON true
WHERE NOT coalesce({_CONTINUES}, false)
ORDER BY h.topic, h."partition"
""",
    "sqlite": f"""SELECT h.topic, h."partition", p.topic IS NOT NULL, p.leader_broker, p.leader_epoch, p.hwmark_seq,
       h.from_seq
FROM {{h}} LEFT JOIN partitions AS p ON p.topic = h.topic AND p."partition" = h."partition"
WHERE NOT coalesce({_CONTINUES}, 0)
ORDER BY h.topic, h."partition"
""",
}
# How often a commit refused by its raise, whose reason then finds every partition continuing (the rows changed in
# between), is tried again before the caller hears CatalogUnavailable (and retries).
_REFUSAL_TRIES = 3


class _Refused(Exception):
    """Inside commit_block: the raise left a partition out; leaving the transaction this way rolls it back."""


def insert_pending_block(
    cat: Catalog, object_key: str, broker_id: int, size_bytes: int, *, now: datetime | None = None
) -> int:
    """Records the intent to upload `object_key` (call it BEFORE the PUT, so that no object exists that the catalog
    does not know). Returns the new block_id. A retry after an insert that landed (CatalogUnavailable hides whether
    it did) returns the same block; the key pending for another broker, or past pending, raises ValueError."""
    try:
        with cat.write() as conn:
            return conn.execute(_INSERT_PENDING, {"object_key": object_key, "broker_id": broker_id,
                                                  "size_bytes": size_bytes, "created_at": utcnow(now)}).scalar_one()
    except IntegrityError:  # the key exists (object keys are unique): a retry of an insert that landed?
        with cat.read() as conn:
            existing = conn.execute(
                select(BlockModel.block_id, BlockModel.broker_id, BlockModel.state).where(BlockModel.object_key == object_key)
            ).first()
        if existing is None or existing.broker_id != broker_id or existing.state != BlockState.PENDING:
            raise ValueError(f"block {object_key} already exists"
                             + (f" ({existing.state}, broker {existing.broker_id})" if existing else "")) from None
        return existing.block_id


@dataclass(frozen=True, slots=True)
class Heads:
    """What the commit checks and sets per partition of a block: one HEADS row per partition (topic, partition, the
    epoch the broker holds it at, its first run's epoch, from_seq and first_seq, its last run's last_seq), in
    (topic, partition) order: the lock order."""

    rows: list[list]

    def keys(self) -> list[tuple[str, int]]:
        return [(row[0], row[1]) for row in self.rows]

    def hwmarks(self) -> dict[tuple[str, int], int]:
        """What the commit raises each partition's hwmark_seq to."""
        return {(row[0], row[1]): row[6] for row in self.rows}


def _heads(runs: Sequence[RunRow], epochs: Mapping[tuple[str, int], int]) -> Heads:
    """The block's Heads, after the checks that need no database. One pass over the runs (a block may hold
    thousands), without building a list of runs per partition; then one sort of the partitions' rows."""
    if not runs:
        raise ValueError("a block holds at least one run")
    heads: dict[tuple[str, int], list] = {}
    for run in runs:  # reading the attributes one by one costs less than an attrgetter's tuple
        topic, partition = run.topic, run.partition
        from_seq, first_seq, last_seq = run.from_seq, run.first_seq, run.last_seq
        if not 1 <= from_seq <= first_seq <= last_seq:
            raise ValueError(f"bad seq range {from_seq}/{first_seq}..{last_seq} in run of {topic}/{partition}")
        key = (topic, partition)
        head = heads.get(key)
        if head is None:
            epoch = epochs.get(key)
            if epoch is None:
                raise ValueError(f"no leader epoch given for {topic}/{partition}")
            heads[key] = [topic, partition, epoch, run.leader_epoch, from_seq, first_seq, last_seq]
        elif from_seq != head[6] + 1:
            raise ValueError(f"runs of {topic}/{partition} in one block do not follow each other")
        else:
            head[6] = last_seq
    # Sorting the rows sorts by (topic, partition): no two rows share both.
    return Heads(sorted(heads.values()))


def commit_block(
    cat: Catalog,
    block_id: int,
    broker_id: int,
    runs: Sequence[RunRow],
    epochs: Mapping[tuple[str, int], int],
    *,
    now: datetime | None = None,
    expand: bool | None = None,
) -> dict[tuple[str, int], int]:
    """Commits an uploaded block in one transaction; returns the new hwmark_seq of each of its partitions.

    Locks the block's partition rows in (topic, partition) order. Refuses, changing nothing:
    - StaleEpoch unless `broker_id` leads every partition at the epoch given in `epochs`;
    - Discontinuity unless each partition's first run continues the catalog exactly (from_seq = hwmark_seq + 1)
      and carries that epoch: so a commit can neither reuse a committed seq nor leave one without a location.
    Then marks the block committed with its runs, raises each partition's hwmark_seq to its last run's
    last_seq, and sets first_available_seq from the first run when it was still 0. The runs are written packed in
    the block's row (unexpanded: `expand_blocks` moves them into block_runs after the acknowledgements), or, with
    `expand` (by default on SQLite, and for a block of at most EXPAND_IN_COMMIT_RUNS runs: expands_in_commit; the
    block pipeline passes its own choice), as block_runs rows in this transaction.

    Two statements (check and raise; mark with the packed runs), three with `expand` (and the insert), whatever
    the number of runs; a refusal rolls them back and asks why in a transaction of its own. A retry of a commit that did land (after
    CatalogUnavailable) returns the hwmarks as they are. A block that is not pending (abandoned) raises
    IllegalTransition; another broker's block raises ValueError.
    """
    heads = _heads(runs, epochs)
    backend = cat.backend
    bound = {"broker_id": broker_id, **HEADS.params(backend, heads.rows)}
    partitions = len(heads.rows)
    committed_at = utcnow(now)
    if expand is None:
        expand = expands_in_commit(cat, len(runs))
    packed = None if expand else pack_runs(runs)
    for _ in range(_REFUSAL_TRIES):
        try:
            with cat.write() as conn:
                raised = conn.execute(statement(backend, _RAISE, HEADS), bound)
                if raised.rowcount != partitions:
                    raise _Refused
                moved = conn.execute(_MARK_COMMITTED, {"b_id": block_id, "b_broker": broker_id, "b_at": committed_at,
                                                       "b_runs": packed})
                if moved.rowcount == 0:
                    # Every partition continued, so this is no retry of a landed commit (which raised them past its
                    # runs): the block is not this broker's pending block. Raising rolls the raise back.
                    _committed_before(conn, block_id, broker_id, heads)  # raises for most blocks
                    raise IllegalTransition("block", f"{block_id}", BlockState.COMMITTED, BlockState.COMMITTED)
                if expand:
                    _insert_runs(cat, conn, block_id, runs)
            return heads.hwmarks()
        except _Refused:
            pass
        with cat.write() as conn:
            # The block's own state comes first: a retry of a landed commit finds every partition already raised.
            landed = _committed_before(conn, block_id, broker_id, heads)
            if landed is not None:
                return landed
            refused = conn.execute(statement(backend, _REFUSED[backend], HEADS), bound).first()
        if refused is not None:
            topic, partition, known, leader_broker, leader_epoch, hwmark, from_seq = refused
            if not known:
                raise UnknownPartition(topic, partition)
            if leader_broker != broker_id or leader_epoch != epochs[topic, partition]:
                raise StaleEpoch(topic, partition, epochs[topic, partition], leader_epoch, leader_broker)
            raise Discontinuity(topic, partition, hwmark, from_seq)
    raise CatalogUnavailable(f"the commit of block {block_id} was refused, then found allowed, {_REFUSAL_TRIES} times")


# Up to this many runs a PostgreSQL commit inserts its block_runs rows itself: a second transaction costs more
# (about 1.5 ms of CPU) than the rows of a small block (a few microseconds each) cost the commit. The packed runs
# are for the wide blocks, whose rows cost the commit most of its time (docs/benchmarks.md, "Fourth round").
# The broker's setting `block_expand_in_commit_runs` (tiered.config) chooses another limit; 0 leaves every block
# unexpanded at its commit (bench/chaos.py runs so, to attack the expansion's crash windows with every block).
EXPAND_IN_COMMIT_RUNS = 64


def expands_in_commit(cat: Catalog, runs: int, limit: int = EXPAND_IN_COMMIT_RUNS) -> bool:
    """Whether commit_block inserts the block_runs rows of a block of `runs` runs itself: always on SQLite (one
    broker, whose one writer would gain nothing from a second transaction), and on PostgreSQL for a block of at most
    `limit` runs; otherwise the commit writes them packed and leaves them unexpanded."""
    return cat.backend != "postgresql" or runs <= limit


# A block's runs packed into one value (blocks.runs_pending): b"\x01", the number of topic names (u32), each name
# (u16 length, UTF-8), then one fixed-width record per run in the block's order: its topic's index (u32), then
# RunRow's other fields in their order (partition and messages i32, the others i64), little-endian. 76 bytes a run.
_PACKED_FORMAT = 1
_PACKED_RUN = struct.Struct("<Iiqqqiqqqqq")
_U32, _U16 = struct.Struct("<I"), struct.Struct("<H")


def pack_runs(runs: Sequence[RunRow]) -> bytes:
    names: dict[str, int] = {}
    pack = _PACKED_RUN.pack
    records = []
    append = records.append
    for run in runs:
        topic = run.topic
        index = names.get(topic)
        if index is None:
            index = names[topic] = len(names)
        append(pack(index, *_run_numbers(run)))
    head = [bytes((_PACKED_FORMAT,)), _U32.pack(len(names))]
    for name in names:
        encoded = name.encode()
        head += (_U16.pack(len(encoded)), encoded)
    return b"".join(head + records)


def _unpacked(packed: bytes) -> tuple[list[str], Iterable[tuple]]:
    """The topic names and the records (tuples: topic index, then RunRow's other fields) of pack_runs' value."""
    view = memoryview(packed)
    if not view or view[0] != _PACKED_FORMAT:
        raise ValueError(f"packed runs of an unknown format {view[0] if view else None}")
    (count,) = _U32.unpack_from(view, 1)
    at, names = 5, []
    for _ in range(count):
        (size,) = _U16.unpack_from(view, at)
        names.append(str(view[at + 2:at + 2 + size], "utf-8"))
        at += 2 + size
    return names, _PACKED_RUN.iter_unpack(view[at:])


def unpack_runs(packed: bytes) -> list[RunRow]:
    names, records = _unpacked(packed)
    return [RunRow(names[record[0]], *record[1:]) for record in records]


def _insert_runs(cat: Catalog | None, conn: Connection, block_id: int, runs: Sequence[RunRow]) -> None:
    """Inserts the block's runs: one statement whatever their number. On PostgreSQL a COPY (text format, built here
    with one `%` per run): the server inserts its rows in batches per heap page and parses no JSON, which took about
    2 ms off a commit of 1,600 runs (docs/benchmarks.md); the INSERT ... SELECT of the bound rows elsewhere, and
    where the caller has no Catalog to count the COPY on (an expansion inside a prune)."""
    if conn.dialect.name != "postgresql" or cat is None:
        conn.execute(statement(conn.dialect.name, _INSERT_RUNS, RUNS),
                     {"block_id": block_id, **RUNS.params([_run_values(run) for run in runs])})
        return
    names: dict[str, str] = {}
    rows = []
    line = _copy_line(block_id)
    for run in runs:
        values = _run_values(run)
        topic = run.topic
        if topic not in names:
            names[topic] = _copy_text(topic)
        rows.append(line % ((names[topic],) + values[1:]))
    _copy(cat, conn, rows)


def _copy_line(block_id: int) -> str:
    return f"{int(block_id)}\t%s" + "\t%d" * (len(_RUN_FIELDS) - 1) + "\n"


def _copy(cat: Catalog, conn: Connection, rows: list[str]) -> None:
    """Sends `rows` (lines of COPY's text format) into block_runs."""
    import psycopg  # the PostgreSQL driver, present whenever a PostgreSQL catalog is open

    cat.counted()  # sent on the driver's cursor: the statement counter does not see it
    try:
        with conn.connection.driver_connection.cursor() as cursor, cursor.copy(_COPY_RUNS) as copy:
            copy.write("".join(rows))
    except psycopg.OperationalError as error:  # sent on the driver connection: not translated by SQLAlchemy
        conn.invalidate()
        raise CatalogUnavailable(str(error).strip() or type(error).__name__) from error


_COPY_RUNS = f"COPY block_runs (block_id, {', '.join(_QUOTED_RUN_FIELDS)}) FROM STDIN"


def _copy_text(value: str) -> str:
    """`value` as a field of COPY's text format: its backslashes, tabs and line ends escaped."""
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _committed_before(conn: Connection, block_id: int, broker_id: int, heads: Heads) -> dict[tuple[str, int], int] | None:
    """When the block cannot be committed now: the hwmarks of its partitions if its commit already landed (a
    retry), None if it is this broker's pending block (the partitions decide); raises for any other block."""
    block = conn.execute(select(BlockModel.state, BlockModel.broker_id).where(BlockModel.block_id == block_id)).first()
    if block is None:
        raise UnknownBlock(block_id)
    if block.broker_id != broker_id:
        raise ValueError(f"block {block_id} belongs to broker {block.broker_id}, not {broker_id}")
    if block.state == BlockState.COMMITTED:
        keys = heads.keys()
        partitions = lock_partitions(conn, keys)
        return {key: partitions[key].hwmark_seq for key in keys}
    if block.state != BlockState.PENDING:
        BLOCK_TRANSITIONS.check(block.state, BlockState.COMMITTED, f"{block_id}")  # raises: only pending commits
    return None


_run_values = attrgetter(*_RUN_FIELDS)
_run_numbers = attrgetter(*_RUN_FIELDS[1:])  # all but the topic


def abandon_block(
    cat: Catalog, block_id: int, *, grace: timedelta = DEFAULT_DELETE_GRACE, now: datetime | None = None
) -> bool:
    """After a failed commit: marks the pending block `deleting` (the sweeper deletes its object after `grace`).

    Returns True if the block is now `deleting`, False if it must be kept: its commit landed after all and runs
    reference it. Raises UnknownBlock.
    """
    unreferenced = ~exists().where(BlockRunModel.block_id == BlockModel.block_id)
    with cat.write() as conn:
        moved = conn.execute(
            update(BlockModel)
            .where(BlockModel.block_id == block_id, BlockModel.state == BlockState.PENDING, unreferenced,
                   BlockModel.runs_pending.is_(None))
            .values(state=BlockState.DELETING, delete_after=utcnow(now) + grace)
        )
        if moved.rowcount:
            return True
        state = conn.execute(select(BlockModel.state).where(BlockModel.block_id == block_id)).scalar_one_or_none()
    if state is None:
        raise UnknownBlock(block_id)
    return state == BlockState.DELETING


def get_block(cat: Catalog, block_id: int) -> BlockRow | None:
    with cat.read() as conn:
        row = conn.execute(select(*_BLOCK_COLUMNS).where(BlockModel.block_id == block_id)).first()
    return BlockRow(*row) if row else None


# Spelled as the partial index's predicate, so that the planners use ix_blocks_runs_pending.
_IS_PENDING = BlockModel.runs_pending.is_not(None)


@cache
def _locations(limit: int):
    # No filter on the block's state: a run exists only while its block is committed (runs are inserted by the
    # commit or the expansion, and deleted before their block may leave `committed`), and the join stays a primary
    # key probe. Built once per limit (callers use a few): building the query per lookup cost about as much of the
    # caller's CPU as executing it.
    rows = (
        select(*_LOCATION_COLUMNS)
        .join(BlockModel, BlockModel.block_id == BlockRunModel.block_id)
        .where(
            BlockRunModel.topic == bindparam("l_topic"),
            BlockRunModel.partition == bindparam("l_partition"),
            BlockRunModel.last_seq >= bindparam("l_seq"),
        )
        .order_by(BlockRunModel.last_seq)
        .limit(inline_limit(limit))
        .subquery()
    )
    # And, in the same statement (one snapshot), a row of NULLs when any block is unexpanded: one probe of
    # ix_blocks_runs_pending. Without it the rows are the whole answer, whatever they are.
    anything_unexpanded = select(*(null() for _ in _LOCATION_COLUMNS)).where(exists().where(_IS_PENDING))
    return select(rows).union_all(anything_unexpanded)


@dataclass(frozen=True, slots=True)
class RunRows:
    """What run_rows_from read in one statement."""

    runs: list[RunLocation]
    unexpanded: bool  # whether any block (of any partition) was unexpanded

    def answer(self, seq: int, limit: int) -> bool:
        """Whether these are the answer, unexpanded runs or not: nothing was unexpanded, or `limit` runs, the
        first holding `seq`, each following the one before (an unexpanded run of a lower last_seq would share a
        seq with them, and no seq has two locations)."""
        runs = self.runs
        return not self.unexpanded or (len(runs) == limit and runs[0].holds(seq)
                                       and all(b.from_seq == a.last_seq + 1 for a, b in zip(runs, runs[1:])))


def run_rows_from(conn: Connection, topic: str, partition: int, seq: int, limit: int) -> RunRows:
    """Up to `limit` runs of block_runs with last_seq >= seq, in seq order: one statement, an index scan of
    ix_block_runs_lookup (answered from the index alone on PostgreSQL) and a probe of ix_blocks_runs_pending. Not
    the unexpanded runs: see runs_from."""
    runs, unexpanded = [], False
    for row in conn.execute(_locations(limit), {"l_topic": topic, "l_partition": partition, "l_seq": seq}):
        if row[0] is None:
            unexpanded = True
        else:
            runs.append(RunLocation(topic, partition, *row))
    runs.sort(key=attrgetter("last_seq"))  # a UNION ALL keeps no order of its own
    return RunRows(runs, unexpanded)


def runs_from(conn: Connection, topic: str, partition: int, seq: int, limit: int) -> list[RunLocation]:
    """Up to `limit` committed runs with last_seq >= seq, in seq order, expanded or not: the rows of block_runs, and
    when they are not the answer (RunRows.answer), the unexpanded runs merged in. Call it in one snapshot
    (Catalog.snapshot): an expansion committing between two autocommit statements would hide its runs from both."""
    rows = run_rows_from(conn, topic, partition, seq, limit)
    if rows.answer(seq, limit):
        return rows.runs
    pending = [run for run in pending_locations(conn, topic, partition) if run.last_seq >= seq]
    return sorted(rows.runs + pending, key=attrgetter("last_seq"))[:limit]


def _runs_read(cat: Catalog, topic: str, partition: int, seq: int, limit: int) -> list[RunLocation]:
    with cat.read() as conn:  # the fast path: one statement
        rows = run_rows_from(conn, topic, partition, seq, limit)
    if rows.answer(seq, limit):
        return rows.runs
    with cat.snapshot() as conn:
        return runs_from(conn, topic, partition, seq, limit)


def find_run(cat: Catalog, topic: str, partition: int, seq: int) -> RunLocation | None:
    """The committed run with the smallest last_seq >= seq: the one that holds `seq` when `holds(seq)` says so.
    None when no run reaches `seq`. One index scan, LIMIT 1, answered from the index alone on PostgreSQL, when a row
    holds `seq`; otherwise the unexpanded runs are read too, in a snapshot (runs_from)."""
    runs = _runs_read(cat, topic, partition, seq, 1)
    return runs[0] if runs else None


def runs_for_range(cat: Catalog, topic: str, partition: int, from_seq: int, limit: int) -> list[RunLocation]:
    """Up to `limit` committed runs in seq order, starting with the one `find_run(from_seq)` returns."""
    return _runs_read(cat, topic, partition, from_seq, limit)


# -- unexpanded runs (module docstring) ------------------------------------------------------------------------------

_UNEXPANDED = (select(BlockModel.block_id, BlockModel.object_key, BlockModel.size_bytes, BlockModel.state,
                      BlockModel.runs_pending)
               .where(_IS_PENDING).order_by(BlockModel.committed_at))
_STALE = (select(BlockModel.block_id).where(_IS_PENDING, BlockModel.committed_at < bindparam("s_before"))
          .order_by(BlockModel.committed_at))
# The expansion's claim: the block row locked, and still unexpanded in its newest version (at READ COMMITTED a row
# another expansion cleared while this one waited for its lock is checked again and left out: EvalPlanQual; SQLite's
# write transaction holds the database).
_LOCK_PENDING = (select(BlockModel.runs_pending)
                 .where(BlockModel.block_id == bindparam("e_id"), _IS_PENDING).with_for_update())
_CLEAR_PENDING = update(_BLOCKS).where(_BLOCKS.c.block_id == bindparam("e_id")).values(runs_pending=None)


@dataclass(frozen=True, slots=True)
class UnexpandedRun:
    """A run of an unexpanded block, as the block's row holds it (pending_runs)."""

    run: RunRow
    block_id: int
    object_key: str
    block_size_bytes: int
    block_state: str

    def location(self) -> RunLocation:
        r = self.run
        return RunLocation(r.topic, r.partition, r.from_seq, r.first_seq, r.last_seq, r.position, r.length_bytes,
                           self.block_id, self.object_key, r.min_ts_ms, r.max_ts_ms, self.block_size_bytes)


def pending_runs(conn: Connection, *, keys: Collection[tuple[str, int]] | None = None,
                 topics: Collection[str] | None = None) -> list[UnexpandedRun]:
    """The runs of every unexpanded block (one scan of ix_blocks_runs_pending: a handful of rows), only those of the
    partitions `keys`, or of the topics `topics`, when given; in block then run order."""
    out: list[UnexpandedRun] = []
    for block_id, object_key, size, state, packed in conn.execute(_UNEXPANDED):
        names, records = _unpacked(packed)
        if keys is not None:
            wanted = {(names.index(topic), partition) for topic, partition in keys if topic in names}
            chosen = (r for r in records if (r[0], r[1]) in wanted) if wanted else ()
        elif topics is not None:
            indexes = {i for i, name in enumerate(names) if name in topics}
            chosen = (r for r in records if r[0] in indexes) if indexes else ()
        else:
            chosen = records
        out.extend(UnexpandedRun(RunRow(names[r[0]], *r[1:]), block_id, object_key, size, state) for r in chosen)
    return out


def pending_locations(conn: Connection, topic: str, partition: int) -> list[RunLocation]:
    """The unexpanded runs of the partition as locations, in seq order."""
    return sorted((u.location() for u in pending_runs(conn, keys=((topic, partition),))),
                  key=attrgetter("last_seq"))


def unexpanded_blocks(cat: Catalog, before: datetime, limit: int = 100) -> list[int]:
    """Blocks committed before `before` whose runs are still unexpanded, oldest first: a broker stopped or crashed
    between its commit and the expansion (the sweep, on any broker, expands them)."""
    with cat.read() as conn:
        return list(conn.execute(_STALE.limit(inline_limit(limit)), {"s_before": before}).scalars())


def expand_blocks(cat: Catalog, block_ids: Iterable[int]) -> int:
    """Expands the blocks given that are still unexpanded, each in a transaction of its own (module docstring);
    returns how many runs went into block_runs. Safe for any block, any number of times, from any broker."""
    inserted = 0
    for block_id in sorted(set(block_ids)):
        with cat.write() as conn:
            inserted += _expand(cat, conn, block_id)
    return inserted


def _expand(cat: Catalog | None, conn: Connection, block_id: int) -> int:
    packed = conn.execute(_LOCK_PENDING, {"e_id": block_id}).scalar_one_or_none()
    if packed is None:
        return 0  # expanded already (by another broker, a prune, or the commit itself), or no committed block
    if cat is not None and conn.dialect.name == "postgresql":
        # The COPY's lines straight from the packed records, whose fields are in RunRow's order (about 1.5 ms less
        # Python for 1,600 runs than building the RunRows first).
        names, records = _unpacked(packed)
        texts, line = [_copy_text(name) for name in names], _copy_line(block_id)
        rows = [line % ((texts[r[0]],) + r[1:]) for r in records]
        _copy(cat, conn, rows)
        inserted = len(rows)
    else:
        runs = unpack_runs(packed)
        _insert_runs(cat, conn, block_id, runs)
        inserted = len(runs)
    conn.execute(_CLEAR_PENDING, {"e_id": block_id})
    return inserted


def expand_pending_of(conn: Connection, topic: str, partition: int, low: int, high: int) -> int:
    """Inside the caller's transaction, before it deletes or moves locations of the partition in [low, high]:
    expands the unexpanded blocks holding a run of the partition that reaches into that range, so that the caller's
    statements see those runs as rows and no later expansion can put back a location the caller removed (module
    docstring). Most calls expand nothing: a block is expanded right after its acknowledgements, and what is pruned
    or moved is older history. Returns the runs inserted.

    Lock order: a block expanded here is locked before the prune locks the blocks it touched (in id order); two
    such transactions could wait on each other, which PostgreSQL breaks by failing one (CatalogUnavailable, retried
    by its caller). That needs two prunes each expanding a block the other touched: rare, and never wrong."""
    ids = {run.block_id for run in pending_locations(conn, topic, partition)
           if run.last_seq >= low and run.from_seq <= high}
    return sum(_expand(None, conn, block_id) for block_id in sorted(ids))


def prune_runs_in(
    conn: Connection,
    topic: str,
    partition: int,
    from_seq: int,
    last_seq: int,
    *,
    grace: timedelta = DEFAULT_DELETE_GRACE,
    now: datetime | None = None,
) -> PruneResult:
    """Inside the caller's transaction: deletes the runs of the partition that lie wholly inside
    [from_seq, last_seq] (from their from_seq to their last_seq), then marks every block left without runs
    `deleting`. A remote segment that answers for exactly that range calls it: a run is pruned only when a remote
    segment holds every seq it answers for, never because its seqs are merely lower. Unexpanded runs reaching into
    the range are expanded first (expand_pending_of)."""
    expand_pending_of(conn, topic, partition, from_seq, last_seq)
    victims = (
        select(BlockRunModel.block_id, BlockRunModel.position)
        .where(
            BlockRunModel.topic == topic,
            BlockRunModel.partition == partition,
            BlockRunModel.last_seq <= last_seq,
            BlockRunModel.last_seq >= from_seq,
            BlockRunModel.from_seq >= from_seq,
        )
    )
    return _delete_runs(conn, victims, grace, now)


def prune_runs_within(
    cat: Catalog,
    topic: str,
    partition: int,
    from_seq: int,
    last_seq: int,
    *,
    grace: timedelta = DEFAULT_DELETE_GRACE,
    now: datetime | None = None,
) -> PruneResult:
    """prune_runs_in as its own transaction (a catalog rebuild, which records finished segments directly)."""
    with cat.write() as conn:
        return prune_runs_in(conn, topic, partition, from_seq, last_seq, grace=grace, now=now)


def prune_runs_below(
    cat: Catalog,
    topic: str,
    partition: int,
    first_available: int,
    *,
    limit: int = 1000,
    grace: timedelta = DEFAULT_DELETE_GRACE,
    now: datetime | None = None,
) -> PruneResult:
    """Deletes up to `limit` runs of the partition that end below its first available seq (retention moved past
    them: no reader may ask for their seqs), oldest first, and marks blocks left without runs `deleting`. Call
    again while `runs_deleted == limit`."""
    victims = (
        select(BlockRunModel.block_id, BlockRunModel.position)
        .where(BlockRunModel.topic == topic, BlockRunModel.partition == partition, BlockRunModel.last_seq < first_available)
        .order_by(BlockRunModel.last_seq)
        .limit(limit)
    )
    with cat.write() as conn:
        expand_pending_of(conn, topic, partition, 0, first_available - 1)
        return _delete_runs(conn, victims, grace, now)


def partitions_with_runs_below_start(
    cat: Catalog, topics: Sequence[str], *, after: tuple[str, int] | None = None, limit: int = 500
) -> list[tuple[str, int]]:
    """Up to `limit` partitions of `topics`, past `after` in (topic, partition) order, holding a block run that ends
    below their first available seq (a retention pass stopped between moving it and pruning, or by its run limit):
    prune_runs_below has something to do there. One statement, but a probe of ix_block_runs_lookup for every
    partition of `topics` with a first available seq above 1: remote retention runs it once a grace period, not at
    every pass."""
    if not topics:
        return []
    query = (
        select(PartitionModel.topic, PartitionModel.partition)
        .where(PartitionModel.topic.in_(sorted(set(topics))), PartitionModel.first_available_seq > 1)
        .where(exists().where(BlockRunModel.topic == PartitionModel.topic,
                              BlockRunModel.partition == PartitionModel.partition,
                              BlockRunModel.last_seq < PartitionModel.first_available_seq))
        .order_by(PartitionModel.topic, PartitionModel.partition)
        .limit(inline_limit(limit))
    )
    if after is not None:
        topic, partition = after
        query = query.where(tuple_(PartitionModel.topic, PartitionModel.partition) > tuple_(topic, partition))
    with cat.snapshot() as conn:
        found = {(topic, partition) for topic, partition in conn.execute(query)}
        # The unexpanded runs too (a handful of blocks): their lowest last_seq per partition, against its start.
        lowest: dict[tuple[str, int], int] = {}
        for pending in pending_runs(conn, topics=set(topics)):
            key = (pending.run.topic, pending.run.partition)
            if after is None or key > after:
                lowest[key] = min(lowest.get(key, pending.run.last_seq), pending.run.last_seq)
        if lowest:
            starts = conn.execute(select(PartitionModel.topic, PartitionModel.partition,
                                         PartitionModel.first_available_seq)
                                  .where(tuple_(PartitionModel.topic, PartitionModel.partition).in_(list(lowest))))
            found.update((topic, partition) for topic, partition, start in starts
                         if start > 1 and lowest[topic, partition] < start)
    return sorted(found)[:limit]


def _delete_runs(conn: Connection, victims, grace: timedelta, now: datetime | None) -> PruneResult:
    touched = conn.execute(
        delete(BlockRunModel)
        .where(tuple_(BlockRunModel.block_id, BlockRunModel.position).in_(victims))
        .returning(BlockRunModel.block_id)
    ).scalars().all()
    block_ids = sorted(set(touched))
    if not block_ids:
        return PruneResult(0, 0)
    # Lock the blocks first (in id order), then look for remaining runs: two prunes of different partitions
    # sharing a block then check one after the other, and the later one sees the earlier one's deletes. An
    # unlocked NOT EXISTS would let each see the other's runs and neither mark the block: a leaked object.
    conn.execute(
        select(BlockModel.block_id).where(BlockModel.block_id.in_(block_ids)).order_by(BlockModel.block_id).with_for_update()
    )
    marked = conn.execute(
        update(BlockModel)
        .where(
            BlockModel.block_id.in_(block_ids),
            BlockModel.state.in_(BLOCK_TRANSITIONS.sources(BlockState.DELETING)),
            ~exists().where(BlockRunModel.block_id == BlockModel.block_id),
            BlockModel.runs_pending.is_(None),  # an unexpanded block has runs, none of them rows yet
        )
        .values(state=BlockState.DELETING, delete_after=utcnow(now) + grace)
    )
    return PruneResult(len(touched), marked.rowcount)


def blocks_to_sweep(cat: Catalog, now: datetime, limit: int) -> list[BlockRow]:
    """Blocks `deleting` whose grace period is over, oldest first: delete their objects, then delete_block_rows."""
    with cat.read() as conn:
        rows = conn.execute(
            select(*_BLOCK_COLUMNS)
            .where(BlockModel.state == BlockState.DELETING, BlockModel.delete_after <= now,
                   BlockModel.runs_pending.is_(None))  # never true of a deleting block: stated, not assumed
            .order_by(BlockModel.delete_after)
            .limit(limit)
        )
        return [BlockRow(*r) for r in rows]


def delete_block_rows(cat: Catalog, block_ids: Iterable[int]) -> int:
    """Forgets swept blocks (only rows in `deleting`; their objects must be gone). Returns how many were deleted."""
    ids = sorted(set(block_ids))
    if not ids:
        return 0
    with cat.write() as conn:
        done = conn.execute(delete(BlockModel).where(BlockModel.block_id.in_(ids), BlockModel.state == BlockState.DELETING,
                                                     BlockModel.runs_pending.is_(None)))
    return done.rowcount


def pending_blocks_older_than(cat: Catalog, before: datetime, limit: int) -> list[BlockRow]:
    """Blocks still `pending` that were created before `before`, oldest first: uploads whose commit never
    happened (the broker died or gave up). The reconciler abandons them."""
    with cat.read() as conn:
        rows = conn.execute(
            select(*_BLOCK_COLUMNS)
            .where(BlockModel.state == BlockState.PENDING, BlockModel.created_at < before)
            .order_by(BlockModel.created_at)
            .limit(limit)
        )
        return [BlockRow(*r) for r in rows]


def known_object_keys(cat: Catalog, object_keys: Iterable[str]) -> set[str]:
    """The subset of `object_keys` that the catalog knows, as a block or a remote segment (object or index).
    For the reconciler: one statement per 500 keys of a bucket listing, each an index probe per key."""
    keys = list(dict.fromkeys(object_keys))
    known: set[str] = set()
    with cat.read() as conn:
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            query = select(BlockModel.object_key).where(BlockModel.object_key.in_(chunk)).union_all(
                select(SegmentModel.object_key).where(SegmentModel.object_key.in_(chunk)),
                select(SegmentModel.index_object_key).where(SegmentModel.index_object_key.in_(chunk)),
            )
            known.update(conn.execute(query).scalars())
    return known


def object_key_known(cat: Catalog, object_key: str) -> bool:
    return object_key in known_object_keys(cat, [object_key])
