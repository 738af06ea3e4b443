"""Remote segments replaced by their compacted versions (docs/compaction.md, "Remote segments"), in one transaction.

A compaction of remote segments uploads new objects first (under keys the catalog does not know: `first_unused_keys`),
then `swap_compacted_segments` swaps them in:
- the old rows, a run of readable (COPY_FINISHED) segments, leave the `segments` table;
- their objects (`.ilog` and `.index`) become `deleting` rows of the `blocks` table, with `delete_after` a grace
  period away: the existing two-phase deletion (tiered.tiering.recovery.reconciler.sweep_deleted_blocks) removes them then,
  so a reader that looked the old rows up before the swap still reads them (the grace outlasts every cache of
  catalog lookups). The `blocks` table is the catalog's list of objects waiting for their sweep; such rows have no
  runs;
- the new rows are readable at once, answer for exactly the seqs the old ones answered for (the first from the old
  first's from_seq, each other one from the seq after the one before), and the partition's remote_bytes changes
  by the difference.
So every seq from the first available seq to the high-water mark keeps exactly one location (tiered.catalog.check).

History held as block runs (a topic with `remote.copy=false`, whose sealed segments are never copied) is swapped by
`swap_compacted_locations`: the new segments replace every location answering for their seqs, readable segments
(as above) and committed runs alike. The runs are pruned in the same transaction
(tiered.catalog.blocks.prune_runs_in), which marks `deleting` only the blocks left without any run: a block holds
runs of other partitions too, and stays while one of them references it.

The swap is fenced by the leader epoch and checks that the old rows are still there, readable and contiguous, and
that the new ones tile their seqs exactly; otherwise it raises and changes nothing (retention or another swap got
there first; the new objects are then orphans, which the reconciler deletes after the grace period).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert

from sqlalchemy import Connection, select

from tiered.catalog.blocks import DEFAULT_DELETE_GRACE, expand_pending_of, known_object_keys, prune_runs_in
from tiered.catalog.engine import Catalog, utcnow
from tiered.catalog.errors import CatalogError
from tiered.catalog.models import BlockModel, BlockRunModel, SegmentModel
from tiered.catalog.segments import (
    SegmentMeta,
    SegmentRow,
    _add_remote_bytes,
    _check_epoch,
    _key,
    _lock_partition,
    _COLUMNS,
    _locked_row,
    _state_in,
    readable_segments_from,
)
from tiered.catalog.states import BlockState, SegmentState


class SwapRefused(CatalogError):
    """The old segments are not (any more) the readable run the swap names, or the new ones do not tile them."""


@dataclass(frozen=True, slots=True)
class SwapResult:
    removed: list[SegmentRow]  # the old rows, oldest first
    added: list[SegmentRow]  # the new rows, oldest first
    objects_deleting: int  # old objects now waiting for their sweep (blocks left without runs included)
    runs_removed: int = 0
    run_bytes: int = 0  # of the runs removed

    @property
    def bytes_before(self) -> int:
        return sum(r.total_bytes for r in self.removed) + self.run_bytes

    @property
    def bytes_after(self) -> int:
        return sum(r.total_bytes for r in self.added)


def swap_compacted_segments(
    cat: Catalog, topic: str, partition: int, leader_epoch: int, old_bases: Sequence[int], new: Sequence[SegmentMeta],
    *, broker_id: int, grace: timedelta = DEFAULT_DELETE_GRACE, now: datetime | None = None,
) -> SwapResult:
    """Replaces the readable segments based at `old_bases` (consecutive, oldest first) by `new` (module docstring).
    Raises StaleEpoch, SwapRefused. A retry after the swap landed raises SwapRefused (the old rows are gone)."""
    if not old_bases or not new:
        raise SwapRefused("a swap needs old and new segments")
    at = utcnow(now)
    with cat.write() as conn:
        _check_epoch(_lock_partition(conn, topic, partition), leader_epoch)
        old: list[SegmentRow] = []
        for base in old_bases:
            row = _locked_row(conn, topic, partition, base)
            if row is None or row.state != SegmentState.COPY_FINISHED:
                raise SwapRefused(f"{topic}/{partition}: segment {base} is not readable "
                                  f"({row.state if row else 'no row'})")
            if old and row.from_seq != old[-1].last_seq + 1:
                raise SwapRefused(f"{topic}/{partition}: segment {base} does not follow {old[-1].last_seq}")
            old.append(row)
        _check_tiling(topic, partition, old, new)
        _retire_segments(conn, old, broker_id, at, grace)
        added = _insert_new(conn, new, old[0].from_seq, at)
        result = SwapResult(old, added, 2 * len(old))
        _add_remote_bytes(conn, topic, partition, result.bytes_after - result.bytes_before)
    return result


def swap_compacted_locations(
    cat: Catalog, topic: str, partition: int, leader_epoch: int, new: Sequence[SegmentMeta], *, broker_id: int,
    grace: timedelta = DEFAULT_DELETE_GRACE, now: datetime | None = None,
) -> SwapResult:
    """Replaces every location (readable segment or committed run) answering for a seq in [first new base, last new
    last] by `new` (module docstring). The old locations must tile exactly that range: the first answers for the
    first new base and holds no record below it, each next one follows the one before, the last ends where the new
    ones end. Raises StaleEpoch, SwapRefused; a retry after the swap landed raises SwapRefused (the range then holds
    the new segments, which do not hold what a compaction output replaces: the caller's groups are planned again)."""
    if not new:
        raise SwapRefused("a swap needs new segments")
    low, high = new[0].base_seq, new[-1].last_seq
    at = utcnow(now)
    with cat.write() as conn:
        _check_epoch(_lock_partition(conn, topic, partition), leader_epoch)
        old = [SegmentRow(*r) for r in conn.execute(
            select(*_COLUMNS).where(SegmentModel.topic == topic, SegmentModel.partition == partition,
                                    _state_in((SegmentState.COPY_FINISHED,)), SegmentModel.last_seq >= low,
                                    SegmentModel.from_seq <= high).with_for_update())]
        expand_pending_of(conn, topic, partition, low, high)  # the runs of the range as rows, to read and prune
        runs = conn.execute(
            select(BlockRunModel.from_seq, BlockRunModel.first_seq, BlockRunModel.last_seq, BlockRunModel.length_bytes)
            .where(BlockRunModel.topic == topic, BlockRunModel.partition == partition, BlockRunModel.last_seq >= low,
                   BlockRunModel.from_seq <= high)).all()
        spans = sorted([(r.from_seq, r.base_seq, r.last_seq) for r in old] +
                       [(r.from_seq, r.first_seq, r.last_seq) for r in runs])
        if not spans or not spans[0][0] <= low <= spans[0][1] or spans[-1][2] != high or any(
                b[0] != a[2] + 1 for a, b in zip(spans, spans[1:])):
            raise SwapRefused(f"{topic}/{partition}: the locations of {low}-{high} do not tile it: {spans[:3]}...")
        _check_new(topic, partition, new, low)
        _retire_segments(conn, old, broker_id, at, grace)
        pruned = prune_runs_in(conn, topic, partition, spans[0][0], high, grace=grace, now=at)
        if pruned.runs_deleted != len(runs):  # another transaction pruned some meanwhile
            raise SwapRefused(f"{topic}/{partition}: {pruned.runs_deleted} of {len(runs)} runs of {low}-{high} pruned")
        added = _insert_new(conn, new, spans[0][0], at)
        result = SwapResult(sorted(old, key=lambda r: r.base_seq), added, 2 * len(old) + pruned.blocks_marked,
                            len(runs), sum(r.length_bytes for r in runs))
        _add_remote_bytes(conn, topic, partition, result.bytes_after - sum(r.total_bytes for r in old))
    return result


def _retire_segments(conn: Connection, old: Sequence[SegmentRow], broker_id: int, at: datetime,
                     grace: timedelta) -> None:
    """The old rows leave `segments`; their objects become `deleting` blocks, swept after the grace period."""
    for row in old:
        for object_key, size in ((row.object_key, row.size_bytes), (row.index_object_key, row.index_size_bytes)):
            conn.execute(insert(BlockModel).values(
                object_key=object_key, state=BlockState.DELETING, broker_id=broker_id, size_bytes=size,
                created_at=at, committed_at=None, delete_after=at + grace))
        conn.execute(delete(SegmentModel).where(_key(row.topic, row.partition, row.base_seq)))


def _insert_new(conn: Connection, new: Sequence[SegmentMeta], from_seq: int, at: datetime) -> list[SegmentRow]:
    """The new rows, readable at once: the first answers from `from_seq`, each other one from the seq after the
    one before."""
    added: list[SegmentRow] = []
    for meta in new:
        row = SegmentRow(**asdict(meta), state=str(SegmentState.COPY_FINISHED), updated_at=at,
                         from_seq=added[-1].last_seq + 1 if added else from_seq)
        conn.execute(insert(SegmentModel).values(**asdict(row)))
        added.append(row)
    return added


def _check_new(topic: str, partition: int, new: Sequence[SegmentMeta], low: int) -> None:
    """Each new segment starts past the one before (a jump between two is answered by the later one)."""
    expected = low
    for meta in new:
        if ((meta.topic, meta.partition) != (topic, partition) or meta.base_seq < expected
                or meta.last_seq < meta.base_seq):
            raise SwapRefused(f"{topic}/{partition}: new segment {meta.base_seq}-{meta.last_seq} does not continue "
                              f"at {expected}")
        expected = meta.last_seq + 1


def _check_tiling(topic: str, partition: int, old: list[SegmentRow], new: Sequence[SegmentMeta]) -> None:
    """The first new segment starts where the old ones did, the last ends where they did, each starts past the one
    before (a jump in seqs between two is answered by the later one, as between the old ones)."""
    expected = old[0].base_seq
    for i, meta in enumerate(new):
        starts_right = meta.base_seq == expected if i == 0 else meta.base_seq >= expected
        if (meta.topic, meta.partition) != (topic, partition) or not starts_right or meta.last_seq < meta.base_seq:
            raise SwapRefused(f"{topic}/{partition}: new segment {meta.base_seq}-{meta.last_seq} does not continue "
                              f"at {expected}")
        expected = meta.last_seq + 1
    if expected != old[-1].last_seq + 1:
        raise SwapRefused(f"{topic}/{partition}: the new segments end at {expected - 1}, the old at {old[-1].last_seq}")


def first_unused_keys(cat: Catalog, candidates: Sequence[tuple[str, str]]) -> int | None:
    """The index of the first (object key, index key) pair neither of whose keys the catalog knows (as a segment or
    a block, live or waiting for its sweep), None if all are known: a new object never overwrites an old one that
    may still be read. One statement."""
    known = known_object_keys(cat, [k for pair in candidates for k in pair])
    return next((i for i, pair in enumerate(candidates) if not known.intersection(pair)), None)


def readable_segments(cat: Catalog, topic: str, partition: int, *, page: int = 1000) -> list[SegmentRow]:
    """Every readable (COPY_FINISHED) segment of the partition, oldest first. Pages by seq
    (`readable_segments_from`), so that a swap landing between two pages cannot hide a segment."""
    out: list[SegmentRow] = []
    seq = 0
    while True:
        rows = readable_segments_from(cat, topic, partition, seq, page)
        out.extend(rows)
        if len(rows) < page:
            return out
        seq = rows[-1].last_seq + 1
