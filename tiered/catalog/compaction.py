"""Remote segments replaced by their compacted versions (docs/compaction.md, "Remote segments"), in one transaction.

A compaction of remote segments uploads new objects first (under keys the catalog does not know: `first_unused_keys`),
then `swap_compacted_segments` swaps them in:
- the old rows, a run of readable (COPY_FINISHED) segments, leave the `segments` table;
- their objects (`.ilog` and `.index`) become `deleting` rows of the `blocks` table, with `delete_after` a grace
  period away: the existing two-phase deletion (tiered.tiering.reconciler.sweep_deleted_blocks) removes them then,
  so a reader that looked the old rows up before the swap still reads them (the grace outlasts every cache of
  catalog lookups). The `blocks` table is the catalog's list of objects waiting for their sweep; such rows have no
  runs;
- the new rows are readable at once, answer for exactly the seqs the old ones answered for (the first from the old
  first's from_seq, each other one from the seq after the one before), and the partition's remote_bytes changes
  by the difference.
So every seq from the first available seq to the high-water mark keeps exactly one location (tiered.catalog.check).

The swap is fenced by the leader epoch and checks that the old rows are still there, readable and contiguous, and
that the new ones tile their seqs exactly; otherwise it raises and changes nothing (retention or another swap got
there first; the new objects are then orphans, which the reconciler deletes after the grace period).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert

from tiered.catalog.blocks import DEFAULT_DELETE_GRACE, known_object_keys
from tiered.catalog.engine import Catalog, utcnow
from tiered.catalog.errors import CatalogError
from tiered.catalog.models import BlockModel, SegmentModel
from tiered.catalog.segments import (
    SegmentMeta,
    SegmentRow,
    _add_remote_bytes,
    _check_epoch,
    _key,
    _lock_partition,
    _locked_row,
    list_segments,
)
from tiered.catalog.states import BlockState, SegmentState


class SwapRefused(CatalogError):
    """The old segments are not (any more) the readable run the swap names, or the new ones do not tile them."""


@dataclass(frozen=True, slots=True)
class SwapResult:
    removed: list[SegmentRow]  # the old rows, oldest first
    added: list[SegmentRow]  # the new rows, oldest first
    objects_deleting: int  # old objects now waiting for their sweep

    @property
    def bytes_before(self) -> int:
        return sum(r.total_bytes for r in self.removed)

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
        for row in old:
            for object_key, size in ((row.object_key, row.size_bytes), (row.index_object_key, row.index_size_bytes)):
                conn.execute(insert(BlockModel).values(
                    object_key=object_key, state=BlockState.DELETING, broker_id=broker_id, size_bytes=size,
                    created_at=at, committed_at=None, delete_after=at + grace))
            conn.execute(delete(SegmentModel).where(_key(topic, partition, row.base_seq)))
        added: list[SegmentRow] = []
        for meta in new:
            row = SegmentRow(**asdict(meta), state=str(SegmentState.COPY_FINISHED), updated_at=at,
                             from_seq=added[-1].last_seq + 1 if added else old[0].from_seq)
            conn.execute(insert(SegmentModel).values(**asdict(row)))
            added.append(row)
        result = SwapResult(old, added, 2 * len(old))
        _add_remote_bytes(conn, topic, partition, result.bytes_after - result.bytes_before)
    return result


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
    """Every readable (COPY_FINISHED) segment of the partition, oldest first."""
    out: list[SegmentRow] = []
    after = 0
    while True:
        rows = list_segments(cat, topic, partition, states=(SegmentState.COPY_FINISHED,), after_base_seq=after,
                             limit=page)
        out.extend(rows)
        if len(rows) < page:
            return out
        after = rows[-1].base_seq
