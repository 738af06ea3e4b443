"""Key compaction of a partition's remote segments (docs/compaction.md, "Remote segments").

The bucket's copy of a compacted partition is brought to what compaction keeps, by the partition's leader, after
each local pass (and when asked by hand). The compacted content comes from two sources:
- local copies: a local sealed segment that a local pass compacted (its last seq is at or below the local
  checkpoint's `cleaned_upto`) replaces the remote segments that tile exactly its seqs, unless the bucket holds it
  already (one remote segment of the same seqs and sizes). Local outputs keep the seqs of the segments they replace
  and the bucket's segments were copied from the same local segments, so local groups always tile remote ones;
- the bucket itself: remote segments below the local disk's first seq (history this disk never held, e.g. after a
  takeover by a broker with an empty disk) are streamed from the bucket and compacted one group at a time
  (tiered.tiering.compaction.bucket_compaction, with the partition's checkpoint, so tombstone retention counts from the same
  passes): the local disk holds one group's output at a time, never the input.

A topic with `remote.copy=false` holds its history as block runs, not remote segments: the same two sources apply,
with runs among the locations a group replaces (swap_compacted_locations prunes them, and a block shared with other
partitions' runs stays until none references it).

For each group, oldest first: the new segments are uploaded under keys the catalog does not know (a new object
never overwrites an old one, which a reader may be streaming), then tiered.catalog.compaction.swap_compacted_segments
swaps the rows in one transaction and hands the old objects to the two-phase deletion with its grace period.
A crash before the swap leaves the old set readable and the new objects orphans (the reconciler deletes them after
the grace period); after it, the new set. A swap the catalog refuses (retention, a new leader) stops the pass, as
does a group whose new segments would take more than `output_allowance` of the old ones (1.2 times, plus 4 KiB): the
bucket's extra space during a pass (the new objects, while the old ones wait for their grace period) is at most
that much of what the pass rewrote.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from tiered.catalog import compaction as catalog_compaction
from tiered.catalog import locate
from tiered.catalog.blocks import DEFAULT_DELETE_GRACE, RunLocation
from tiered.catalog.compaction import SwapRefused
from tiered.catalog.errors import StaleEpoch
from tiered.catalog.segments import SegmentMeta, SegmentRow
from tiered.clock import Clock
from tiered.storage.compaction import output_allowance
from tiered.storage.compaction_checkpoint import read_checkpoint
from tiered.storage.partition_log import PartitionLog
from tiered.storage.segment import SealedSegment
from tiered.tier_interface import RemoteCompactionReport
from tiered.tiering.objects import keys
from tiered.tiering.compaction.bucket_compaction import BucketPass, Input, clear_workdir
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.segments.segment_copier import segment_timestamp_bounds
from tiered.tiering.objects.store import ObjectStore
from tiered.tiering.objects.meter import Attribution

log = logging.getLogger("tiered.tiering")

KEY_ATTEMPTS = 64  # freeze times tried for an unused key (a segment compacted again and again keeps its seqs)

# Called before each group written from the bucket, each upload and each swap (tests crash there)
StepHook = Callable[[str], None]


@dataclass
class _Group:
    old: list[SegmentRow]
    new: list[SealedSegment]  # local files tiling exactly the seqs of the old rows and runs
    runs: list[RunLocation] = field(default_factory=list)  # block runs replaced too (a topic with remote.copy=false)


class RemoteCompactor:
    def __init__(self, store: ObjectStore, catalog: AsyncCatalog, *, broker_id: int, workdir: str,
                 clock: Clock, grace: timedelta = DEFAULT_DELETE_GRACE):
        self.store = store
        self.catalog = catalog
        self.broker_id = broker_id
        self.workdir = workdir
        self.grace = grace
        self.clock = clock

    async def compact(self, topic: str, partition: int, plog: PartitionLog, epoch: int, *, force: bool = False,
                      on_step: StepHook | None = None) -> RemoteCompactionReport:
        """One pass over the partition's remote segments (module docstring). Remote-only history is compacted when
        some of it is above the checkpoint's `cleaned_upto`, or with `force` (a pass asked for by hand: expired
        tombstones go). StoreError and CatalogUnavailable propagate (what was swapped stays swapped; the next pass
        goes on from there)."""
        report = RemoteCompactionReport(topic, partition)
        step = on_step or (lambda _name: None)
        # The partition's segments and runs in one snapshot (tiered.catalog.locate.locations): a copy landing between
        # two reads cannot leave a seq in neither.
        found = await self.catalog.read(locate.locations, topic, partition, 1, 2**63 - 1)
        rows = found.segments
        local_first = plog.segments[0].base if plog.segments else 0
        remote_only = [Input(row=r) for r in rows if not local_first or r.last_seq < local_first]
        if not plog.config.remote_copy:  # its history is in runs; with copies, runs are the tail the copier takes
            below = _runs_within(found.runs, 1, local_first - 1 if local_first else 2**63)
            remote_only = sorted(remote_only + [Input(run=r) for r in below], key=lambda i: i.last_seq)
        cleaned_upto = (await asyncio.to_thread(read_checkpoint, plog.directory)).cleaned_upto
        compacted = [s for s in plog.segments if s.last <= cleaned_upto]
        runs = _runs_within(found.runs, compacted[0].base, cleaned_upto) if compacted else []
        groups = _groups_from_local(rows, plog.segments, cleaned_upto, runs)

        async def swap(old: list[Input], new: list[SealedSegment]) -> bool:
            group = _Group([i.row for i in old if i.row is not None], new, [i.run for i in old if i.run is not None])
            return await self._swap(topic, partition, epoch, group, step, report)

        if remote_only and (force or remote_only[-1].last_seq > cleaned_upto):
            work = os.path.join(self.workdir, f"{topic}.{partition}")
            await asyncio.to_thread(clear_workdir, work)
            # The pass's checkpoint may be the first file of a log never written here (tiered.server.registry).
            await asyncio.to_thread(plog.make_directory)
            try:
                await BucketPass(self.store, remote_only, checkpoint_dir=plog.directory, work=work,
                                 config=plog.config, now_ms=int(self.clock.now_ms()), swap=swap, step=step,
                                 report=report).run()
            finally:
                await asyncio.to_thread(shutil.rmtree, work, True)
        for group in groups if report.stopped is None else ():
            if not await self._swap(topic, partition, epoch, group, step, report):
                break
        return report

    async def _swap(self, topic: str, partition: int, epoch: int, group: _Group, step: StepHook,
                    report: RemoteCompactionReport) -> bool:
        """Uploads the group's new segments and swaps them for its old rows and runs; False when the pass must stop."""
        span = f"{group.new[0].base}-{group.new[-1].last}"  # also the old rows' and runs' seqs
        old_bytes = sum(r.total_bytes for r in group.old) + sum(r.length_bytes for r in group.runs)
        new_bytes = sum(s.size + s.index.size_bytes for s in group.new)
        if new_bytes > output_allowance(old_bytes):  # the bucket's extra space stays within the bound
            report.stopped = (f"seqs {span}: {new_bytes} bytes would replace {old_bytes}, past the allowance of "
                              f"{output_allowance(old_bytes)}")
            log.warning("remote compaction of %s/%d stopped: %s", topic, partition, report.stopped)
            return False
        # An output's freeze time (in its key) is later than every segment it replaces: a rebuild from the bucket
        # keeps the newest of overlapping segments by upload time, then by freeze time, and two passes within one
        # second upload at the same (second-granular) time.
        after = max((int(r.freeze_ts.timestamp()) for r in group.old), default=None)
        metas = []
        for segment in group.new:
            meta = await self._upload(topic, partition, epoch, segment, step, after)
            if meta is None:
                report.stopped = f"segment {segment.filename} went away during the pass"
                return False
            metas.append(meta)
        step(f"swap {span}")
        now = datetime.fromtimestamp(self.clock.now_ms() / 1000, timezone.utc)
        try:
            if group.runs:
                result = await self.catalog.write(
                    catalog_compaction.swap_compacted_locations, topic, partition, epoch, metas,
                    broker_id=self.broker_id, grace=self.grace, now=now)
            else:
                result = await self.catalog.write(
                    catalog_compaction.swap_compacted_segments, topic, partition, epoch,
                    [r.base_seq for r in group.old], metas, broker_id=self.broker_id, grace=self.grace, now=now)
        except (SwapRefused, StaleEpoch) as exc:
            report.stopped = str(exc)
            log.warning("remote compaction of %s/%d stopped: %s", topic, partition, exc)
            return False
        report.groups += 1
        report.segments_before += len(result.removed)
        report.runs_before += result.runs_removed
        report.segments_after += len(result.added)
        report.bytes_before += result.bytes_before
        report.bytes_after += result.bytes_after
        report.swapped.append(([r.object_key for r in result.removed], [r.object_key for r in result.added]))
        log.info("remote compaction of %s/%d: %d segments and %d runs, %d bytes -> %d segments, %d bytes", topic,
                 partition, len(result.removed), result.runs_removed, result.bytes_before, len(result.added),
                 result.bytes_after)
        return True

    async def _upload(self, topic: str, partition: int, epoch: int, segment: SealedSegment,
                      step: StepHook, after: int | None = None) -> SegmentMeta | None:
        """Uploads a new segment under the first unused key from its freeze time (or from `after` + 1, when that is
        later: the freeze time of the newest segment it replaces)."""
        if segment.deleted:
            return None
        index_size = segment.index.size_bytes
        low, high = await asyncio.to_thread(segment_timestamp_bounds, segment.path, segment.base, segment.size)
        first = segment.freeze_ts if after is None else max(segment.freeze_ts, after + 1)
        candidates = [(keys.segment_key(topic, partition, segment.base, segment.last, ts),
                       keys.segment_index_key(topic, partition, segment.base, segment.last, ts))
                      for ts in range(first, first + KEY_ATTEMPTS)]
        i = await self.catalog.read(catalog_compaction.first_unused_keys, candidates)
        if i is None:
            raise SwapRefused(f"{topic}/{partition}: no unused key for segment {segment.base}-{segment.last}")
        object_key, index_key = candidates[i]
        step(f"upload {object_key}")
        await self.store.put_file(object_key, segment.path, attribution=Attribution.topic(topic))
        await self.store.put_file(index_key, segment.index_path, attribution=Attribution.topic(topic))
        freeze = datetime.fromtimestamp(first + i, timezone.utc)
        return SegmentMeta(topic, partition, segment.base, segment.last, object_key, index_key, segment.size,
                           index_size, low, high, freeze, epoch)


def _runs_within(runs: Sequence[RunLocation], first: int, last: int) -> list[RunLocation]:
    """The runs (in seq order) answering for seqs from `first` that end at or below `last`."""
    return [r for r in runs if first <= r.last_seq <= last]


@dataclass(frozen=True, slots=True)
class _Location:
    """A readable remote segment or a committed block run, as far as matching local segments goes."""

    from_seq: int
    first_seq: int  # a segment's base, a run's first record
    last_seq: int
    row: SegmentRow | None = None
    run: RunLocation | None = None


def _groups_from_local(rows: Sequence[SegmentRow], local: Sequence[SealedSegment], cleaned_upto: int,
                       runs: Sequence[RunLocation] = ()) -> list[_Group]:
    """Sequences of consecutive local segments a local pass compacted, each with the sequence of locations (remote
    segments, and block runs of a topic that does not copy its segments) that answers for exactly its seqs: the
    first location answers for the first local base and holds no record below it, both sides end at the same seq.
    Unless the bucket holds it already (one remote segment of the same seqs and sizes). A local group's output is
    usually one segment over several locations, but a large group is cut into several outputs, so both sides may
    hold several."""
    compacted = [s for s in local if s.last <= cleaned_upto]
    spans = sorted([_Location(r.from_seq, r.base_seq, r.last_seq, row=r) for r in rows] +
                   [_Location(r.from_seq, r.first_seq, r.last_seq, run=r) for r in runs], key=lambda x: x.last_seq)
    lasts = [x.last_seq for x in spans]
    groups = []
    j = 0
    while j < len(compacted):
        k = bisect_left(lasts, compacted[j].base)
        if k == len(spans) or not spans[k].from_seq <= compacted[j].base <= spans[k].first_seq:
            j += 1
            continue
        end = _aligned_end(spans, k, compacted, j)
        if end is None:
            j += 1
            continue
        k_end, j_end = end
        old, new = spans[k:k_end], compacted[j:j_end]
        j = j_end
        same = (len(old) == len(new) == 1 and old[0].row is not None and
                (old[0].last_seq, old[0].row.size_bytes, old[0].row.index_size_bytes)
                == (new[0].last, new[0].size, new[0].index.size_bytes))
        if not same:  # else the bucket has it already
            groups.append(_Group([x.row for x in old if x.row is not None], list(new),
                                 [x.run for x in old if x.run is not None]))
    return groups


def _aligned_end(spans: Sequence[_Location], k: int, local: Sequence[SealedSegment], j: int) -> tuple[int, int] | None:
    """(end of the locations, end of the local segments), both exclusive, from spans[k] and local[j] (which start
    together) to the first seq where both sides end together; None if they never do, or a side has a hole before."""
    span_last, local_last = spans[k].last_seq, local[j].last
    k, j = k + 1, j + 1
    while span_last != local_last:
        if span_last < local_last:
            if k == len(spans) or spans[k].from_seq != span_last + 1:
                return None
            span_last, k = spans[k].last_seq, k + 1
        else:
            if j == len(local) or local[j].base > span_last:
                return None  # local segments keep their inputs' seqs: a jump here is not covered by them
            local_last, j = local[j].last, j + 1
    return k, j
