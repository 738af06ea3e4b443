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

from sqlalchemy import literal_column, select

from tiered.catalog.blocks import RunLocation
from tiered.catalog.engine import Catalog
from tiered.catalog.models import BlockModel, BlockRunModel, PartitionModel, SegmentModel
from tiered.catalog.segments import SegmentRow
from tiered.catalog.states import SegmentState

_SEGMENT_COLUMNS = tuple(getattr(SegmentModel, f.name) for f in fields(SegmentRow))
_RUN_COLUMNS = (BlockRunModel.from_seq, BlockRunModel.first_seq, BlockRunModel.last_seq, BlockRunModel.position,
                BlockRunModel.length_bytes, BlockRunModel.block_id, BlockModel.object_key, BlockRunModel.min_ts_ms,
                BlockRunModel.max_ts_ms, BlockModel.size_bytes)  # RunLocation's fields after topic and partition
# Spelled as a literal, like ix_segments_lookup's predicate, so that the planners match the partial index.
_READABLE = SegmentModel.state == literal_column(f"'{SegmentState.COPY_FINISHED}'")


@dataclass(frozen=True, slots=True)
class InSegment:
    """A readable (COPY_FINISHED) remote segment answers for the seq."""

    row: SegmentRow


@dataclass(frozen=True, slots=True)
class InRun:
    """A committed block run answers for the seq."""

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
    when neither answers."""
    with cat.snapshot() as conn:
        row = conn.execute(
            select(*_SEGMENT_COLUMNS)
            .where(SegmentModel.topic == topic, SegmentModel.partition == partition, SegmentModel.last_seq >= seq)
            .where(_READABLE)
            .order_by(SegmentModel.last_seq)
            .limit(1)
        ).first()
        if row is not None and (segment := SegmentRow(*row)).holds(seq):
            return InSegment(segment)
        # No filter on the block's state: a run exists only while its block is committed (tiered.catalog.blocks).
        row = conn.execute(
            select(*_RUN_COLUMNS)
            .join(BlockModel, BlockModel.block_id == BlockRunModel.block_id)
            .where(BlockRunModel.topic == topic, BlockRunModel.partition == partition, BlockRunModel.last_seq >= seq)
            .order_by(BlockRunModel.last_seq)
            .limit(1)
        ).first()
        if row is not None and (run := RunLocation(topic, partition, *row)).holds(seq):
            return InRun(run)
        bounds = conn.execute(
            select(PartitionModel.first_available_seq, PartitionModel.hwmark_seq)
            .where(PartitionModel.topic == topic, PartitionModel.partition == partition)
        ).first()
    first_available, committed = bounds if bounds is not None else (0, 0)
    return Nowhere(seq, first_available, committed)
