"""Key compaction of remote segments, and of block runs on a topic with `remote.copy=false`, from the bucket alone,
one group at a time (docs/compaction.md, "Remote segments"): the history below the local disk's first seq, which
this broker's disk never held.

A pass streams the objects; nothing of the input is written to the local disk:
1. Every location (remote segment or run) of the range is read once, in windows of WINDOW_BYTES (range GETs), to
   learn the latest seq of every key (tiered.storage.compaction.scan_record, as a local pass reads its range once).
2. Groups are planned as a local pass plans them (compaction_plan.plan_groups, from the rows' sizes).
3. For each group that changes something, oldest first: its segments are read again, window by window, into the
   group's output in the work directory (tiered.storage.compaction.GroupRewrite), which gives up past
   `output_allowance` of the group's input (1.2 times, plus 4 KiB); the output is uploaded under new keys and
   swapped in by one catalog transaction (the `swap` callback, tiered.tiering.compaction.remote_compaction), and its
   files are removed before the next group starts. So the extra local disk of a pass is one group's output, at most
   1.2 times the group's input plus 4 KiB, and its memory one window plus the key index.
4. The partition's checkpoint records how far the pass got (what a local pass records), so tombstone retention
   counts from the same passes on the disk and in the bucket.

What is rewritten: a group that removes messages is always rewritten, even when re-encoding makes it no smaller
(within the 1.2 bound): dropping a later group's tombstone is only safe once the older values of its key are gone.
A group that removes nothing (a merge of segments) is left as it is when its output is not smaller than its
input: rewriting it would only add bucket space for the grace period. A group whose output would pass the bound,
a swap the catalog refuses and any error end the pass there; later groups wait for the next pass, as locally.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from tiered.catalog.blocks import RunLocation
from tiered.catalog.segments import SegmentRow
from tiered.protocol.bundle import bundle_seq_range, maybe_record, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import maybe_varint
from tiered.storage.compaction import GroupRewrite, scan_record
from tiered.storage.compaction_checkpoint import read_checkpoint, write_checkpoint
from tiered.storage.compaction_plan import Group, KeepRule, KeyIndex, SegmentTally, kept_per_segment, plan_groups
from tiered.storage.compaction_writer import OutputSegment, OutputTooLarge
from tiered.storage.partition_log import StoredRecord
from tiered.storage.segment import SealedSegment
from tiered.storage.topic_config import TopicConfig
from tiered.tier_interface import RemoteCompactionReport
from tiered.tiering.objects.store import ObjectStore
from tiered.tiering.objects.meter import Attribution

log = logging.getLogger("tiered.tiering")

WINDOW_BYTES = 4 << 20  # bytes of an object read by one range GET (a longer record is read whole)

StepHook = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Input:
    """One location of the range: a remote segment (`row`) or a block run (`run`, a topic with remote.copy=false)."""

    row: SegmentRow | None = None
    run: RunLocation | None = None

    @property
    def last_seq(self) -> int:
        return self.row.last_seq if self.row is not None else self._run.last_seq

    @property
    def _run(self) -> RunLocation:
        assert self.run is not None
        return self.run

    def stand_in(self, work: str, now_s: int) -> SegmentTally:
        """For planning: the seqs and sizes. A run is named from its first record and has no index; it has no freeze
        time either, and takes the pass's (remote retention then counts the output's age from the compaction: it
        keeps it longer, never shorter)."""
        if self.row is not None:
            r = self.row
            return SegmentTally(SealedSegment(work, r.base_seq, r.last_seq, int(r.freeze_ts.timestamp()), r.size_bytes),
                                index_bytes=r.index_size_bytes)
        run = self._run
        return SegmentTally(SealedSegment(work, run.first_seq, run.last_seq, now_s, run.length_bytes), index_bytes=0)

    def read(self, store: ObjectStore, window: int,
             counted: Callable[[int], None]) -> AsyncIterator[list[StoredRecord]]:
        if self.row is not None:
            return object_records(store, self.row.object_key, self.row.size_bytes, self.row.base_seq, window=window,
                                  counted=counted, attribution=Attribution.topic(self.row.topic))
        run = self._run
        return object_records(store, run.object_key, run.length_bytes, run.first_seq, offset=run.position,
                              window=window, counted=counted, attribution=Attribution.topic(run.topic))


# Uploads a group's output and swaps it for the group's locations in the catalog; False when the pass must stop there
SwapGroup = Callable[[list[Input], list[SealedSegment]], Awaitable[bool]]


async def object_records(store: ObjectStore, object_key: str, size: int, segment_base: int, *, offset: int = 0,
                         window: int = WINDOW_BYTES, counted: Callable[[int], None] | None = None,
                         attribution: Attribution,
                         ) -> AsyncIterator[list[StoredRecord]]:
    """The records of the `size` bytes of an object from `offset` on (a segment object, or a block run), whose
    first record takes `segment_base` if it is not sparse, in batches of whole records, one batch per range GET.
    Record positions are relative to `offset`. Raises ProtocolError when the bytes are not whole records whose seqs go
    up, or when the object ends before `size` (a record cut short) or a record runs past it."""
    buf = b""  # bytes from `start` on, not yet handed out
    start, next_seq = 0, segment_base
    while start + len(buf) < size or buf:
        fetched = start + len(buf)
        if fetched < size:
            data = await store.get_range(object_key, offset + fetched,
                                         offset + min(size, fetched + max(window, _needed(buf))),
                                         attribution=attribution)
            if counted is not None:
                counted(len(data))
            if not data:
                raise ProtocolError(f"object {object_key} ends at {fetched}, {size - fetched} bytes short", fetched)
            buf += data
        batch, position = [], 0
        while (got := maybe_record(buf, position)) is not None:
            bundle_start, end = got
            header = read_bundle_header(buf[bundle_start:end])
            first, last = bundle_seq_range(header, next_seq)
            if first < next_seq:
                raise ProtocolError(f"object {object_key}: sparse bundle seq {first} goes back below {next_seq}",
                                    start + position)
            batch.append(StoredRecord(first, last, segment_base, start + position, buf[position:end]))
            next_seq, position = last + 1, end
        buf, start = buf[position:], start + position
        if start + len(buf) >= size and buf:
            raise ProtocolError(f"object {object_key}: a record runs past its {size} bytes", start)
        if batch:
            yield batch


def _needed(buf: bytes) -> int:
    """How many bytes the record at the start of `buf` takes, when its length prefix is whole (0 otherwise)."""
    got = maybe_varint(buf, 0)
    return 0 if got is None else got[1] + got[0]


class BucketPass:
    """One pass over `inputs`, the readable remote segments and committed runs below the local disk's first seq,
    oldest first."""

    def __init__(self, store: ObjectStore, inputs: Sequence[Input], *, checkpoint_dir: str, work: str,
                 config: TopicConfig, now_ms: int, swap: SwapGroup, step: StepHook, report: RemoteCompactionReport,
                 window: int = WINDOW_BYTES):
        self.store = store
        self.checkpoint_dir = checkpoint_dir
        self.work = work
        self.config = config
        self.now_ms = now_ms
        self.swap = swap
        self.step = step
        self.report = report
        self.window = window
        # Stand-ins for the locations: planning needs their seqs and sizes, nothing reads their files
        self.tallies = [i.stand_in(work, now_ms // 1000) for i in inputs]
        self.inputs = {t.segment.base: i for t, i in zip(self.tallies, inputs)}

    async def run(self) -> None:
        """StoreError and CatalogUnavailable propagate; what was swapped stays swapped, the checkpoint says so."""
        checkpoint = await asyncio.to_thread(read_checkpoint, self.checkpoint_dir)
        retention_ms = self.config.log_cleaner_delete_retention_secs * 1000
        keys = KeyIndex()
        for tally in self.tallies:
            async for batch in self._records(tally):
                await asyncio.to_thread(_scan, batch, keys, tally)
        rule = kept_per_segment(self.tallies, KeepRule(keys, checkpoint, self.now_ms, retention_ms))
        cleaned_upto = checkpoint.cleaned_upto
        try:
            for group in plan_groups(self.tallies, self.config.log_segment_bytes):
                if group.changes_something and not await self._rewrite(group, rule):
                    break
                cleaned_upto = max(cleaned_upto, group.last)
        finally:
            if cleaned_upto > checkpoint.cleaned_upto:  # tombstone retention of these seqs counts from this pass
                after = checkpoint.after_pass(cleaned_upto, self.now_ms, retention_ms)
                await asyncio.to_thread(write_checkpoint, self.checkpoint_dir, after)

    def _records(self, tally: SegmentTally) -> AsyncIterator[list[StoredRecord]]:
        return self.inputs[tally.segment.base].read(self.store, self.window, self._downloaded)

    def _downloaded(self, nbytes: int) -> None:
        self.report.downloaded_bytes += nbytes

    async def _rewrite(self, group: Group, rule: KeepRule) -> bool:
        """Writes, uploads and swaps one group; its local files are gone when this returns. False: stop here."""
        self.step(f"write {group.base}-{group.last}")
        rewrite = GroupRewrite(self.work, group, rule, self.config)
        try:
            for tally in group.tallies:
                async for batch in self._records(tally):
                    await asyncio.to_thread(_feed, rewrite, batch)
            outputs = await asyncio.to_thread(rewrite.finish)
        except OutputTooLarge as exc:
            rewrite.abort()
            self.report.stopped = f"group {group.base}-{group.last}: {exc}"
            log.warning("remote compaction from the bucket stopped: %s", self.report.stopped)
            return False
        except Exception:
            rewrite.abort()
            raise
        output_bytes = sum(o.size + o.index.size_bytes for o in outputs)
        if group.kept == group.messages and output_bytes >= group.input_bytes:
            rewrite.abort()  # a merge that saves nothing (module docstring)
            return True
        segments = await asyncio.to_thread(_install, outputs)
        swapped = await self.swap([self.inputs[t.segment.base] for t in group.tallies], segments)
        await asyncio.to_thread(_remove, segments)
        return swapped


def _scan(batch: list[StoredRecord], keys: KeyIndex, tally: SegmentTally) -> None:
    for record in batch:
        scan_record(record, keys, tally)


def _feed(rewrite: GroupRewrite, batch: list[StoredRecord]) -> None:
    for record in batch:
        rewrite.add(record)


def _install(outputs: list[OutputSegment]) -> list[SealedSegment]:
    """The outputs under their TANK names in the work directory, as segments to upload."""
    segments = []
    for output in outputs:
        segment = SealedSegment(output.directory, output.base, output.last, output.freeze_ts, output.size,
                                index=output.index)
        os.replace(output.cleaned_path, segment.path)
        os.replace(output.cleaned_index_path, segment.index_path)
        segments.append(segment)
    return segments


def _remove(segments: list[SealedSegment]) -> None:
    for segment in segments:
        for path in (segment.path, segment.index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def clear_workdir(work: str) -> None:
    """Removes what a pass (or a crashed one) left in its work directory and makes it again, empty."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
