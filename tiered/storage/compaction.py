"""Key compaction of a partition's sealed local segments: TANK's `log.cleanup.policy=cleanup` (docs/protocol.md §10).

Entry points, both synchronous and meant for a worker thread (they read and write files for seconds; the log's lock
is only taken for snapshots and for each group's swap, a handful of renames):

    compaction_due(log)                       TANK's trigger: the dirty share of sealed bytes reached
                                              `log.cleaner.min.cleanable.ratio`
    compact_partition(log, now_s)             one pass if due; `force=True` runs it regardless of the ratio (a
                                              compaction asked for by hand); `stop_check` ends it between groups
                                              (a deadline, a lost leadership, a shutdown); returns a CompactionReport

A pass (one at a time per log):
1. The range: the oldest sealed segments that the log's `may_delete` allows to go (the tiering layer keeps a
   segment until it is in the bucket). The active segment is never part of it.
2. Read the range once to learn the latest seq of every key (compaction_plan.KeyIndex) and how many messages of
   each segment stay; plan groups of segments (compaction_plan.plan_groups).
3. For each group that changes something, oldest first: write its output (compaction_writer), then swap it in
   under the log's lock (PartitionLog.replace_sealed, compaction_swap.swap_in). Messages keep their seqs. A group
   whose output would exceed `output_allowance` of its input (1.2 times, plus 4 KiB) stops the pass (so peak
   extra disk space is at most that much of one group), as does any error: later groups are left for the next pass. Stopping in seq
   order matters: a tombstone is only dropped after the older values of its key are gone.
4. The checkpoint (compaction_checkpoint) records how far the pass got and when it ran.

Records are decoded by tiered.protocol.chunk.record_messages, natively where the extension is built (the pure
decoder elsewhere writes the same bytes); what stays per message in Python is one loop per record over the key index
(KeyIndex.add_messages) and one over the keep rule (KeepRule.split), and the re-encoding of kept messages.

`scan_record` (step 2) and `GroupRewrite` (step 3) take records from anywhere: the pass from the bucket
(tiered.tiering.compaction.bucket_compaction) feeds them records streamed from remote segments and block runs.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

from tiered.protocol.bundle import Message, maybe_record, read_bundle_header
from tiered.protocol.chunk import record_messages
from tiered.protocol.errors import ProtocolError
from tiered.storage.compaction_checkpoint import read_checkpoint, write_checkpoint
from tiered.storage.compaction_plan import (
    Group,
    KeepRule,
    KeyIndex,
    SegmentTally,
    dirty_ratio,
    kept_per_segment,
    plan_groups,
)
from tiered.storage.compaction_swap import StepHook, SwapError, SwapIncomplete, discard_uncommitted, swap_in
from tiered.storage.compaction_writer import GroupWriter, OutputSegment, OutputTooLarge
from tiered.storage.partition_log import PartitionLog, StoredRecord
from tiered.storage.records import BUNDLE_HEAD_BYTES
from tiered.storage.segment import SealedSegment
from tiered.storage.topic_config import TopicConfig

logger = logging.getLogger("tiered.storage")

OUTPUT_ALLOWANCE = 1.2  # a group's output may take at most this many times the group's input bytes,
OUTPUT_SLACK_BYTES = 4096  # plus this much: a tiny group re-encoded (a compressed bundle that lost one message) can
#                            grow by more than a ratio allows, and refusing it would stop every pass at that group


def output_allowance(input_bytes: int) -> int:
    """The most bytes a group's output may take: the bound on a pass's extra space, on disk and in the bucket."""
    return int(input_bytes * OUTPUT_ALLOWANCE) + OUTPUT_SLACK_BYTES

_guards: weakref.WeakKeyDictionary[PartitionLog, threading.Lock] = weakref.WeakKeyDictionary()
_guards_lock = threading.Lock()


@dataclass
class CompactionReport:
    """What one call did. `skipped` says why no pass ran; `stopped` why a pass ended before its last group."""

    directory: str
    passes: int = 0
    groups: int = 0  # groups swapped in
    segments_before: int = 0  # of the groups swapped in
    segments_after: int = 0
    bytes_before: int = 0  # segment and index bytes of the groups swapped in
    bytes_after: int = 0
    messages_before: int = 0
    messages_after: int = 0
    keys: int = 0  # distinct keys in the compacted range
    tombstones_kept: int = 0  # latest messages of their keys in the range that are tombstones, still retained
    tombstones_dropped: int = 0  # removed from the groups swapped in: superseded ones and those past retention
    largest_group_bytes: int = 0
    cleaned_upto: int = 0
    seconds: float = 0.0
    skipped: str | None = None
    stopped: str | None = None
    needs_reopen: bool = False  # a swap failed after its commit: reopen the partition (recovery finishes it)
    error: str | None = None  # the pass failed (an I/O error, damaged input, an unfinished swap); None otherwise
    swapped: list[tuple[list[str], list[str]]] = field(default_factory=list)  # (input files, output files)


def compaction_due(log: PartitionLog) -> bool:
    """TANK's trigger: cleanup policy, and dirty sealed bytes / all sealed bytes >= min.cleanable.ratio (> 0)."""
    config = log.config
    if config.log_cleanup_policy != "cleanup":
        return False
    segments = log.segments
    ratio = dirty_ratio(segments, read_checkpoint(log.directory).cleaned_upto)
    return ratio > 0 and ratio >= config.log_cleaner_min_cleanable_ratio


def compact_partition(
    log: PartitionLog,
    now_s: float,
    *,
    force: bool = False,
    on_step: StepHook | None = None,
    on_progress: Callable[[CompactionReport], None] | None = None,
    stop_check: Callable[[], str | None] | None = None,
) -> CompactionReport:
    """One compaction pass over `log` if it is due (or `force`). `on_step` is called before each change to the
    directory (tests crash there); `on_progress` after each group swapped in, with the report so far; `stop_check`
    before each group: a reason ends the pass there (`stopped`), the groups already swapped in stay."""
    report = CompactionReport(log.directory)
    guard = _guard(log)
    if not guard.acquire(blocking=False):
        report.skipped = "a compaction of this partition is running"
        return report
    started = time.monotonic()
    try:
        _run(log, now_s, force, on_step, on_progress, stop_check, report)
    finally:
        guard.release()
        report.seconds = time.monotonic() - started
    return report


def _guard(log: PartitionLog) -> threading.Lock:
    with _guards_lock:
        guard = _guards.get(log)
        if guard is None:
            guard = _guards[log] = threading.Lock()
        return guard


def _run(log: PartitionLog, now_s: float, force: bool, on_step: StepHook | None,
         on_progress: Callable[[CompactionReport], None] | None, stop_check: Callable[[], str | None] | None,
         report: CompactionReport) -> None:
    config = log.config
    if config.log_cleanup_policy != "cleanup":
        report.skipped = f"log.cleanup.policy is {config.log_cleanup_policy}, not cleanup"
        return
    if not force and not compaction_due(log):
        report.skipped = "the dirty share of sealed bytes is below log.cleaner.min.cleanable.ratio"
        return
    segments = _range(log)
    if not segments:
        report.skipped = "no sealed segment may be rewritten yet"
        return
    try:
        leftovers = discard_uncommitted(log.directory)
    except SwapError as exc:
        report.skipped = report.error = str(exc)
        logger.error("%s", exc)
        return
    if leftovers:
        logger.warning("%s: removed uncommitted compaction files %s", log.directory, leftovers)
    checkpoint = read_checkpoint(log.directory)
    now_ms = int(now_s * 1000)
    retention_ms = config.log_cleaner_delete_retention_secs * 1000
    try:
        keys, tallies = _read_keys(log, segments)
    except (OSError, ValueError) as exc:
        report.skipped = report.error = f"the sealed segments could not be read: {exc}"
        logger.error("compaction of %s: %s", log.directory, report.skipped)
        return
    rule = kept_per_segment(tallies, KeepRule(keys, checkpoint, now_ms, retention_ms))
    report.passes = 1
    report.keys = len(keys)
    report.tombstones_kept = rule.live_tombstones()
    cleaned_upto = checkpoint.cleaned_upto
    for group in plan_groups(tallies, config.log_segment_bytes):
        if group.changes_something:
            reason = stop_check() if stop_check is not None else None
            if reason:
                report.stopped = reason
                break
            try:
                if not _rewrite(log, group, rule, on_step, report):
                    report.stopped = "the segments changed during the pass (retention or a reopen)"
                    break
            except SwapIncomplete as exc:
                report.stopped = report.error = str(exc)
                report.needs_reopen = True
                logger.error("compaction of %s: %s; reopen the partition to finish the swap", log.directory, exc)
                break
            except (OutputTooLarge, OSError, ValueError) as exc:
                report.stopped = f"group {group.base}-{group.last}: {exc}"
                if not isinstance(exc, OutputTooLarge):  # a planned limit, not a failure
                    report.error = report.stopped
                logger.error("compaction of %s stopped at group %d-%d: %s", log.directory, group.base, group.last, exc)
                break
            if on_progress is not None:
                on_progress(report)
        cleaned_upto = max(cleaned_upto, group.last)
    if cleaned_upto > checkpoint.cleaned_upto:
        write_checkpoint(log.directory, checkpoint.after_pass(cleaned_upto, now_ms, retention_ms))
    report.cleaned_upto = cleaned_upto


def _range(log: PartitionLog) -> list[SealedSegment]:
    chosen = []
    for segment in log.segments:
        if not log.may_delete(segment):
            break
        chosen.append(segment)
    return chosen


def _messages(record: StoredRecord) -> tuple[int, list[Message]]:
    """(where the bundle starts in the record, its messages): decoded natively when the extension is built."""
    got = maybe_record(record.record)
    if got is None:  # iter_records reads whole records only
        raise ProtocolError(f"record at {record.position} of segment {record.segment_base} is cut short")
    return got[0], record_messages(record.record, record.first_seq)


def scan_record(record: StoredRecord, keys: KeyIndex, tally: SegmentTally) -> None:
    """Learns the keys of one record of the compacted range (records come in seq order) and counts its messages in
    the tally of its segment."""
    _, messages = _messages(record)
    tally.messages += len(messages)
    tally.keyless += keys.add_messages(messages)


def _read_keys(log: PartitionLog, segments: list[SealedSegment]) -> tuple[KeyIndex, list[SegmentTally]]:
    keys = KeyIndex()
    tallies = [SegmentTally(s) for s in segments]
    by_base = {t.segment.base: t for t in tallies}
    for record in log.iter_records(segments[0].base, segments[-1].last):
        scan_record(record, keys, by_base[record.segment_base])
    return keys, tallies


class GroupRewrite:
    """One group's output being written into `directory` from the group's records, fed in seq order: the kept
    messages of each record, whole records copied when they lost nothing. The writer gives up (OutputTooLarge)
    past `output_allowance` of the group's input bytes."""

    def __init__(self, directory: str, group: Group, rule: KeepRule, config: TopicConfig):
        self.rule = rule
        self.kept_messages = 0
        self.dropped_tombstones = 0
        freeze_ts = max(s.freeze_ts for s in group.segments)
        self.writer = GroupWriter(directory, group.base, group.last, freeze_ts, config,
                                  output_allowance(group.input_bytes))

    def add(self, record: StoredRecord) -> None:
        start, messages = _messages(record)
        # The header was checked by the decoding; the writer needs its codec and sparse flag.
        header = read_bundle_header(record.record[start:start + BUNDLE_HEAD_BYTES])
        kept, dropped_tombstones = self.rule.split(messages)
        self.dropped_tombstones += dropped_tombstones
        self.kept_messages += len(kept)
        if len(kept) == len(messages):
            self.writer.add_whole(record.record, header, messages)
        else:
            self.writer.add_kept(header, kept)

    def finish(self) -> list[OutputSegment]:
        """The output segments, fsynced, as `.cleaned` files."""
        return self.writer.finish()

    def abort(self) -> None:
        """Removes every file written so far."""
        self.writer.abort()


def _rewrite(log: PartitionLog, group: Group, rule: KeepRule, on_step: StepHook | None,
             report: CompactionReport) -> bool:
    inputs = group.segments
    input_bytes = group.input_bytes
    step = on_step or (lambda _step: None)
    step(f"write {group.base}-{group.last}")
    rewrite = GroupRewrite(log.directory, group, rule, log.config)
    try:
        for record in log.iter_records(group.base, group.last):
            rewrite.add(record)
        outputs = rewrite.finish()
    except Exception:
        rewrite.abort()
        raise
    step(f"written {group.base}-{group.last}")
    new = log.replace_sealed(inputs, lambda: swap_in(log.directory, inputs, outputs, on_step))
    if new is None:
        rewrite.abort()
        return False
    output_bytes = sum(s.size + s.index.size_bytes for s in new)
    report.groups += 1
    report.segments_before += len(inputs)
    report.segments_after += len(new)
    report.bytes_before += input_bytes
    report.bytes_after += output_bytes
    report.messages_before += group.messages
    report.messages_after += rewrite.kept_messages
    report.tombstones_dropped += rewrite.dropped_tombstones
    report.largest_group_bytes = max(report.largest_group_bytes, input_bytes)
    report.swapped.append(([s.filename for s in inputs], [s.filename for s in new]))
    logger.info("compacted %s %d-%d: %d segments, %d bytes -> %d segments, %d bytes", log.directory, group.base,
                group.last, len(inputs), input_bytes, len(new), output_bytes)
    return True
