"""Long-poll consume waiters, as TANK's service_wait.cpp.

A consume whose partitions are all at their tail waits until the bytes that become visible on those partitions add
up to `min_bytes` (any visible append when it is 0), or until its deadline. A waiter remembers, per partition, the
seq it is waiting for; when it fires, the response reads from there. On a durable topic bytes become visible when
their block is committed, not when they are appended (docs/architecture.md, "Visibility follows durability").
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tiered.topic_partition import TopicPartition

MAX_WAIT_CAP_MS = 3_600_000
MIN_WAIT_MS = 320
TIMER_GRANULARITY_MS = 128


def normalized_max_wait_ms(max_wait_ms: int) -> int:
    """TANK's normalized_max_wait(): 0 stays 0, else max(320, round_up_64(min(v, 1 h)))."""
    if max_wait_ms == 0:
        return 0
    value = min(max_wait_ms, MAX_WAIT_CAP_MS)
    value = (value + 63) // 64 * 64
    return max(MIN_WAIT_MS, value)


def wakeup_deadline_ms(now_ms: float, max_wait_ms: int) -> int:
    """The wake-up time in ms, aligned up to TANK's 128 ms timer granularity."""
    return int(math.ceil((now_ms + normalized_max_wait_ms(max_wait_ms)) / TIMER_GRANULARITY_MS)) * TIMER_GRANULARITY_MS


@dataclass(eq=False)
class Waiter:
    """One deferred consume. `seqs` maps each partition to the seq the response starts from."""

    seqs: dict[TopicPartition, int]
    min_bytes: int
    future: asyncio.Future
    captured_bytes: int = 0
    first_seen: dict[TopicPartition, int] = field(default_factory=dict)

    def fire(self, reason: str) -> None:
        if not self.future.done():
            self.future.set_result(reason)


class Waiters:
    """Waiters indexed by partition, so that a visible append touches only its own waiters."""

    def __init__(self) -> None:
        self._by_partition: dict[TopicPartition, set[Waiter]] = {}

    @property
    def waiting(self) -> Mapping[TopicPartition, set[Waiter]]:
        """The partitions with waiters, as kept here (not a copy; changed only by add and remove): `visible` has
        nothing to do for a partition not in it, which the produce path's native call checks itself."""
        return self._by_partition

    def add(self, waiter: Waiter) -> None:
        for tp in waiter.seqs:
            self._by_partition.setdefault(tp, set()).add(waiter)

    def remove(self, waiter: Waiter) -> None:
        for tp in waiter.seqs:
            bucket = self._by_partition.get(tp)
            if bucket is not None:
                bucket.discard(waiter)
                if not bucket:
                    del self._by_partition[tp]

    def visible(self, tp: TopicPartition, first_seq: int, size_bytes: int) -> None:
        """Bytes from `first_seq` on became visible on a partition: wake the waiters that now have enough."""
        bucket = self._by_partition.get(tp)
        if not bucket:
            return
        for waiter in list(bucket):
            waiter.first_seen.setdefault(tp, first_seq)
            waiter.captured_bytes += size_bytes
            if waiter.captured_bytes >= waiter.min_bytes:
                waiter.fire("data")

    def wake_partition(self, tp: TopicPartition, reason: str = "moved") -> None:
        """The partition is no longer served here: its waiters answer now (as a timeout)."""
        for waiter in list(self._by_partition.get(tp, ())):
            waiter.fire(reason)

    def wake_all(self, reason: str = "shutdown") -> None:
        for bucket in list(self._by_partition.values()):
            for waiter in list(bucket):
                waiter.fire(reason)

    def __len__(self) -> int:
        return len({w for bucket in self._by_partition.values() for w in bucket})

