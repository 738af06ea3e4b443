"""Key compaction of a partition's remote segments (docs/compaction.md, "Remote segments").

The bucket's copy of a compacted partition is brought to what compaction keeps, by the partition's leader, after
each local pass (and when asked by hand). The compacted content comes from two sources:
- local copies: a local sealed segment that a local pass compacted (its last seq is at or below the local
  checkpoint's `cleaned_upto`) replaces the remote segments that tile exactly its seqs, unless the bucket holds it
  already (one remote segment of the same seqs and sizes). Local outputs keep the seqs of the segments they replace
  and the bucket's segments were copied from the same local segments, so local groups always tile remote ones;
- the bucket itself: remote segments below the local disk's first seq (history this disk never held, e.g. after a
  takeover by a broker with an empty disk) are streamed from the bucket and compacted one group at a time
  (tiered.tiering.bucket_compaction, with the partition's checkpoint, so tombstone retention counts from the same
  passes): the local disk holds one group's output at a time, never the input.

For each group, oldest first: the new segments are uploaded under keys the catalog does not know (a new object
never overwrites an old one, which a reader may be streaming), then tiered.catalog.compaction.swap_compacted_segments
swaps the rows in one transaction and hands the old objects to the two-phase deletion with its grace period.
A crash before the swap leaves the old set readable and the new objects orphans (the reconciler deletes them after
the grace period); after it, the new set. A swap the catalog refuses (retention, a new leader) stops the pass, as
does a group whose new segments would take more than OUTPUT_ALLOWANCE (1.2) times the bytes of the old ones: the
bucket's extra space during a pass (the new objects, while the old ones wait for their grace period) is at most
that much of what the pass rewrote.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from tiered.catalog import compaction as catalog_compaction
from tiered.catalog.blocks import DEFAULT_DELETE_GRACE
from tiered.catalog.compaction import SwapRefused
from tiered.catalog.errors import StaleEpoch
from tiered.catalog.segments import SegmentMeta, SegmentRow
from tiered.clock import SYSTEM_CLOCK, Clock
from tiered.storage.compaction import OUTPUT_ALLOWANCE
from tiered.storage.compaction_checkpoint import read_checkpoint
from tiered.storage.partition_log import PartitionLog
from tiered.storage.segment import SealedSegment
from tiered.tier_interface import RemoteCompactionReport
from tiered.tiering import keys
from tiered.tiering.bucket_compaction import BucketPass, clear_workdir
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.segment_copier import segment_timestamp_bounds
from tiered.tiering.store import ObjectStore

log = logging.getLogger("tiered.tiering")

KEY_ATTEMPTS = 64  # freeze times tried for an unused key (a segment compacted again and again keeps its seqs)

StepHook = Callable[[str], None]  # called before each upload and swap (tests crash there)


@dataclass
class _Group:
    old: list[SegmentRow]
    new: list[SealedSegment]  # local files tiling exactly the old rows' seqs


class RemoteCompactor:
    def __init__(self, store: ObjectStore, catalog: AsyncCatalog, *, broker_id: int, workdir: str,
                 grace: timedelta = DEFAULT_DELETE_GRACE, clock: Clock = SYSTEM_CLOCK):
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
        rows = await self.catalog.read(catalog_compaction.readable_segments, topic, partition)
        local_first = plog.segments[0].base if plog.segments else 0
        remote_only = [r for r in rows if not local_first or r.last_seq < local_first]
        cleaned_upto = (await asyncio.to_thread(read_checkpoint, plog.directory)).cleaned_upto
        groups = _groups_from_local(rows, plog.segments, cleaned_upto)

        async def swap(old: list[SegmentRow], new: list[SealedSegment]) -> bool:
            return await self._swap(topic, partition, epoch, _Group(old, new), step, report)

        if remote_only and (force or remote_only[-1].last_seq > cleaned_upto):
            work = os.path.join(self.workdir, f"{topic}.{partition}")
            await asyncio.to_thread(clear_workdir, work)
            try:
                await BucketPass(self.store, remote_only, checkpoint_dir=plog.directory, work=work,
                                 config=plog.config, now_ms=int(self.clock.now_ms()), swap=swap, step=step,
                                 report=report).run()
            finally:
                await asyncio.to_thread(shutil.rmtree, work, True)
        for group in groups if report.stopped is None else ():
            if not await swap(group.old, group.new):
                break
        return report

    async def _swap(self, topic: str, partition: int, epoch: int, group: _Group, step: StepHook,
                    report: RemoteCompactionReport) -> bool:
        """Uploads the group's new segments and swaps them for its old rows; False when the pass must stop."""
        old_bytes = sum(r.total_bytes for r in group.old)
        new_bytes = sum(s.size + s.index.size_bytes for s in group.new)
        if new_bytes > OUTPUT_ALLOWANCE * old_bytes:  # the bucket's extra space stays within the bound
            report.stopped = (f"segments {group.old[0].base_seq}-{group.old[-1].last_seq}: {new_bytes} bytes would "
                              f"replace {old_bytes}, past {OUTPUT_ALLOWANCE} times")
            log.warning("remote compaction of %s/%d stopped: %s", topic, partition, report.stopped)
            return False
        metas = []
        for segment in group.new:
            meta = await self._upload(topic, partition, epoch, segment, step)
            if meta is None:
                report.stopped = f"segment {segment.filename} went away during the pass"
                return False
            metas.append(meta)
        step(f"swap {group.old[0].base_seq}-{group.old[-1].last_seq}")
        now = datetime.fromtimestamp(self.clock.now_ms() / 1000, timezone.utc)
        try:
            result = await self.catalog.write(
                catalog_compaction.swap_compacted_segments, topic, partition, epoch, [r.base_seq for r in group.old],
                metas, broker_id=self.broker_id, grace=self.grace, now=now)
        except (SwapRefused, StaleEpoch) as exc:
            report.stopped = str(exc)
            log.warning("remote compaction of %s/%d stopped: %s", topic, partition, exc)
            return False
        report.groups += 1
        report.segments_before += len(result.removed)
        report.segments_after += len(result.added)
        report.bytes_before += result.bytes_before
        report.bytes_after += result.bytes_after
        report.swapped.append(([r.object_key for r in result.removed], [r.object_key for r in result.added]))
        log.info("remote compaction of %s/%d: %d segments, %d bytes -> %d segments, %d bytes", topic, partition,
                 len(result.removed), result.bytes_before, len(result.added), result.bytes_after)
        return True

    async def _upload(self, topic: str, partition: int, epoch: int, segment: SealedSegment,
                      step: StepHook) -> SegmentMeta | None:
        if segment.deleted:
            return None
        index_size = segment.index.size_bytes
        low, high = await asyncio.to_thread(segment_timestamp_bounds, segment.path, segment.base, segment.size)
        candidates = [(keys.segment_key(topic, partition, segment.base, segment.last, ts),
                       keys.segment_index_key(topic, partition, segment.base, segment.last, ts))
                      for ts in range(segment.freeze_ts, segment.freeze_ts + KEY_ATTEMPTS)]
        i = await self.catalog.read(catalog_compaction.first_unused_keys, candidates)
        if i is None:
            raise SwapRefused(f"{topic}/{partition}: no unused key for segment {segment.base}-{segment.last}")
        object_key, index_key = candidates[i]
        step(f"upload {object_key}")
        await self.store.put_file(object_key, segment.path)
        await self.store.put_file(index_key, segment.index_path)
        freeze = datetime.fromtimestamp(segment.freeze_ts + i, timezone.utc)
        return SegmentMeta(topic, partition, segment.base, segment.last, object_key, index_key, segment.size,
                           index_size, low, high, freeze, epoch)


def _groups_from_local(rows: Sequence[SegmentRow], local: Sequence[SealedSegment], cleaned_upto: int) -> list[_Group]:
    """Runs of local segments a local pass compacted, each with the run of remote segments that answers for exactly
    its seqs (a run starts at the same seq on both sides and ends at the same seq), unless the bucket holds it
    already (one remote segment of the same seqs and sizes). A local group's output is usually one segment over
    several remote ones, but a large group is cut into several outputs, so both sides may hold several."""
    compacted = [s for s in local if s.last <= cleaned_upto]
    at_base = {r.base_seq: i for i, r in enumerate(rows)}
    groups = []
    j = 0
    while j < len(compacted):
        k = at_base.get(compacted[j].base)
        if k is None:
            j += 1
            continue
        end = _aligned_end(rows, k, compacted, j)
        if end is None:
            j += 1
            continue
        k_end, j_end = end
        old, new = list(rows[k:k_end]), compacted[j:j_end]
        j = j_end
        same = (len(old) == len(new) == 1 and (old[0].last_seq, old[0].size_bytes, old[0].index_size_bytes)
                == (new[0].last, new[0].size, new[0].index.size_bytes))
        if not same:  # else the bucket has it already
            groups.append(_Group(old, new))
    return groups


def _aligned_end(rows: Sequence[SegmentRow], k: int, local: Sequence[SealedSegment], j: int) -> tuple[int, int] | None:
    """(end of the remote run, end of the local run), both exclusive, from rows[k] and local[j] (same base) to the
    first seq where both sides end together; None if they never do, or a side has a hole before that."""
    row_last, local_last = rows[k].last_seq, local[j].last
    k, j = k + 1, j + 1
    while row_last != local_last:
        if row_last < local_last:
            if k == len(rows) or rows[k].from_seq != row_last + 1:
                return None
            row_last, k = rows[k].last_seq, k + 1
        else:
            if j == len(local) or local[j].base > row_last:
                return None  # local segments keep their inputs' seqs: a jump here is not covered by them
            local_last, j = local[j].last, j + 1
    return k, j

