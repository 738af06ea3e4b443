"""The block builder: one per broker, shared by every partition (DESIGN.md, data path step 2).

Appended records wait here until their block closes: when the oldest pending record is `max_age_ms` old, or when
the pending bytes reach `max_bytes`. A block is never empty. Records are grouped by partition in first-appended
order, so each partition's records form one contiguous run, byte for byte as they sit in the segment files.

The builder is pure bookkeeping: no I/O, no clock of its own (callers pass `now_ms`), so it is tested directly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tiered.protocol.bundle import BundleFacts, bundle_facts, maybe_record
from tiered.tiering.block_format import RunMeta

PartitionKey = tuple[str, int]


@dataclass
class PendingRun:
    """One partition's records waiting for the next block."""

    topic: str
    partition: int
    first_seq: int
    last_seq: int
    records: list[bytes] = field(default_factory=list)
    messages: int = 0
    min_ts_ms: int = 0
    max_ts_ms: int = 0
    size_bytes: int = 0

    def meta(self) -> RunMeta:
        return RunMeta(self.topic, self.partition, self.first_seq, self.last_seq, self.messages,
                       self.min_ts_ms, self.max_ts_ms)


@dataclass
class ClosedBlock:
    """A block ready to upload: its runs (in block order) and the acknowledgements waiting on it."""

    runs: list[PendingRun]
    acks: list[tuple[PartitionKey, asyncio.Future]]  # each producer waiting on this block, by partition
    opened_ms: float
    size_bytes: int

    def partitions(self) -> list[PartitionKey]:
        return [(r.topic, r.partition) for r in self.runs]


# Timestamp bounds are recorded in signed 64-bit integers (the catalog's columns, and the block footers the catalog is
# rebuilt from), while a message's stamp is a u64. A stamp above this is recorded as this: the bounds stay safe for
# time pruning, since no time range the catalog can express tells the two apart.
MAX_RECORDED_TS_MS = (1 << 63) - 1


def recorded_ts_bounds(low: int, high: int) -> tuple[int, int]:
    return min(low, MAX_RECORDED_TS_MS), min(high, MAX_RECORDED_TS_MS)


def record_stats(record: bytes, facts: BundleFacts | None = None) -> tuple[int, int, int]:
    """(messages, min ts, max ts as recorded) of one `{varint len, bundle}` record: from the `facts` the append path
    validated it with, else from one native pass over the bundle (records re-read from disk at start-up)."""
    if facts is None:
        start, end = maybe_record(record)
        facts = bundle_facts(memoryview(record)[start:end])
    return (facts.count, *recorded_ts_bounds(facts.min_ts_ms, facts.max_ts_ms))


class BlockBuilder:
    def __init__(self, max_bytes: int = 8 << 20, max_age_ms: int = 250):
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        self._runs: dict[PartitionKey, PendingRun] = {}
        self._acks: list[tuple[PartitionKey, asyncio.Future]] = []
        self._size = 0
        self._opened_ms: float | None = None

    @property
    def pending_bytes(self) -> int:
        return self._size

    @property
    def opened_ms(self) -> float | None:
        """When the oldest pending record arrived, or None."""
        return self._opened_ms

    @property
    def empty(self) -> bool:
        return not self._runs

    def add(self, topic: str, partition: int, first_seq: int, last_seq: int, record: bytes, now_ms: float,
            ack: asyncio.Future | None = None, facts: BundleFacts | None = None) -> None:
        """Adds one record. Records of a partition must arrive in seq order (the partition log's append order).
        `facts`: what validate_bundle found for its bundle (AppendResult.header), when the caller has them."""
        messages, low, high = record_stats(record, facts)
        run = self._runs.get((topic, partition))
        if run is None:
            run = PendingRun(topic, partition, first_seq, last_seq, min_ts_ms=low, max_ts_ms=high)
            self._runs[(topic, partition)] = run
        elif first_seq <= run.last_seq:
            raise ValueError(f"{topic}/{partition}: record {first_seq} is not after {run.last_seq}")
        run.last_seq = last_seq
        run.records.append(record)
        run.messages += messages
        run.min_ts_ms = min(run.min_ts_ms, low)
        run.max_ts_ms = max(run.max_ts_ms, high)
        run.size_bytes += len(record)
        self._size += len(record)
        if ack is not None:
            self._acks.append(((topic, partition), ack))
        if self._opened_ms is None:
            self._opened_ms = now_ms

    def due_ms(self) -> float | None:
        """When the pending block must close by age, or None when nothing is pending."""
        return None if self._opened_ms is None else self._opened_ms + self.max_age_ms

    def should_close(self, now_ms: float) -> bool:
        if self._opened_ms is None:
            return False
        return self._size >= self.max_bytes or now_ms >= self._opened_ms + self.max_age_ms

    def close(self) -> ClosedBlock | None:
        """Takes everything pending as one block, or None when nothing is pending (an empty block is never built)."""
        if not self._runs:
            return None
        block = ClosedBlock(list(self._runs.values()), self._acks, self._opened_ms or 0.0, self._size)
        self._runs = {}
        self._acks = []
        self._size = 0
        self._opened_ms = None
        return block
