"""Where seq N of a partition is: one remote segment, one block run, or nowhere, answered in one transaction.

A remote compaction swaps a partition's locations (runs and segments for new segments) in one transaction, and a
copy replaces runs by a segment in one transaction too: a reader that looked for the segment in one statement and
the run in another could see neither (the swap committed between them) and report a hole the catalog never had.
`locate` asks both in one snapshot (REPEATABLE READ on PostgreSQL, one deferred transaction on SQLite), and when
neither answers it reads the partition's bounds in that same snapshot, so `Nowhere.is_hole` is what
`tiered catalog check` (tiered.catalog.check) would say of that seq at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sqlalchemy import Connection, func, literal_column, select


from tiered.catalog.blocks import RunLocation, pending_locations, run_rows_from, runs_from
from tiered.catalog.engine import Catalog
from tiered.catalog.models import PartitionModel, SegmentModel
from tiered.catalog.segments import SegmentRow
from tiered.catalog.states import SegmentState

_SEGMENT_COLUMNS = tuple(getattr(SegmentModel, f.name) for f in fields(SegmentRow))
# Spelled as a literal, like ix_segments_lookup's predicate, so that the planners match the partial index.
_READABLE = SegmentModel.state == literal_column(f"'{SegmentState.COPY_FINISHED}'")


@dataclass(frozen=True, slots=True)
class InSegment:
    """A readable (COPY_FINISHED) remote segment answers for the seq."""

    row: SegmentRow


@dataclass(frozen=True, slots=True)
class InRun:
    """A committed block run answers for the seq (expanded or not: tiered.catalog.blocks)."""

    run: RunLocation


@dataclass(frozen=True, slots=True)
class Nowhere:
    """No location answers for the seq; the partition's bounds as the same transaction saw them."""

    seq: int
    first_available_seq: int
    committed_seq: int  # the catalog's high-water mark

    @property
    def is_hole(self) -> bool:
        """Whether the seq is history the catalog says it holds (first available <= seq <= committed): a seq
        `tiered catalog check` would report as having no location. Below the first available seq, retention took
        it; above the committed seq, it is not history yet."""
        return 0 < self.first_available_seq <= self.seq <= self.committed_seq


Location = InSegment | InRun | Nowhere


def locate(cat: Catalog, topic: str, partition: int, seq: int) -> Location:
    """Where `seq` of the partition is, in one snapshot: the remote segment answering for it, else the block run,
    else Nowhere with the partition's bounds. Two index probes (ix_segments_lookup, the runs' key), a third only
    when neither answers, and a look at the unexpanded blocks (ix_blocks_runs_pending) only when the seq is
    committed history none of them answered for."""
    with cat.snapshot() as conn:
        segments = _segments_from(conn, topic, partition, seq, 1)
        if segments and segments[0].holds(seq):
            return InSegment(segments[0])
        rows = run_rows_from(conn, topic, partition, seq, 1)
        if rows.runs and rows.runs[0].holds(seq):
            return InRun(rows.runs[0])
        bounds = conn.execute(
            select(PartitionModel.first_available_seq, PartitionModel.hwmark_seq)
            .where(PartitionModel.topic == topic, PartitionModel.partition == partition)
        ).first()
        first_available, committed = bounds if bounds is not None else (0, 0)
        if rows.unexpanded and seq <= committed:
            for run in pending_locations(conn, topic, partition):
                if run.holds(seq):
                    return InRun(run)
    return Nowhere(seq, first_available, committed)


@dataclass(frozen=True, slots=True)
class Locations:
    """Where the seqs of a range are, as one snapshot saw them (`locations`)."""

    segments: list[SegmentRow]  # readable remote segments reaching into the range, in seq order
    runs: list[RunLocation]  # committed runs reaching into the range above `highest_copied_seq`, in seq order
    highest_copied_seq: int  # the highest seq a readable remote segment holds (0: none)


def locations(cat: Catalog, topic: str, partition: int, first: int, last: int, *, first_page: int = 64,
              page: int = 1000) -> Locations:
    """Every location answering for seqs first..last of the partition, in one snapshot: its readable remote segments,
    and the committed runs above the highest copied seq (runs at or below it are pruned by the copies, or about to
    be). A copy or a compaction swap commits wholly before or after the snapshot, so no seq falls between two
    listings. Pages grow from `first_page` to `page` rows: a narrow range costs one small page."""
    with cat.snapshot() as conn:
        copied = conn.execute(
            select(func.coalesce(func.max(SegmentModel.last_seq), 0))
            .where(SegmentModel.topic == topic, SegmentModel.partition == partition)
            .where(_READABLE)
        ).scalar_one()
        segments = _pages(lambda at, limit: _segments_from(conn, topic, partition, at, limit),
                          first, last, lambda row: row.base_seq, first_page, page)
        runs = _pages(lambda at, limit: runs_from(conn, topic, partition, at, limit),
                      max(first, copied + 1), last, lambda run: run.first_seq, first_page, page)
    return Locations(segments, runs, copied)


def _pages(fetch, first: int, last: int, start_of, first_page: int, page: int) -> list:
    out: list = []
    at, limit = first, min(first_page, page)
    while at <= last:
        rows = fetch(at, limit)
        for row in rows:
            if start_of(row) > last:
                return out
            out.append(row)
        if len(rows) < limit:
            return out
        at = rows[-1].last_seq + 1
        limit = min(limit * 4, page)
    return out


def _segments_from(conn: Connection, topic: str, partition: int, seq: int, limit: int) -> list[SegmentRow]:
    """Up to `limit` readable segments with last_seq >= seq, in seq order (ix_segments_lookup)."""
    rows = conn.execute(
        select(*_SEGMENT_COLUMNS)
        .where(SegmentModel.topic == topic, SegmentModel.partition == partition, SegmentModel.last_seq >= seq)
        .where(_READABLE)
        .order_by(SegmentModel.last_seq)
        .limit(limit)
    )
    return [SegmentRow(*row) for row in rows]
