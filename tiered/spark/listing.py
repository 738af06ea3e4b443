"""The driver's side of a replay: what the catalog holds for a topic, planned into splits (tiered.spark.planning).

Only the driver opens the catalog; executors get splits naming objects and byte ranges. Every query is a named
function of tiered.catalog, each an index scan that pages (segments and runs 64 rows first, then up to 1000 at a
time), so planning costs grow with the range read, not with the topic's age.

Read order against the segment copier, per partition: the highest copied seq first (H0), then the runs above H0,
then the segments, then the highest copied seq again (H1); runs are read only above H1. A copy that finishes meanwhile
prunes runs at or below its segment's last seq only after the segment is COPY_FINISHED, so whatever the listing of
runs missed is in a segment listed after it; the pruned runs' blocks stay in the bucket for the deletion grace
period, longer than a planned read takes to start.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass

from tiered.catalog import Catalog
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import locate
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog import topics as catalog_topics
from tiered.catalog.partitions import PartitionState
from tiered.spark.options import OptionError, ReadOptions
from tiered.spark.planning import (
    DEFAULT_MAX_SPLIT_BYTES,
    RunEntry,
    SegmentEntry,
    SeqRange,
    Split,
    TimeRange,
    order_splits,
    plan_partition,
)

# Catalog pages grow from FIRST_PAGE_ROWS to PAGE_ROWS rows: a narrow range costs one small page, a whole topic
# few round trips.
FIRST_PAGE_ROWS = 64
PAGE_ROWS = 1000


class UnknownTopicError(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    partition: int
    seqs: SeqRange  # the seqs planned: the range asked, capped at the high-water mark when planned
    splits: list[Split]


def topic_partitions(cat: Catalog, topic: str) -> list[PartitionState]:
    """The topic's partitions with their high-water marks, in partition order. Raises UnknownTopicError."""
    if catalog_topics.get_topic(cat, topic) is None:
        raise UnknownTopicError(f"topic {topic!r} is not in the catalog")
    return catalog_partitions.get_partition_states(cat, topic)


def plan_read(
    options: ReadOptions,
    *,
    partitions: Iterable[int] | None = None,
    seqs: SeqRange | None = None,
    times: TimeRange | None = None,
) -> list[Split]:
    """The splits of a read of `options` (narrowed by pushed filters where given), in (partition, seq) order.

    Opens the catalog for the call only. Raises UnknownTopicError, and OptionError for a partition the option
    names but the topic lacks (partitions from filters that the topic lacks just read nothing).
    """
    with closing(Catalog.open(options.catalog_url, pool_size=1, max_overflow=0)) as cat:
        if options.partitions is not None:
            known = {state.partition for state in topic_partitions(cat, options.topic)}
            if missing := sorted(options.partitions - known):
                raise OptionError(f"topic {options.topic!r} has no partition {', '.join(map(str, missing))}")
        plans = plan_topic(
            cat,
            options.topic,
            partitions=options.partitions if partitions is None else partitions,
            seqs=options.seqs if seqs is None else seqs,
            times=options.times if times is None else times,
            max_split_bytes=options.max_split_bytes,
        )
    return order_splits([split for plan in plans for split in plan.splits])


def plan_topic(
    cat: Catalog,
    topic: str,
    *,
    partitions: Iterable[int] | None = None,
    seqs: SeqRange = SeqRange(),
    times: TimeRange = TimeRange(),
    max_split_bytes: int = DEFAULT_MAX_SPLIT_BYTES,
    ends: dict[int, int] | None = None,
) -> list[PartitionPlan]:
    """Plans a read of `seqs` and `times` of the topic's `partitions` (None: all; numbers the topic lacks are
    ignored). The read ends at each partition's high-water mark as the catalog has it now, or at `ends[p]`
    (a streaming batch's end offset, inclusive) where given. Raises UnknownTopicError."""
    states = topic_partitions(cat, topic)
    wanted = None if partitions is None else set(partitions)
    plans = []
    for state in states:
        if wanted is not None and state.partition not in wanted:
            continue
        end = state.hwmark_seq if ends is None or state.partition not in ends else ends[state.partition]
        part_seqs = seqs.narrow(last=end)
        splits: list[Split] = []
        if not part_seqs.empty and not times.empty:
            splits = plan_partition_from_catalog(cat, topic, state.partition, part_seqs, times, max_split_bytes)
        plans.append(PartitionPlan(state.partition, part_seqs, splits))
    return plans


def plan_partition_from_catalog(
    cat: Catalog, topic: str, partition: int, seqs: SeqRange, times: TimeRange, max_split_bytes: int
) -> list[Split]:
    # One snapshot (tiered.catalog.locate.locations): a copy or a compaction swap lands wholly before or after it.
    found = locate.locations(cat, topic, partition, seqs.first, seqs.last, first_page=FIRST_PAGE_ROWS,
                             page=PAGE_ROWS)
    segments = [_segment_entry(row) for row in found.segments]
    runs = [_run_entry(run) for run in found.runs]
    return plan_partition(topic, partition, segments, runs, found.highest_copied_seq, seqs, times, max_split_bytes)


def _segment_entry(row) -> SegmentEntry:
    return SegmentEntry(row.base_seq, row.last_seq, row.object_key, row.index_object_key, row.size_bytes,
                        row.min_ts_ms, row.max_ts_ms)


def _run_entry(run) -> RunEntry:
    return RunEntry(run.first_seq, run.last_seq, run.object_key, run.position, run.length_bytes, run.min_ts_ms,
                    run.max_ts_ms)


def list_segments(cat: Catalog, topic: str, partition: int, seqs: SeqRange) -> list[SegmentEntry]:
    """The COPY_FINISHED segments overlapping `seqs`, in seq order.

    Each page is one statement, from the seq after the last one listed (catalog_segments.readable_segments_from):
    a compaction swap between two pages leaves the earlier page naming the old objects (they stay for the grace
    period) and the next one starting at a new segment that may begin below that seq; planning reads it from that
    seq on, so every seq is read once, from the old objects or the new ones.
    """
    out: list[SegmentEntry] = []
    next_seq = seqs.first
    limit = min(FIRST_PAGE_ROWS, PAGE_ROWS)
    while not SeqRange(next_seq, seqs.last).empty:
        rows = catalog_segments.readable_segments_from(cat, topic, partition, next_seq, limit)
        for row in rows:
            if row.base_seq > seqs.last:
                return out
            out.append(
                SegmentEntry(
                    row.base_seq, row.last_seq, row.object_key, row.index_object_key, row.size_bytes,
                    row.min_ts_ms, row.max_ts_ms,
                )  # fmt: skip
            )
        if len(rows) < limit:
            return out
        next_seq = rows[-1].last_seq + 1
        limit = min(limit * 4, PAGE_ROWS)
    return out


def list_runs(cat: Catalog, topic: str, partition: int, seqs: SeqRange) -> list[RunEntry]:
    """The committed runs overlapping `seqs`, in seq order, with their timestamp bounds (planning prunes by them)."""
    out: list[RunEntry] = []
    from_seq = seqs.first
    limit = min(FIRST_PAGE_ROWS, PAGE_ROWS)
    while from_seq <= seqs.last:
        rows = catalog_blocks.runs_for_range(cat, topic, partition, from_seq, limit)
        for run in rows:
            if run.first_seq > seqs.last:
                return out
            out.append(RunEntry(run.first_seq, run.last_seq, run.object_key, run.position, run.length_bytes,
                                run.min_ts_ms, run.max_ts_ms))
        if len(rows) < limit:
            return out
        from_seq = rows[-1].last_seq + 1
        limit = min(limit * 4, PAGE_ROWS)
    return out
