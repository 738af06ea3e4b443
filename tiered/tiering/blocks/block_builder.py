"""The block builder: one per broker, shared by every partition it leads (docs/architecture.md, data path step 2).

Appended records wait here until their block closes: when the oldest pending record is `max_age_ms` old, or when
the pending bytes reach `max_bytes`. A block is never empty. Records are grouped by partition in first-appended
order, byte for byte as they sit in the segment files; a partition's records are split into a new run where its
local segment rolled, so that every run lies inside one segment and the remote segment covers its runs exactly.

Each partition's runs chain: a run answers from the seq after the previous run's last (its `from_seq`), starting at
the catalog's high-water mark + 1 when the partition was claimed (`lead`). The commit checks that chain against the
catalog (tiered.catalog.blocks.commit_block), so a block can neither reuse a committed seq nor skip one.

The builder is pure bookkeeping: no I/O, no clock of its own (callers pass `now_ms`), so it is tested directly.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from tiered.catalog.blocks import RunMeta
from tiered.protocol.bundle import BundleFacts, bundle_facts, maybe_record
from tiered.storage.appender import PRODUCE_PATH_ENV
from tiered.tier_interface import AckOutcome
from tiered.tiering.blocks.block_format import INDEX_EVERY_BYTES
from tiered.tiering.partition_state import TierState
from tiered.topic_partition import TopicPartition
from tiered.tiering.objects.store import Piece



@dataclass
class PyPendingRun:
    """One partition's records of one local segment, waiting for the next block. The reference; PendingRun below is
    the same fields held in C (_builder.Run) when the native module is built."""

    topic: str
    partition: int
    leader_epoch: int
    segment_base: int
    from_seq: int
    first_seq: int
    last_seq: int
    records: list[Piece] = field(default_factory=list)  # as AppendResult.record: bytes or read-only views
    messages: int = 0
    min_ts_ms: int = 0
    max_ts_ms: int = 0
    size_bytes: int = 0
    # The run's bundle index as the block footer stores it (tiered.tiering.blocks.block_format, version 3): (first seq,
    # position in the run) of each record starting at least INDEX_EVERY_BYTES past the previous entry.
    index: list[tuple[int, int]] = field(default_factory=list)
    indexed_at: int = 0  # position of the last entry (0: the run's start)

    def meta(self) -> RunMeta:
        return RunMeta(self.topic, self.partition, self.from_seq, self.first_seq, self.last_seq, self.messages,
                       self.min_ts_ms, self.max_ts_ms, self.leader_epoch)


def run_fields(run: PyPendingRun | PendingRun) -> tuple:
    """Every field of a run, in PyPendingRun's order: what two runs are compared by, whichever class holds them."""
    return tuple(getattr(run, f.name) for f in fields(PyPendingRun))


_add_to_run_native: Callable[..., int | None] | None
_BuilderBase: type
try:
    from tiered.tiering.blocks._builder import Builder as _BuilderBase, Run as _Run, add_to_run as _add_to_run_native
except ImportError:  # built without a C compiler: the reference serves
    PendingRun = PyPendingRun
    _add_to_run_native = None
    _BuilderBase = object
else:
    class PendingRun(_Run):  # type: ignore[no-redef]
        """PyPendingRun's fields held in C, so that `add_to_run` updates them without a lookup each."""

        __slots__ = ()
        meta = PyPendingRun.meta

        def __eq__(self, other: object) -> bool:
            return isinstance(other, (PendingRun, PyPendingRun)) and run_fields(self) == run_fields(other)

        __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass

        def __repr__(self) -> str:
            return "PendingRun" + repr(run_fields(self))


@dataclass
class ClosedBlock:
    """A block ready to upload: its runs (in block order) and the acknowledgements waiting on it."""

    runs: list[PendingRun]
    acks: list[tuple[TopicPartition, asyncio.Future]]  # each producer waiting on this block, by partition
    opened_ms: float
    size_bytes: int

    def partitions(self) -> list[TopicPartition]:
        return list(dict.fromkeys(TopicPartition(r.topic, r.partition) for r in self.runs))


# Timestamp bounds are recorded in signed 64-bit integers (the catalog's columns, and the block footers the catalog is
# rebuilt from), while a message's stamp is a u64. A stamp above this is recorded as this: the bounds stay safe for
# time pruning, since no time range the catalog can express tells the two apart.
MAX_RECORDED_TS_MS = (1 << 63) - 1


def recorded_ts_bounds(low: int, high: int) -> tuple[int, int]:
    return min(low, MAX_RECORDED_TS_MS), min(high, MAX_RECORDED_TS_MS)


def record_stats(record: Piece, facts: BundleFacts | None = None) -> tuple[int, int, int]:
    """(messages, min ts, max ts as recorded) of one `{varint len, bundle}` record: from the `facts` the append path
    validated it with, else from one native pass over the bundle (records re-read from disk at start-up)."""
    if facts is None:
        start, end = maybe_record(record)
        facts = bundle_facts(memoryview(record)[start:end])
    return (facts.messages, *recorded_ts_bounds(facts.min_ts_ms, facts.max_ts_ms))


def _add_record(run: PendingRun, first_seq: int, last_seq: int, record: Piece, messages: int, low: int, high: int,
                index_every: int, next_from: dict[TopicPartition, int], key: TopicPartition) -> int:
    """The record added to `run`, its partition's open run, and the partition's next seq moved past it; its size.
    How a run grows on the Python paths (the native add_to_run does the same)."""
    size = len(record)
    if run.size_bytes - run.indexed_at >= index_every:
        run.index.append((first_seq, run.size_bytes))
        run.indexed_at = run.size_bytes
    run.last_seq = last_seq
    run.records.append(record)
    run.messages += messages
    if low < run.min_ts_ms:
        run.min_ts_ms = low
    if high > run.max_ts_ms:
        run.max_ts_ms = high
    run.size_bytes += size
    next_from[key] = last_seq + 1
    return size


def _add_to_run_py(runs: dict[TopicPartition, list[PendingRun]], next_from: dict[TopicPartition, int],
                   key: TopicPartition, first_seq: int, last_seq: int, record: Piece, segment_base: int,
                   facts: BundleFacts | None, index_every: int) -> int | None:
    """BlockBuilder.add's common case, the reference of the native `add_to_run` (_builder.c): a record of a partition
    led by the builder that follows its last, with the append path's facts in range, into the partition's open run
    (the same segment): added (_add_record), and its size. Otherwise None, and nothing changed."""
    following = next_from.get(key)
    if following is None or first_seq < following or facts is None or facts.max_ts_ms > MAX_RECORDED_TS_MS:
        return None
    partition_runs = runs.get(key)
    if not partition_runs or partition_runs[-1].segment_base != segment_base:
        return None
    return _add_record(partition_runs[-1], first_seq, last_seq, record, facts.messages, facts.min_ts_ms,
                       facts.max_ts_ms, index_every, next_from, key)


def add_to_run_for(path: str | None = None) -> Callable[..., int | None]:
    """The implementation of BlockBuilder.add's common case a builder made now uses: the reference with `path`
    "python" or the environment's TIERED_PRODUCE_PATH=python (as the segment appender), else the native one when
    built."""
    choice = path or os.environ.get(PRODUCE_PATH_ENV, "native")
    return _add_to_run_py if choice == "python" or _add_to_run_native is None else _add_to_run_native


class NotLeading(Exception):
    """A record for a partition the builder was not told to lead (`lead`), or one that does not follow its last."""


class BlockBuilder(_BuilderBase):  # type: ignore[misc,valid-type]
    """Gathers the records of the partitions led here into the next block. Whether a partition is led, and under which
    epoch, is the tier state's (tiered.tiering.partition_state); the builder keeps only where each partition's next
    run continues from.

    With the native module built, the fields `add` changes per record are held in C (`_builder.Builder`, the base:
    the same attributes) and `add` is its native method, which takes the common case itself and hands the rest to
    `_add`; `add_py` is the reference, and serves whenever `_add_to_run` is not the native add_to_run
    (TIERED_PRODUCE_PATH=python)."""

    def __init__(self, state: TierState, max_bytes: int = 8 << 20, max_age_ms: int = 250):
        self.state = state
        self._led_epochs = state.led_epochs_held()  # epoch_of's answers, as the native add reads them
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        self._runs: dict[TopicPartition, list[PendingRun]] = {}
        self._acks: list[tuple[TopicPartition, asyncio.Future]] = []
        # Bytes of the pending records: read by the durable path after every add (a plain attribute, not a
        # property: one read per produced record), changed only by the builder.
        self.pending_bytes = 0
        self._opened_ms: float | None = None
        self._next_from: dict[TopicPartition, int] = {}  # per partition opened here: its next run's from_seq
        self._add_to_run = add_to_run_for()
        self.index_every = INDEX_EVERY_BYTES

    @property
    def opened_ms(self) -> float | None:
        """When the oldest pending record arrived, or None."""
        return self._opened_ms

    @property
    def empty(self) -> bool:
        return not self._runs

    def lead(self, tp: TopicPartition) -> None:
        """From now on records of the partition (led here: TierState.lead first) are taken, continuing its committed
        seq. Pending records of an earlier lead are dropped (they can no longer be committed)."""
        self.release(tp)
        self._next_from[tp] = self.state.committed_seq(tp) + 1

    def release(self, tp: TopicPartition) -> None:
        """Stops leading the partition (fenced): its pending records are dropped, their acks REFUSED."""
        self._next_from.pop(tp, None)
        runs = self._runs.pop(tp, None)
        if runs:
            self.pending_bytes -= sum(r.size_bytes for r in runs)
            kept = []
            for key, ack in self._acks:
                if key == tp:
                    if not ack.done():
                        ack.set_result(AckOutcome.REFUSED)
                else:
                    kept.append((key, ack))
            self._acks = kept
            if not self._runs:
                self._opened_ms = None

    def add_py(self, key: TopicPartition, first_seq: int, last_seq: int, record: Piece, segment_base: int,
               now_ms: float, ack: asyncio.Future | None = None, facts: BundleFacts | None = None) -> bool:
        """Adds one record; True when it opened the pending block (the builder was empty). Records of a partition
        must arrive in seq order (the partition log's append order). `facts`: what validate_bundle found for its
        bundle (AppendResult.header), when the caller has them. The reference of the native `add`."""
        epoch = self.state.epoch_of(key)
        # Most records: one call adds it to the partition's open run (add_to_run); the rest in _add.
        size = None if epoch is None else self._add_to_run(self._runs, self._next_from, key, first_seq, last_seq,
                                                           record, segment_base, facts, INDEX_EVERY_BYTES)
        if size is None:
            size = self._add(key, first_seq, last_seq, record, segment_base, epoch, facts)
        self.pending_bytes += size
        if ack is not None:
            self._acks.append((key, ack))
        if self._opened_ms is None:
            self._opened_ms = now_ms
            return True
        return False

    if _BuilderBase is object:  # built without a C compiler: the reference is `add`
        add = add_py

    def _add(self, key: TopicPartition, first_seq: int, last_seq: int, record: Piece, segment_base: int,
             epoch: int | None, facts: BundleFacts | None) -> int:
        """`add` of a record add_to_run did not take: refused (NotLeading), the first of its run, or without the
        append path's facts in range. Returns its size."""
        next_from = self._next_from.get(key)
        if next_from is None or epoch is None:
            raise NotLeading(f"{key} is not led by this builder")
        if first_seq < next_from:
            raise NotLeading(f"{key}: record {first_seq} does not follow {next_from - 1}")
        if facts is None or facts.max_ts_ms > MAX_RECORDED_TS_MS:
            messages, low, high = record_stats(record, facts)
        else:  # the append path's facts, already in range: what record_stats would return (once per append)
            messages, low, high = facts.messages, facts.min_ts_ms, facts.max_ts_ms
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = []
            run = None
        else:
            run = runs[-1]
        if run is None or run.segment_base != segment_base:
            run = PendingRun(key.topic, key.partition, epoch, segment_base, next_from, first_seq, last_seq,
                             min_ts_ms=low, max_ts_ms=high)
            runs.append(run)
        return _add_record(run, first_seq, last_seq, record, messages, low, high, INDEX_EVERY_BYTES,
                           self._next_from, key)

    def due_ms(self) -> float | None:
        """When the pending block must close by age, or None when nothing is pending."""
        return None if self._opened_ms is None else self._opened_ms + self.max_age_ms

    def should_close(self, now_ms: float) -> bool:
        if self._opened_ms is None:
            return False
        return self.pending_bytes >= self.max_bytes or now_ms >= self._opened_ms + self.max_age_ms

    def close(self) -> ClosedBlock | None:
        """Takes everything pending as one block, or None when nothing is pending (an empty block is never built)."""
        if not self._runs:
            return None
        runs = [run for partition_runs in self._runs.values() for run in partition_runs]
        block = ClosedBlock(runs, self._acks, self._opened_ms or 0.0, self.pending_bytes)
        self._runs = {}
        self._acks = []
        self.pending_bytes = 0
        self._opened_ms = None
        return block
