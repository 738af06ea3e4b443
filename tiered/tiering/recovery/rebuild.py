"""Rebuilding the catalog from the bucket alone: `tiered catalog rebuild` (docs/architecture.md "Objects").

Blocks are self-describing (their footer lists each run) and remote segment keys carry topic, partition, seq range
and freeze time, so the bucket holds everything the catalog indexes except what was never in it:

    bucket                                      catalog
    blocks/<hash>/<broker>/<ulid>.blk  ──tail GET: footer──>  blocks (committed; created_at from the ULID,
                                                              committed_at from the object's time) + block_runs
    segments/<t>/<p>/<base>-<last>_<ts>.ilog + .index  ──>   segments COPY_FINISHED (sizes from the listing,
                                                              leader epoch 0), partitions.remote_bytes
    topics/<topic>.json  ──GET──>  topics: partition count, config_text and creation time as created
                                    (tiered.tiering.objects.topic_objects)
    all  ──>  topics without a topic object (written by brokers before these objects existed and not started
              since): partition count = highest partition seen + 1, config_text empty, both reported;
              partitions (no leader, epoch 0; hwmark = highest seq of any run or segment; first available = lowest
              seq still held after the prune below)

Then, as the live broker does when a copy finishes, the block runs that lie inside what a remote segment answers for
are pruned, and blocks left without runs become `deleting` (the sweeper deletes them after the grace).

Segment timestamps: the key has none. With `read_timestamps` every `.ilog` is read whole (one full GET each) and
min/max come from its bundles; otherwise they are recorded as unknown, the widest range (0, UNKNOWN_MAX_TS_MS), so
that a time-range replay never skips a segment it should read.

What the bucket cannot tell, and the rule used instead:
- Whether a block was ever committed. An upload whose commit failed (a fenced leader's, or a broker that crashed
  between PUT and commit) may still be in the bucket until swept, with the same seqs as a committed block. Runs of
  one partition must not overlap, so when they do the run of the higher leader epoch wins (block format 2 records
  it; then the newest block by ULID time) and the other run is dropped: the records were re-uploaded in a later
  block, or the seqs were reassigned by a later leader. A block left with no run is recorded `deleting`.
  Overlapping segments are resolved by the newest object; the losing objects are unknown to the rebuilt catalog
  and the reconciler deletes them after the grace period. Blocks of format 1 carry no epoch (0): among them the
  newest wins, so a fenced leader's block uploaded after the new leader's for the same seqs would win.
- Objects whose deletion was in progress: a remote segment whose `.ilog` or `.index` is missing is skipped (and
  reported); one whose deletion had not begun comes back, and remote retention expires it again.

Run it with the brokers stopped, into an empty catalog built by the migrations (CatalogNotEmpty otherwise, unless
`force`, which first deletes every topic, partition, block and segment row). It is not one transaction: after a
failure, run it again with `force`.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Protocol, TypeVar

from tiered.catalog import Catalog
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import restore as catalog_restore
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import DEFAULT_DELETE_GRACE, RunRow
from tiered.catalog.engine import utcnow
from tiered.catalog.restore import PartitionBounds, RestoredBlock
from tiered.catalog.segments import SegmentMeta
from tiered.protocol.bundle import maybe_record, timestamp_bounds
from tiered.protocol.errors import ProtocolError
from tiered.tiering.objects import keys
from tiered.tiering.blocks.block_format import FOOTER_TRAILER_BYTES, block_tail_bytes, read_block_footer
from tiered.tiering.objects.store import ObjectInfo, ObjectNotFound, ObjectStore
from tiered.tiering.objects.topic_objects import TopicObject, read_topic_objects
from tiered.topic_partition import TopicPartition
from tiered.tiering.objects.meter import CATALOG

TAIL_GUESS_BYTES = 4096  # one GET reads the footer of a block of up to ~60 runs; a bigger footer takes a second
UNKNOWN_MAX_TS_MS = 2**63 - 1  # BIGINT's max: "any time", for segments whose timestamps were not read
INSERT_BATCH = 500  # blocks, or remote segments, per catalog transaction
LIST_BATCH = 1000  # objects listed before their reads are awaited

T = TypeVar("T")
R = TypeVar("R")


class CatalogNotEmpty(Exception):
    """The target catalog already holds topics, blocks or segments (`force` deletes them first)."""


class ProgressSink(Protocol):
    def add(self, n: int = 1) -> None: ...


@dataclass(frozen=True, slots=True)
class FoundBlock:
    object_key: str
    broker_id: int
    created_at: datetime  # from the block id (a ULID)
    last_modified: datetime
    size_bytes: int
    runs: tuple[RunRow, ...]  # as the footer lists them


@dataclass(frozen=True, slots=True)
class FoundSegment:
    key: keys.SegmentKey
    object_key: str
    index_object_key: str
    size_bytes: int
    index_size_bytes: int
    last_modified: datetime
    min_ts_ms: int
    max_ts_ms: int


@dataclass
class RebuildReport:
    topics: int = 0
    partitions: int = 0
    topics_without_object: list[str] = field(default_factory=list)  # partition count from data, config unknown
    blocks: int = 0  # committed, runs included
    blocks_abandoned: int = 0  # every run superseded by a newer block: recorded `deleting`
    runs: int = 0
    runs_superseded: int = 0
    runs_expired: int = 0  # below their partition's start (retention expired them; their block awaited its sweep)
    segments_expired: int = 0
    runs_pruned: int = 0  # covered by remote segments
    blocks_emptied: int = 0  # left without runs by the prune: `deleting`
    segments: int = 0
    segments_superseded: list[str] = field(default_factory=list)
    incomplete_segments: list[str] = field(default_factory=list)  # an .ilog without its .index, or the reverse
    damaged: list[str] = field(default_factory=list)  # unreadable block footers or segment bundles
    foreign: list[str] = field(default_factory=list)  # keys under blocks/ or segments/ that are not ours

    def summary(self) -> str:
        lines = [
            f"topics {self.topics}, partitions {self.partitions}, "
            f"{self.topics - len(self.topics_without_object)} restored with their config",
            f"blocks {self.blocks} committed with {self.runs} runs, {self.blocks_abandoned} abandoned "
            f"({self.runs_superseded} runs superseded by newer blocks)",
            f"remote segments {self.segments} ({len(self.segments_superseded)} superseded, "
            f"{len(self.incomplete_segments)} incomplete)",
            f"runs pruned below remote segments {self.runs_pruned}, blocks emptied {self.blocks_emptied}",
        ]
        for what, items in (("topic without a config object (config lost)", self.topics_without_object),
                            ("damaged", self.damaged), ("incomplete segment", self.incomplete_segments),
                            ("superseded segment", self.segments_superseded), ("not ours", self.foreign)):
            lines += [f"{what}: {key}" for key in items[:20]]
            if len(items) > 20:
                lines.append(f"{what}: ... and {len(items) - 20} more")
        return "\n".join(lines)


async def rebuild_catalog(
    store: ObjectStore,
    catalog: Catalog,
    *,
    progress: ProgressSink | None = None,
    force: bool = False,
    read_timestamps: bool = False,
    concurrency: int = 16,
    grace: timedelta = DEFAULT_DELETE_GRACE,
    now: datetime | None = None,
) -> RebuildReport:
    """Fills `catalog` from the objects in `store` (module docstring). `progress.add(n)` counts objects read;
    `concurrency` bounds the GETs in flight; `grace` is how long blocks recorded `deleting` stay in the bucket."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    now = utcnow(now)
    if not await asyncio.to_thread(catalog_restore.catalog_is_empty, catalog):
        if not force:
            raise CatalogNotEmpty("the catalog is not empty (it holds topics, blocks or segments): a rebuild does "
                                  "not merge into them; --force deletes them first")
        await asyncio.to_thread(catalog_restore.clear_catalog, catalog)
    report = RebuildReport()
    topics, problems = await read_topic_objects(store, concurrency)
    report.damaged += problems
    found_blocks = await _read_blocks(store, report, progress, concurrency)
    found_segments = await _read_segments(store, report, progress, concurrency, read_timestamps)
    starts = await _read_starts(store, report)
    found_blocks, found_segments = _below_starts_removed(found_blocks, found_segments, starts, report)

    kept, abandoned = _resolve_runs(found_blocks, report)
    segments = _resolve_segments(found_segments, report)
    await _write(catalog, report, topics, kept, abandoned, segments, starts, grace, now)
    return report


# --- reading the bucket ------------------------------------------------------------------------------------------


async def _bounded_map(fn: Callable[[T], Awaitable[R]], items: Sequence[T], limit: asyncio.Semaphore) -> list[R]:
    async def one(item: T) -> R:
        async with limit:
            return await fn(item)

    return list(await asyncio.gather(*(one(item) for item in items)))


async def _read_blocks(
    store: ObjectStore, report: RebuildReport, progress: ProgressSink | None, concurrency: int
) -> list[FoundBlock]:
    limit = asyncio.Semaphore(concurrency)
    found: list[FoundBlock] = []

    async def read_page(page: list[ObjectInfo]) -> None:
        for block in await _bounded_map(lambda info: _read_block(store, info, report), page, limit):
            if block is not None:
                found.append(block)
        if progress is not None:
            progress.add(len(page))

    page: list[ObjectInfo] = []
    async for info in store.list(keys.blocks_prefix(), attribution=CATALOG):
        page.append(info)
        if len(page) == LIST_BATCH:
            await read_page(page)
            page = []
    if page:
        await read_page(page)
    return found


async def _read_block(store: ObjectStore, info: ObjectInfo, report: RebuildReport) -> FoundBlock | None:
    parsed = keys.parse_block_key(info.object_key)
    if parsed is None:
        report.foreign.append(info.object_key)
        return None
    size = info.size_bytes
    try:
        if size < FOOTER_TRAILER_BYTES:
            raise ProtocolError(f"block of {size} bytes is shorter than its trailer")
        tail = await store.get_range(info.object_key, max(0, size - TAIL_GUESS_BYTES), size, attribution=CATALOG)
        needed = block_tail_bytes(tail)
        if needed > len(tail):
            tail = await store.get_range(info.object_key, max(0, size - needed), size, attribution=CATALOG)
        runs = tuple(read_block_footer(tail, size))
    except ProtocolError as error:
        report.damaged.append(f"{info.object_key} ({error})")
        return None
    except ObjectNotFound:
        return None  # deleted since the listing (swept): nothing to index
    created_at = datetime.fromtimestamp(parsed.created_ms / 1000, timezone.utc)
    return FoundBlock(info.object_key, parsed.broker_id, created_at, info.last_modified, size, runs)


async def _read_segments(
    store: ObjectStore, report: RebuildReport, progress: ProgressSink | None, concurrency: int, read_timestamps: bool
) -> list[FoundSegment]:
    ilogs: dict[keys.SegmentKey, ObjectInfo] = {}
    indexes: dict[keys.SegmentKey, ObjectInfo] = {}
    async for info in store.list(keys.segments_prefix(), attribution=CATALOG):
        if (parsed := keys.parse_segment_key(info.object_key)) is not None:
            ilogs[parsed] = info
        elif (parsed := keys.parse_segment_index_key(info.object_key)) is not None:
            indexes[parsed] = info
        else:
            report.foreign.append(info.object_key)
        if progress is not None and not read_timestamps:
            progress.add()
    for key in sorted(ilogs.keys() ^ indexes.keys(), key=_segment_order):
        report.incomplete_segments.append((ilogs.get(key) or indexes[key]).object_key)
    complete = sorted(ilogs.keys() & indexes.keys(), key=_segment_order)

    async def read(key: keys.SegmentKey) -> FoundSegment | None:
        ilog, index = ilogs[key], indexes[key]
        low, high = 0, UNKNOWN_MAX_TS_MS
        if read_timestamps:
            try:
                low, high = segment_timestamp_bounds(await store.get(ilog.object_key, attribution=CATALOG))
            except ProtocolError as error:
                report.damaged.append(f"{ilog.object_key} ({error})")
                return None
            except ObjectNotFound:
                report.incomplete_segments.append(ilog.object_key)
                return None
            finally:
                if progress is not None:
                    progress.add(2)
        return FoundSegment(key, ilog.object_key, index.object_key, ilog.size_bytes, index.size_bytes,
                            ilog.last_modified, low, high)

    found = await _bounded_map(read, complete, asyncio.Semaphore(concurrency))
    return [segment for segment in found if segment is not None]


async def _read_starts(store: ObjectStore, report: RebuildReport) -> dict[TopicPartition, int]:
    """Each partition's first available seq as remote retention last wrote it (tiered.tiering.objects.keys)."""
    starts: dict[TopicPartition, int] = {}
    async for info in store.list(keys.starts_prefix(), attribution=CATALOG):
        where = keys.parse_partition_start_key(info.object_key)
        if where is None:
            report.foreign.append(info.object_key)
            continue
        try:
            starts[where] = int((await store.get(info.object_key, attribution=CATALOG)).decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            report.damaged.append(info.object_key)
        except ObjectNotFound:
            continue
    return starts


def _below_starts_removed(
    blocks: list[FoundBlock], segments: list[FoundSegment], starts: dict[TopicPartition, int], report: RebuildReport
) -> tuple[list[FoundBlock], list[FoundSegment]]:
    """Runs and remote segments wholly below their partition's start: history retention expired, whose objects were
    still waiting for their deletion. A block left without runs is recorded as abandoned (`deleting`)."""
    kept_blocks = []
    for block in blocks:
        runs = tuple(r for r in block.runs if r.last_seq >= starts.get(TopicPartition(r.topic, r.partition), 0))
        report.runs_expired += len(block.runs) - len(runs)
        kept_blocks.append(block if len(runs) == len(block.runs) else replace(block, runs=runs))
    kept_segments = [s for s in segments if s.key.last >= starts.get(s.key.tp, 0)]
    report.segments_expired += len(segments) - len(kept_segments)
    return kept_blocks, kept_segments


def _segment_order(key: keys.SegmentKey) -> tuple:
    return key.topic, key.partition, key.base, key.last, key.freeze_ts


def segment_timestamp_bounds(data: bytes) -> tuple[int, int]:
    """(min, max) message timestamp of a whole `.ilog`. Raises ProtocolError for anything but whole bundles."""
    view = memoryview(data)
    low, high = None, None
    position = 0
    while position < len(view):
        got = maybe_record(view, position)
        if got is None:
            raise ProtocolError("segment ends inside a bundle", position)
        bundle_low, bundle_high = timestamp_bounds(view[got[0] : got[1]])
        low = bundle_low if low is None else min(low, bundle_low)
        high = bundle_high if high is None else max(high, bundle_high)
        position = got[1]
    if low is None:
        raise ProtocolError("segment holds no bundle")
    return low, high


# --- resolving overlaps --------------------------------------------------------------------------------------------


class _Taken:
    """Disjoint seq ranges [first, last] already given to a newer object, in order."""

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.lasts: list[int] = []

    def take(self, first: int, last: int) -> bool:
        """Takes [first, last] unless it overlaps a range already taken."""
        i = bisect.bisect_left(self.firsts, first)
        if i < len(self.firsts) and self.firsts[i] <= last:
            return False
        if i > 0 and self.lasts[i - 1] >= first:
            return False
        self.firsts.insert(i, first)
        self.lasts.insert(i, last)
        return True


def _resolve_runs(
    found: list[FoundBlock], report: RebuildReport
) -> tuple[list[RestoredBlock], list[FoundBlock]]:
    """Highest leader epoch first (then newest block), each run kept unless such a block's run of the partition
    overlaps the seqs it answers for. Returns the blocks with the runs they keep (oldest first) and the blocks that
    keep none."""
    taken: dict[TopicPartition, _Taken] = defaultdict(_Taken)
    kept: list[RestoredBlock] = []
    abandoned: list[FoundBlock] = []
    order = lambda b: (max(r.leader_epoch for r in b.runs), b.created_at, b.object_key)  # noqa: E731
    for block in sorted(found, key=order, reverse=True):
        runs = [r for r in block.runs if taken[TopicPartition(r.topic, r.partition)].take(r.from_seq, r.last_seq)]
        if not block.runs:
            abandoned.append(block)
            continue
        report.runs_superseded += len(block.runs) - len(runs)
        if runs:
            kept.append(RestoredBlock(block.object_key, block.broker_id, block.size_bytes, block.created_at,
                                      block.last_modified, runs))
        else:
            abandoned.append(block)
    kept.reverse()
    abandoned.reverse()
    return kept, abandoned


def _resolve_segments(found: list[FoundSegment], report: RebuildReport) -> list[FoundSegment]:
    taken: dict[TopicPartition, _Taken] = defaultdict(_Taken)
    kept: list[FoundSegment] = []
    for segment in sorted(found, key=lambda s: (s.last_modified, s.key.freeze_ts, s.object_key), reverse=True):
        if taken[segment.key.tp].take(segment.key.base, segment.key.last):
            kept.append(segment)
        else:
            report.segments_superseded.append(segment.object_key)
    return sorted(kept, key=lambda s: _segment_order(s.key))


# --- writing the catalog -------------------------------------------------------------------------------------------


async def _write(
    catalog: Catalog,
    report: RebuildReport,
    topics: dict[str, TopicObject],
    kept: list[RestoredBlock],
    abandoned: list[FoundBlock],
    segments: list[FoundSegment],
    starts: dict[TopicPartition, int],
    grace: timedelta,
    now: datetime,
) -> None:
    partitions: dict[str, int] = {name: topic.partitions for name, topic in topics.items()}
    created: dict[str, datetime] = {name: topic.created_at for name, topic in topics.items()}

    def saw(topic: str, partition: int, when: datetime) -> None:
        partitions[topic] = max(partitions.get(topic, 0), partition + 1)
        created[topic] = min(created.get(topic, when), when)

    for block in kept:
        for run in block.runs:
            saw(run.topic, run.partition, block.created_at)
    for segment in segments:
        saw(segment.key.topic, segment.key.partition, datetime.fromtimestamp(segment.key.freeze_ts, timezone.utc))
    for topic in sorted(partitions):
        config_text = topics[topic].config_text if topic in topics else ""
        await asyncio.to_thread(catalog_topics.create_topic, catalog, topic, partitions[topic], config_text,
                                now=created[topic])
    report.topics_without_object = sorted(set(partitions) - set(topics))
    report.topics = len(partitions)
    report.partitions = sum(partitions.values())

    metas = [_segment_meta(segment) for segment in segments]
    from_seqs = _segment_from_seqs(kept, segments)
    for start in range(0, len(metas), INSERT_BATCH):
        await asyncio.to_thread(catalog_restore.insert_finished_segments, catalog, metas[start : start + INSERT_BATCH],
                                from_seqs=from_seqs, now=now)
    report.segments = len(segments)

    for start in range(0, len(kept), INSERT_BATCH):
        await asyncio.to_thread(catalog_restore.insert_committed_blocks, catalog, kept[start : start + INSERT_BATCH])
    report.blocks = len(kept)
    report.runs = sum(len(block.runs) for block in kept)
    for block in abandoned:
        block_id = await asyncio.to_thread(catalog_blocks.insert_pending_block, catalog, block.object_key,
                                           block.broker_id, block.size_bytes, now=block.created_at)
        await asyncio.to_thread(catalog_blocks.abandon_block, catalog, block_id, grace=grace, now=now)
    report.blocks_abandoned = len(abandoned)

    for segment in segments:
        key = segment.key
        pruned = await asyncio.to_thread(catalog_blocks.prune_runs_within, catalog, key.topic, key.partition,
                                         from_seqs[(key.topic, key.partition, key.base)], key.last, grace=grace,
                                         now=now)
        report.runs_pruned += pruned.runs_deleted
        report.blocks_emptied += pruned.blocks_marked
    await asyncio.to_thread(catalog_restore.restore_partition_bounds, catalog,
                            _bounds(kept, segments, from_seqs, starts))


def _segment_from_seqs(kept: list[RestoredBlock], segments: list[FoundSegment]) -> dict[tuple[str, int, int], int]:
    """The seq each remote segment answers from: right after the location before it (a segment or a run that is not
    inside a segment), when that leaves a jump before its base; else its base. The live broker records the same
    thing from the block run its first record was in (tiered.catalog.segments.segment_copy_finished)."""
    ends: dict[TopicPartition, list[int]] = defaultdict(list)
    for block in kept:
        for run in block.runs:
            ends[TopicPartition(run.topic, run.partition)].append(run.last_seq)
    for segment in segments:
        ends[segment.key.tp].append(segment.key.last)
    for values in ends.values():
        values.sort()
    out = {}
    for segment in segments:
        key = segment.key
        values = ends[key.tp]
        i = bisect.bisect_left(values, key.base)
        out[(key.topic, key.partition, key.base)] = values[i - 1] + 1 if i > 0 else key.base
    return out


def _segment_meta(segment: FoundSegment) -> SegmentMeta:
    key = segment.key
    return SegmentMeta(
        topic=key.topic, partition=key.partition, base_seq=key.base, last_seq=key.last,
        object_key=segment.object_key, index_object_key=segment.index_object_key,
        size_bytes=segment.size_bytes, index_size_bytes=segment.index_size_bytes,
        min_ts_ms=segment.min_ts_ms, max_ts_ms=segment.max_ts_ms,
        freeze_ts=datetime.fromtimestamp(key.freeze_ts, timezone.utc), leader_epoch=0,
    )  # fmt: skip


def _bounds(
    kept: list[RestoredBlock], segments: list[FoundSegment], from_seqs: dict[tuple[str, int, int], int],
    starts: dict[TopicPartition, int],
) -> list[PartitionBounds]:
    """The bounds of every partition holding something: the hwmark is the highest seq anywhere; the first available
    seq the lowest one a remote segment or a run no segment answers for holds, and never below the partition's
    start as retention wrote it."""
    firsts: dict[TopicPartition, int] = {}
    hwmarks: dict[TopicPartition, int] = {}
    answering: dict[TopicPartition, list[tuple[int, int]]] = defaultdict(list)

    def hold(where: TopicPartition, first: int, last: int, readable: bool) -> None:
        hwmarks[where] = max(hwmarks.get(where, 0), last)
        if readable:
            firsts[where] = min(firsts.get(where, first), first)

    for segment in segments:
        key = segment.key
        hold(key.tp, key.base, key.last, True)
        answering[key.tp].append((from_seqs[(key.topic, key.partition, key.base)], key.last))
    for block in kept:
        for run in block.runs:
            where = TopicPartition(run.topic, run.partition)
            pruned = any(low <= run.from_seq and run.last_seq <= high for low, high in answering[where])
            hold(where, run.first_seq, run.last_seq, not pruned)
    return [PartitionBounds(tp.topic, tp.partition, max(firsts.get(tp, 0), starts.get(tp, 0)), hwmark)
            for tp, hwmark in sorted(hwmarks.items())]
