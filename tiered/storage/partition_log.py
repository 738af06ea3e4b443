"""One partition's local log: sealed segments, the active segment, and the seq bookkeeping around them.

Seqs (docs/protocol.md §3.1, §3.3, §10):
- `last_assigned`: the highest seq ever given out (0 when nothing ever was). A plain produce gets last_assigned+1;
  a 0x05 produce names its first seq; a sparse bundle names first and last in its header. Explicit seqs must be
  above last_assigned (else InvalidSeqnums); jumps are allowed and leave a gap. No seq exceeds MAX_SEQ (2**63 - 1).
- `last_held`: the last seq of the newest record on disk (0 when none); below last_assigned only after
  `ensure_next_seq` (seqs committed elsewhere).
- `first_available`: the base of the oldest local segment, 0 when the log holds nothing.
What consumers may see (the high-water mark) is the server's decision (tiered.bounds): `read` takes it as an
argument and never returns a record past it.

A segment holds a contiguous walk of records: a non-sparse bundle always continues its predecessor's seqs, because
readers derive its seqs from there. So a non-sparse bundle whose first seq jumps (a 0x05 produce with a base seq,
or the first plain produce after `ensure_next_seq`) starts a new segment based at that seq. (TANK keeps it in the
same segment, where its seqs are then misread.) Sparse bundles may jump inside a segment, as in TANK.

Not thread-safe beyond its own lock: every public method takes it; `iter_records` reads a snapshot without it.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from tiered.protocol.bundle import BundleFacts, validate_bundle
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import MAX_VARINT, encode_varint
# AppendResult and MAX_SEQ are the appender's (it builds the one and checks the other), named here as before.
from tiered.storage.appender import MAX_SEQ as MAX_SEQ, AppendResult as AppendResult
from tiered.storage.appender import PRODUCE_PATH_ENV, append_result, next_seqs, seqs_valid
from tiered.storage.reads import ReadRange, Segment, find_start, range_end
from tiered.storage.records import RecordInfo, iter_records, pread_exact
from tiered.storage.recovery import RecoveredLog, RecoveryReport, recover_partition
from tiered.storage.retention import select_for_deletion
from tiered.storage.segment import ActiveSegment, SealedSegment, fsync_dir, roll_age_s
from tiered.storage.topic_config import TopicConfig
from tiered.storage.truncate import TruncateReport, truncate_partition_dir

log = logging.getLogger("tiered.storage")

_log_append_native: Callable[..., AppendResult] | None
try:
    from tiered.storage._appender import LogCore as _LogCore, log_append as _log_append_native
except ImportError:  # built without a C compiler: PartitionLog.append serves
    _log_append_native = None
    _LogCore = object  # type: ignore[misc,assignment]


class InvalidSeqnums(ValueError):
    """Produce error 0x0a: an explicit first seq not above last_assigned, or a last seq below the first."""


@dataclass(frozen=True, slots=True)
class StoredRecord:
    first_seq: int
    last_seq: int
    segment_base: int
    position: int
    record: bytes


@dataclass(frozen=True, slots=True)
class LogStats:
    bytes: int
    segments: int  # sealed ones plus the active one


def _keep_everything(_segment: SealedSegment) -> bool:
    return True


class PartitionLog(_LogCore):
    """Open with PartitionLog.open(); the constructor takes an already recovered directory.

    With the native module built, the fields `append` reads and writes (its lock, closed flag, clock, config, active
    segment, last assigned seq, next flush time) are held in C (`_appender.LogCore`, the base: the same attributes),
    so that `log_append` (_appender.c), the common case of `append` in one call, reaches them directly."""

    def __init__(
        self,
        directory: str,
        config: TopicConfig,
        recovered: RecoveredLog,
        *,
        now_s: Callable[[], float],
        on_seal: Callable[[SealedSegment], None] | None,
        may_delete: Callable[[SealedSegment], bool],
        rng: random.Random,
        made: bool = True,
    ):
        self.directory = directory
        # Whether `directory` exists. False: the log of a partition whose directory is made when it is first written
        # (tiered.storage.topics): only an empty log is unmade, and the first file it writes makes it
        # (`make_directory`). `_entry_synced` False: made so, its entry in the topic's directory is not synced yet.
        self._made = made
        self._entry_synced = True
        self.config = config
        self.recovery: RecoveryReport = recovered.report
        self.on_seal = on_seal
        self.may_delete = may_delete
        self._now_s = now_s
        self._rng = rng
        self._lock = threading.RLock()
        self._sealed: list[SealedSegment] = recovered.sealed
        self._bases: list[int] = [s.base for s in self._sealed]
        self._active: ActiveSegment | None = recovered.active
        self._last_assigned: int = recovered.last_assigned
        self._pending_flush_messages = 0
        self._next_flush_s = now_s() + config.flush_secs if config.flush_secs else None
        self._closed = False

    @classmethod
    def open(
        cls,
        directory: str,
        config: TopicConfig,
        *,
        now_s: Callable[[], float] = time.time,
        next_seq_floor: int = 1,
        on_seal: Callable[[SealedSegment], None] | None = None,
        may_delete: Callable[[SealedSegment], bool] = _keep_everything,
        rng: random.Random | None = None,
    ) -> PartitionLog:
        """Recovers the directory (created if missing) and opens the log. `may_delete` vetoes retention on roll."""
        os.makedirs(directory, exist_ok=True)
        rng = rng or random.Random()
        recovered = recover_partition(directory, config, rng)
        report = recovered.report
        if not report.clean:
            log.warning(
                "recovered %s: %d bytes cut, %d indexes rebuilt, %d repaired, %d files deleted, %d sealed",
                directory,
                report.bytes_cut,
                len(report.rebuilt_indexes),
                len(report.repaired_indexes),
                len(report.deleted),
                len(report.sealed_at_open),
            )
        partition_log = cls(directory, config, recovered, now_s=now_s, on_seal=on_seal, may_delete=may_delete, rng=rng)
        partition_log.ensure_next_seq(next_seq_floor)
        return partition_log

    @classmethod
    def open_new(
        cls,
        directory: str,
        config: TopicConfig,
        *,
        now_s: Callable[[], float] = time.time,
        on_seal: Callable[[SealedSegment], None] | None = None,
        may_delete: Callable[[SealedSegment], bool] = _keep_everything,
        rng: random.Random,
        made: bool = True,
    ) -> PartitionLog:
        """The log of a partition whose directory its topic's creation just made, empty (or, with `made` False, whose
        directory is made later, by `make_directory`): nothing to recover, so none of `open`'s per-partition file
        system calls (a topic of 4,096 partitions opened this way costs what its objects cost). `rng` may be shared
        by the topic's partitions."""
        return cls(directory, config, RecoveredLog([], None, 0, RecoveryReport(directory)), now_s=now_s,
                   on_seal=on_seal, may_delete=may_delete, rng=rng, made=made)

    # ----------------------------------------------------------------------------------------------- state

    @property
    def made(self) -> bool:
        """Whether the log's directory exists (see `make_directory`)."""
        return self._made

    def make_directory(self) -> None:
        """Makes the log's directory unless it exists, before the first file written in it (a segment, a compaction
        checkpoint). Raises OSError (something else in its place is damage, for the caller). Its entry in the
        topic's directory is synced at the log's first roll, with its first segment's name (each roll syncs the
        log's directory; a segment's name is durable from then on, not before): a new topic's first writes cost
        one `mkdir` each, not a sync of the topic's directory each on the produce path."""
        with self._lock:
            if self._made:
                return
            os.mkdir(self.directory, 0o755)
            self._made = True
            self._entry_synced = False

    @property
    def first_available(self) -> int:
        with self._lock:
            if self._sealed:
                return self._sealed[0].base
            if self._active is not None and self._active.last is not None:
                return self._active.base
            return 0

    @property
    def last_assigned(self) -> int:
        return self._last_assigned

    @property
    def last_held(self) -> int:
        with self._lock:
            if self._active is not None and self._active.last is not None:
                return self._active.last
            return self._sealed[-1].last if self._sealed else 0

    @property
    def segments(self) -> tuple[SealedSegment, ...]:
        return tuple(self._sealed)

    @property
    def active(self) -> ActiveSegment | None:
        return self._active

    def stats(self) -> LogStats:
        with self._lock:
            total = sum(s.size for s in self._sealed)
            count = len(self._sealed)
            if self._active is not None:
                total += self._active.size
                count += 1
            return LogStats(total, count)

    def reconfigure(self, config: TopicConfig) -> None:
        """New settings (ReloadConf); they apply from the next append, roll and retention pass."""
        with self._lock:
            self.config = config
            self._next_flush_s = self._now_s() + config.flush_secs if config.flush_secs else None

    # ------------------------------------------------------------------------------------------- writes

    def append(self, bundle: bytes | memoryview | None, base_seq: int | None = None,
               facts: BundleFacts | None = None, record: memoryview | None = None) -> AppendResult:
        """Appends one bundle as `{varint length, bundle}`. `base_seq` is the 0x05 produce's first seq.

        The log holds only whole, valid bundles: the bundle is validated completely (ProtocolError, nothing written)
        unless the caller passes the `facts` validate_bundle already returned for it. `record`: those bytes already
        laid out, as the request holds them (ProducePartition.record: the length minimally encoded, read-only, never
        written again); without it the record is built here, copying the bundle once. With a record and its facts,
        `bundle` may be None (the produce path's native call makes no view of the bundle alone: the record holds it,
        and its length, read from the request as a varint, fits one)."""
        if bundle is not None:
            facts = facts or validate_bundle(bundle)
            if len(bundle) > MAX_VARINT:
                raise ProtocolError(f"bundle of {len(bundle)} bytes does not fit a segment record")
        if facts is None:
            raise TypeError("an append without the bundle needs its record and facts")
        lock = self._lock  # acquire/release: ~2x cheaper than `with` per append (no special-method lookups)
        lock.acquire()
        try:
            if self._closed:
                self._check_open()
            now = self._now_s()
            config = self.config
            active = self._active
            if record is not None and active is not None:
                # Most records: one native call assigns the seqs after last_assigned (kept here, its one owner),
                # decides that the active segment takes the record, writes and indexes it (SegmentAppender.append_next).
                appended = active.append_next(record, facts, base_seq, self._last_assigned, now, config)
                if appended is not None:
                    self._last_assigned = appended.last_seq
                    if config.flush_messages or self._next_flush_s is not None:
                        self._count_for_flush(facts.messages, now)
                    return appended
            # The rest: seqs refused, no segment or an empty one, a roll, or a record not laid out in the request.
            first, last, explicit = next_seqs(facts, base_seq, self._last_assigned)
            if explicit and first <= self._last_assigned:
                raise InvalidSeqnums(f"first seq {first} is not above the last assigned seq {self._last_assigned}")
            if not seqs_valid(first, last, explicit, self._last_assigned):
                raise InvalidSeqnums(f"seq range {first}..{last} is invalid (seqs are 1..{MAX_SEQ})")
            # Without the request's own layout, the bundle is copied once, from the request.
            written = record if record is not None else _record_of(bundle)
            # A record laid out in the request was offered to the active segment above; one built here is offered now.
            position = None if active is None or record is not None else \
                active.append_record(written, first, last, facts, now, config)
            if active is None or position is None:
                active = self._segment_for(first, last, facts.sparse, len(written), now)
                position = active.append(written, first, last, config.log_index_interval_bytes,
                                         (facts.min_ts_ms, facts.max_ts_ms))
            self._last_assigned = last
            if config.flush_messages or self._next_flush_s is not None:
                self._count_for_flush(facts.messages, now)
            return append_result((first, last, active.base, position, position + len(written), written, facts))
        finally:
            lock.release()

    def _segment_for(self, first: int, last: int, sparse: bool, record_len: int, now: float) -> ActiveSegment:
        active = self._active
        if active is not None and active.last is None and active.base != first:
            active.delete()  # left empty by a failed write; its base would be wrong for this record
            self._active = active = None
        if active is not None and active.last is not None:
            if not active.takes(first, last, sparse, record_len, now, self.config):
                self._roll(active, now)
                active = None
        if active is None:
            self.make_directory()
            active = ActiveSegment.create(self.directory, first, int(now), roll_age_s(self.config, self._rng))
            self._active = active
        return active

    def _roll(self, active: ActiveSegment, now: float) -> SealedSegment:
        """Seals `active`, the active segment."""
        sealed = active.seal()
        self._active = None
        self._sealed.append(sealed)
        self._bases.append(sealed.base)
        fsync_dir(self.directory)
        if not self._entry_synced:  # the directory's own name, made by the first write (make_directory)
            fsync_dir(os.path.dirname(self.directory))
            self._entry_synced = True
        self._pending_flush_messages = 0
        if self.on_seal is not None:
            try:
                self.on_seal(sealed)
            except Exception:
                log.exception("on_seal callback failed for %s", sealed.path)
        self.enforce_retention(now, self.may_delete)
        return sealed

    def seal_active(self) -> SealedSegment | None:
        """Rolls now if the active segment holds anything (the next append creates a new one)."""
        with self._lock:
            self._check_open()
            active = self._active
            if active is None or active.last is None:
                return None
            return self._roll(active, self._now_s())

    def ensure_next_seq(self, seq: int) -> None:
        """Makes the next plain append get at least `seq` (the catalog is ahead of this disk).

        Seqs below `seq` count as assigned: they are committed elsewhere. The next plain append starts a new
        segment based at `seq`, so seqs held elsewhere never sit inside a local segment.
        """
        with self._lock:
            if seq > self._last_assigned + 1:
                self._last_assigned = seq - 1

    def truncate_after(self, keep: int) -> TruncateReport:
        """Removes every record past seq `keep` (records another leader's history replaced), crash-safely
        (tiered.storage.truncate), and reopens the log. Only while the partition is not served."""
        with self._lock:
            self._check_open()
            if self.last_held <= keep:
                return TruncateReport(self.directory, keep)
            self._close_files()
            report = truncate_partition_dir(self.directory, keep)
            recovered = recover_partition(self.directory, self.config, self._rng)
            self._sealed = recovered.sealed
            self._bases = [s.base for s in self._sealed]
            self._active = recovered.active
            self._last_assigned = recovered.last_assigned
            log.warning("%s: removed %d records past seq %d (%d bytes): another leader's history replaces them",
                        self.directory, report.records, keep, report.bytes)
            return report

    def _count_for_flush(self, messages: int, now: float) -> None:
        config = self.config
        self._pending_flush_messages += messages
        due_by_count = config.flush_messages and self._pending_flush_messages >= config.flush_messages
        due_by_time = self._next_flush_s is not None and now >= self._next_flush_s
        if due_by_count or due_by_time:
            self.flush()

    def flush(self) -> None:
        """fdatasync of the active segment and its index (`flush.messages`, `flush.secs`)."""
        with self._lock:
            if self._active is not None:
                self._active.flush()
            self._pending_flush_messages = 0
            if self.config.flush_secs:
                self._next_flush_s = self._now_s() + self.config.flush_secs

    def enforce_retention(
        self, now_s: float, may_delete: Callable[[SealedSegment], bool] = _keep_everything
    ) -> list[SealedSegment]:
        """Deletes the sealed segments local retention expires; returns them (oldest first)."""
        with self._lock:
            if self._closed:
                return []
            victims = select_for_deletion(self._sealed, self.config, now_s, may_delete)
            for segment in victims:
                segment.delete()
                log.info("retention deleted %s", segment.path)
            del self._sealed[: len(victims)]
            del self._bases[: len(victims)]
            return victims

    def replace_sealed(
        self, old: Sequence[SealedSegment], install: Callable[[], list[SealedSegment]]
    ) -> list[SealedSegment] | None:
        """Swaps a run of sealed segments for their compacted replacements (tiered.storage.compaction).

        `install` changes the directory and returns the new segments, oldest first, covering the same seqs. It runs
        under the log's lock, so no reader is handed a segment whose files are being swapped. Returns the new
        segments, or None (and `install` is not called) when `old` is no longer a run of this log's sealed segments.
        """
        with self._lock:
            if self._closed or not old:
                return None
            start = next((i for i, s in enumerate(self._sealed) if s is old[0]), -1)
            end = start + len(old)
            if start < 0 or list(map(id, self._sealed[start:end])) != list(map(id, old)):
                return None
            new = install()
            self._sealed[start:end] = new
            self._bases[start:end] = [s.base for s in new]
            return new

    # -------------------------------------------------------------------------------------------- reads

    def read(self, seq: int, fetch_size: int, hwmark: int, *, across_gaps: bool = True) -> ReadRange | None:
        """Whole records from the one holding `seq` (or, in a gap, the next one), ending at a record boundary near
        `fetch_size` and never past `hwmark` (docs/protocol.md §3.4). None when the log holds no visible record at or
        after `seq`, or when `seq` falls between two segments and `across_gaps` is False: a gap between segments
        may hold seqs a lower tier has (a disk behind the catalog), while a gap inside a segment is a jump in seqs
        this log made itself. So is a seq that compaction removed from the end of a sealed segment: the next
        segment answers when it starts right after that one (the lower tier may still hold the removed message
        itself, which a compacted partition must not show again)."""
        with self._lock:
            self._check_open()
            found = self._find(seq)
            if found is None:
                return None
            segment, last, start = found
            if start.last_seq > hwmark:
                return None
            if seq < segment.base and not across_gaps and not self._continues_sealed(seq, segment.base):
                return None
            reader = segment.reader()
            end = range_end(segment, reader.fileno(), start, segment.size, last, max(fetch_size, 0), hwmark)
            return ReadRange(segment, reader, start.position, end, start.first_seq, start.sparse, hwmark)

    def _continues_sealed(self, seq: int, next_base: int) -> bool:
        """Whether `seq` is inside a sealed segment's [base, last] (held or compacted away) and the segment at
        `next_base` starts right after that one: no seq between them is held anywhere else."""
        i = bisect_right(self._bases, seq) - 1
        return i >= 0 and self._sealed[i].last >= seq and self._sealed[i].last + 1 == next_base

    def _segments_with_data(self) -> list[Segment]:
        segments: list[Segment] = list(self._sealed)
        if self._active is not None and self._active.last is not None:
            segments.append(self._active)
        return segments

    def _find(self, seq: int) -> tuple[Segment, int, RecordInfo] | None:
        """(segment, its last seq, its first record with last seq >= `seq`), or None past the local data."""
        segments = self._segments_with_data()
        i = max(bisect_right(self._bases, seq) - 1, 0)
        if self._active is not None and self._active.last is not None and seq >= self._active.base:
            i = len(segments) - 1
        while i < len(segments):
            segment = segments[i]
            last = segment.last
            if last is not None and last >= seq:  # not None: every segment here holds data
                start = find_start(segment, seq, segment.size, segment.reader().fileno())
                if start is not None:
                    return segment, last, start
            i += 1
        return None

    def iter_records(self, first_seq: int, last_seq: int) -> Iterator[StoredRecord]:
        """The whole records overlapping [first_seq, last_seq], visible or not (e.g. to re-upload a tail)."""
        with self._lock:
            self._check_open()
            segments = self._segments_with_data()
            snapshot = [(s, s.size, last, s.reader()) for s in segments if (last := s.last) is not None]
        for segment, size, last, reader in snapshot:
            if last < first_seq:
                continue
            if segment.base > last_seq:
                break
            position, next_seq = 0, segment.base
            if first_seq > segment.base:
                start = find_start(segment, first_seq, size, reader.fileno())
                if start is None:
                    continue
                position, next_seq = start.position, start.first_seq
            fd = reader.fileno()
            for info in iter_records(fd, position, size, next_seq):
                if info.first_seq > last_seq:
                    return
                record = pread_exact(fd, info.length, info.position)
                yield StoredRecord(info.first_seq, info.last_seq, segment.base, info.position, record)

    def read_records(self, first_seq: int, last_seq: int) -> bytes:
        """The concatenated bytes of `iter_records` (use that when the range may span segments with a gap)."""
        return b"".join(r.record for r in self.iter_records(first_seq, last_seq))

    # ------------------------------------------------------------------------------------------ closing

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"partition log {self.directory} is closed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_files()

    def _close_files(self) -> None:
        if self._active is not None:
            try:
                self._active.flush()
            finally:
                self._active.close()
        for segment in self._sealed:
            segment.close()


def _record_of(bundle: bytes | memoryview | None) -> bytes:
    """`{varint length, bundle}`: the bundle copied once."""
    if bundle is None:
        raise TypeError("an append without the bundle needs its record and facts")
    return b"".join((encode_varint(len(bundle)), bundle))


def log_append_for(path: str | None = None) -> Callable[..., AppendResult]:
    """PartitionLog.append as a function of (log, bundle, base_seq, facts, record): natively (_appender.log_append: its
    common case in one call, the rest through the method), or with `path` "python" or the environment's
    TIERED_PRODUCE_PATH=python (as the appender) the method itself, the reference."""
    choice = path or os.environ.get(PRODUCE_PATH_ENV, "native")
    return PartitionLog.append if choice == "python" or _log_append_native is None else _log_append_native
