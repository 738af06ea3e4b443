"""The remote reader's caches (tiered.tiering.reads.remote_fetch, tiered.tiering.reads.run_reads).

- `RangeCache`: recently used catalog locations (remote segment rows, block run locations) per partition, looked
  up by seq, so a warm fetch needs no catalog query. Entries can only go stale by deletion, whose objects stay a
  grace period longer than an entry lives here (`ttl_s`), so a cached location's object still exists when read.
  A remote compaction also replaces locations: the broker that swapped them forgets the partition's entries
  (`forget`), so that its consumers read the compacted history from then on rather than for up to `ttl_s` more.
- `SizedLru`: values kept by least recent use up to a byte budget (index objects, the bytes of block runs).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, Protocol, TypeVar

from tiered.topic_partition import TopicPartition


class Ranged(Protocol):
    topic: str
    partition: int
    from_seq: int
    last_seq: int


R = TypeVar("R", bound=Ranged)
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RangeCache(Generic[R]):
    def __init__(self, monotonic: Callable[[], float], per_partition: int = 64, ttl_s: float = 60.0):
        self.per_partition = per_partition
        self.ttl_s = ttl_s
        self.clock = monotonic  # seconds (tiered.clock.Clock.monotonic of the reader's clock)
        self._rows: dict[TopicPartition, OrderedDict[int, tuple[float, R]]] = {}

    def get(self, tp: TopicPartition, seq: int) -> R | None:
        """The cached location answering for `seq` (from_seq <= seq <= last_seq), or None."""
        rows = self._rows.get(tp)
        if not rows:
            return None
        now = self.clock()
        for key, (born, row) in list(rows.items()):
            if now - born > self.ttl_s:
                del rows[key]
            elif row.from_seq <= seq <= row.last_seq:
                rows.move_to_end(key)
                return row
        return None

    def forget(self, tp: TopicPartition) -> None:
        """Drops the partition's entries: its locations were replaced (a remote compaction swapped them)."""
        self._rows.pop(tp, None)

    def put(self, row: R) -> None:
        rows = self._rows.setdefault(TopicPartition(row.topic, row.partition), OrderedDict())
        rows[row.last_seq] = (self.clock(), row)
        rows.move_to_end(row.last_seq)
        while len(rows) > self.per_partition:
            rows.popitem(last=False)


class SizedLru(Generic[K, V]):
    def __init__(self, max_bytes: int, size_of: Callable[[V], int]):
        self.max_bytes = max_bytes
        self.size_of = size_of
        self.size_bytes = 0
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        size = self.size_of(value)
        if key in self._entries or size > self.max_bytes:
            return
        self._entries[key] = value
        self.size_bytes += size
        while self.size_bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.size_bytes -= self.size_of(old)
