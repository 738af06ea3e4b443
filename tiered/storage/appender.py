"""The appender of the active segment: its append state (where the next record goes, when the segment rolls, what
the index has seen and the index entries not yet in the index file, the timestamp bounds) and the one call per record
that decides, writes and indexes. One owner: the ActiveSegment holding it; everything else reads it through the
segment.

Two implementations, one behaviour: `_appender.c` (the native appender, the default when built; the GIL is released
during the write) and `PySegmentAppender` below, the reference the tests compare it against byte for byte
(tests/storage/test_appender.py). `TIERED_PRODUCE_PATH=python` selects the reference; it is read when a segment is
opened.

Invariants (both implementations):
- A record is written whole with writes at the file's end (the file is O_APPEND); `size` counts exactly the bytes
  written. A failed write cuts the file back to `size` (a failed cut back is logged) and raises the OSError; nothing
  else changes.
- Nothing is written when the record could not be indexed (its seq below the base or more than u32 above it, or
  its end past u32 bytes): ValueError. PartitionLog rolls before either can happen (`takes`).
- The index rule is TANK's (tiered.storage.index.IndexBuilder). Entries reach the in-memory SparseIndex at once
  and the index file in batches of INDEX_WRITE_BATCH bytes, and before any flush, seal or close (`write_entries`);
  a failed index write is logged and cut back to whole entries, and does not fail the append (as in TANK).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Protocol


from typing import NamedTuple

from tiered.protocol.bundle import BundleFacts
from tiered.storage.index import ENTRY, SparseIndex, should_index
from tiered.storage.topic_config import TopicConfig

log = logging.getLogger("tiered.storage")

INDEX_WRITE_BATCH = 4096  # bytes of index entries (512) written to the index file at once
# Index entries and segment positions are u32; a segment never grows a rel_seq or a position past these.
MAX_U32 = 0xFFFF_FFFF
MAX_POSITION = MAX_U32
MAX_REL_SEQ = 0x7FFF_FFFF  # TANK refuses (IMPLEMENT_ME) seq spans above INT32_MAX within one segment
PRODUCE_PATH_ENV = "TIERED_PRODUCE_PATH"  # "python": the reference appender; anything else: the native one when built
# The highest seq a log takes: the catalog (and every store of seqs beside the wire) holds them as signed 64-bit
# integers, so a seq above this would be appended here and then never committed. TANK's wire allows up to 2**64 - 1.
MAX_SEQ = (1 << 63) - 1


class AppendResult(NamedTuple):
    """One append; a NamedTuple rather than a frozen dataclass, as the produce path builds one per bundle (natively,
    in `append_next`)."""

    first_seq: int
    last_seq: int
    segment_base: int
    position: int
    end_position: int
    # Exactly the bytes written, {varint length, bundle}: bytes, or a read-only view of the produce request's payload
    # (ProducePartition.record), which keeps the payload alive. Consumers only read it, as a bytes-like object.
    record: bytes | memoryview
    header: BundleFacts  # the bundle's header and timestamp bounds, so later stages need not read it again


# AppendResult(...) runs the NamedTuple's generated __new__, a Python function (~2,300 instructions per append,
# measured with callgrind); this builds the same instance from C, from one tuple of its fields in order.
append_result: Callable[[tuple[object, ...]], AppendResult] = functools.partial(tuple.__new__, AppendResult)


def next_seqs(facts: BundleFacts, base_seq: int | None, last_assigned: int) -> tuple[int, int, bool]:
    """(first, last, explicit) of a bundle appended after `last_assigned` (docs/protocol.md §3.1): a sparse bundle's
    own, a 0x05 produce's from its base seq, else the next ones. `explicit`: named by the producer, so it must be
    above last_assigned."""
    if facts.first_seq is not None and facts.last_seq is not None:  # set iff the bundle is sparse
        return facts.first_seq, facts.last_seq, True
    if base_seq is not None:
        return base_seq, base_seq + facts.messages - 1, True
    return last_assigned + 1, last_assigned + facts.messages, False


def seqs_valid(first: int, last: int, explicit: bool, last_assigned: int) -> bool:
    """Whether a log may take first..last (else InvalidSeqnums, PartitionLog.append)."""
    return not (explicit and first <= last_assigned) and 1 <= first <= last <= MAX_SEQ


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    written = os.write(fd, data)  # almost always all of it, at once
    if written == len(data):
        return
    view = memoryview(data)[written:]
    while view:
        written = os.write(fd, view)
        view = view[written:]


class PySegmentAppender:
    """The reference appender (see the module's docstring)."""

    def __init__(self, path: str, index_path: str, log_fd: int, index_fd: int, base: int, size: int,
                 last: int | None, index: SparseIndex, since_last_update: int, created_ts: float,
                 roll_age_s: float):
        self.path = path
        self.index_path = index_path
        self.log_fd = log_fd
        self.index_fd = index_fd
        self.base = base
        self.size = size
        self.last = last
        self.index = index
        self.since_last_update = since_last_update
        self.created_ts = created_ts
        self.roll_age_s = roll_age_s
        self.unwritten = bytearray()
        # (min, max) timestamp of the records appended; complete while every record of the segment was appended
        # here with its bounds (a reopened segment's older records are not known).
        self.ts_low: int | None = None
        self.ts_high = 0
        self.ts_complete = size == 0

    @property
    def ts_bounds(self) -> tuple[int, int] | None:
        """The bounds of every record, or None when some are not known."""
        return (self.ts_low, self.ts_high) if self.ts_complete and self.ts_low is not None else None

    def takes(self, first_seq: int, last_seq: int, sparse: bool, record_len: int, now_s: float, segment_bytes: int,
              index_max_bytes: int, /) -> bool:
        """Whether the record goes into this segment; False: the log rolls first. TANK's should_roll() (evaluated
        before an append; an empty segment never rolls: size, index size, age), a plain bundle whose first seq does
        not follow the last (TANK rolls on a jump), and the u32 columns of the index (seq span, position)."""
        if self.last is not None:
            if not sparse and first_seq != self.last + 1:
                return False
            if self.size and (self.size > segment_bytes or len(self.index) * ENTRY.size > index_max_bytes
                              or now_s - self.created_ts > self.roll_age_s):
                return False
        return last_seq - self.base <= MAX_REL_SEQ and self.size + record_len <= MAX_POSITION

    def append_in_place(self, record: bytes | bytearray | memoryview, first_seq: int, last_seq: int, sparse: bool,
                        now_s: float, segment_bytes: int, index_max_bytes: int, interval: int, min_ts: int | None,
                        max_ts: int, /) -> int | None:
        """`append` when the segment holds a record and `takes` this one; else None, and nothing is written: the
        produce path's one call per record (the log's slower path creates, rolls, and appends)."""
        if self.last is None or not self.takes(first_seq, last_seq, sparse, len(record), now_s, segment_bytes,
                                               index_max_bytes):
            return None
        return self.append(record, first_seq, last_seq, interval, min_ts, max_ts)

    def append_record(self, record: bytes | bytearray | memoryview, first_seq: int, last_seq: int,
                      facts: BundleFacts, now_s: float, config: TopicConfig, /) -> int | None:
        """`append_in_place` with the bundle's facts (sparse, timestamp bounds) and the topic's config (segment,
        index and interval limits) read here: the partition log's one call per produced record."""
        return self.append_in_place(record, first_seq, last_seq, facts.sparse, now_s, config.log_segment_bytes,
                                    config.log_index_size_max_bytes, config.log_index_interval_bytes,
                                    facts.min_ts_ms, facts.max_ts_ms)

    def append_next(self, record: bytes | memoryview, facts: BundleFacts, base_seq: int | None, last_assigned: int,
                    now_s: float, config: TopicConfig, /) -> AppendResult | None:
        """The partition log's common append in one call: the record's seqs assigned after `last_assigned` (the
        log's, its one owner, which keeps the result's last_seq), and `append_record` when they are valid; the
        AppendResult, or None: nothing written, and the log's own path decides (refuses invalid seqs, creates or
        rolls the segment)."""
        first, last, explicit = next_seqs(facts, base_seq, last_assigned)
        if not seqs_valid(first, last, explicit, last_assigned):
            return None
        position = self.append_record(record, first, last, facts, now_s, config)
        if position is None:
            return None
        return append_result((first, last, self.base, position, position + len(record), record, facts))

    def append(self, record: bytes | bytearray | memoryview, first_seq: int, last_seq: int, interval: int,
               min_ts: int | None,
               max_ts: int = 0, /) -> int:
        """Writes one record; returns its position. `min_ts` None: its bounds are unknown (and so the segment's)."""
        position = self.size
        rel_seq = first_seq - self.base
        if rel_seq < 0 or rel_seq > MAX_U32 or position + len(record) > MAX_U32:
            raise ValueError(f"record {first_seq}..{last_seq} at {position} cannot be indexed in the segment based "
                             f"at {self.base}")
        try:
            write_all(self.log_fd, record)
        except OSError:
            try:
                os.ftruncate(self.log_fd, position)
            except OSError as exc:
                log.error("could not cut %s back to %d after a failed append: %s", self.path, position, exc)
            raise
        self.size = position + len(record)
        self.last = last_seq
        if min_ts is None:
            self.ts_complete = False
        elif self.ts_low is None:
            self.ts_low, self.ts_high = min_ts, max_ts
        else:
            self.ts_low, self.ts_high = min(self.ts_low, min_ts), max(self.ts_high, max_ts)
        if should_index(self.since_last_update, interval):
            self.index.append(rel_seq, position)
            self.since_last_update = 0
            self.unwritten += ENTRY.pack(rel_seq, position)
            if len(self.unwritten) >= INDEX_WRITE_BATCH:
                self.write_entries()
        self.since_last_update += len(record)
        return position

    def write_entries(self) -> None:
        """Writes the entries the index file lacks. A failure is logged: readers use the in-memory index, and an
        entry the file lacks only makes lookups walk further (recovery re-adds trailing ones)."""
        pending, self.unwritten = self.unwritten, bytearray()
        if not pending or self.index_fd < 0:
            return
        expected = None
        try:
            expected = os.fstat(self.index_fd).st_size
            write_all(self.index_fd, pending)
        except OSError as exc:
            log.error("could not write %d index entries to %s: %s", len(pending) // ENTRY.size, self.index_path, exc)
            if expected is None:
                return
            try:
                os.ftruncate(self.index_fd, expected - expected % ENTRY.size)
            except OSError as exc:
                log.error("could not cut %s back to whole entries: %s", self.index_path, exc)

    def close(self) -> None:
        """Writes the pending entries and closes both files (again: nothing)."""
        self.write_entries()
        for fd in (self.log_fd, self.index_fd):
            if fd >= 0:
                os.close(fd)
        self.log_fd = self.index_fd = -1


class SegmentAppender(Protocol):
    """What an ActiveSegment asks of its appender, whichever implements it."""

    @property
    def log_fd(self) -> int: ...
    @property
    def index_fd(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def last(self) -> int | None: ...
    @property
    def index(self) -> SparseIndex: ...
    @property
    def since_last_update(self) -> int: ...
    @property
    def ts_bounds(self) -> tuple[int, int] | None: ...
    @property
    def unwritten(self) -> bytearray: ...

    def takes(self, first_seq: int, last_seq: int, sparse: bool, record_len: int, now_s: float, segment_bytes: int,
              index_max_bytes: int, /) -> bool: ...

    def append_in_place(self, record: bytes | bytearray | memoryview, first_seq: int, last_seq: int, sparse: bool,
                        now_s: float, segment_bytes: int, index_max_bytes: int, interval: int, min_ts: int | None,
                        max_ts: int, /) -> int | None: ...

    def append_record(self, record: bytes | bytearray | memoryview, first_seq: int, last_seq: int,
                      facts: BundleFacts, now_s: float, config: TopicConfig, /) -> int | None: ...

    def append_next(self, record: bytes | memoryview, facts: BundleFacts, base_seq: int | None, last_assigned: int,
                    now_s: float, config: TopicConfig, /) -> AppendResult | None: ...

    def append(self, record: bytes | bytearray | memoryview, first_seq: int, last_seq: int, interval: int,
               min_ts: int | None, max_ts: int = 0, /) -> int: ...

    def write_entries(self) -> None: ...

    def close(self) -> None: ...


TailFactory = Callable[[str, str, int, int, int, int, "int | None", SparseIndex, int, float, float], SegmentAppender]
NativeSegmentAppender: type[SegmentAppender] | None
try:
    from tiered.storage._appender import SegmentAppender as NativeSegmentAppender
    from tiered.storage._appender import register as _register_native
except ImportError:  # built without a C compiler: the reference serves
    NativeSegmentAppender = None
else:
    _register_native(AppendResult)  # append_next builds AppendResults by position, as append_result does


def appender_class(path: str | None = None) -> TailFactory:
    """The appender implementation a segment opened now uses: `path` "python" or "native", else the environment's
    choice (PRODUCE_PATH_ENV), else the native one when it is built."""
    choice = path or os.environ.get(PRODUCE_PATH_ENV, "native")
    if choice == "python" or NativeSegmentAppender is None:
        return PySegmentAppender
    return NativeSegmentAppender
