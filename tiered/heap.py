"""The broker's long-lived objects, set aside from CPython's cyclic collector.

A broker holds a few dozen tracked objects per partition it knows (its log, segments, index, config, tier state):
some 3 million at 100,000 partitions. CPython's full collection walks every tracked object that is not frozen, with
the GIL held: measured at that size, 0.6-0.8 s per full pass, and one came every few seconds while partitions were
created or claimed (each batch of new long-lived objects counts towards the next full pass), so a new leader stood
still for most of a second in the middle of a handover and the longest gap of a partition doubled.

So the owner of the process's collector state is `Heap`: after start-up and after each bulk growth of long-lived
state (a topic laid out here, a batch of partitions led) it collects the young generations and freezes what is left
(`gc.freeze`): a later full pass walks only what came since, and takes milliseconds. Frozen objects are still freed
when their last reference goes (reference counting); only a cycle among them that becomes garbage waits for
`thaw`, which `Broker.stop` calls once it has handed over and closed (a process may start another broker: the tests
do). Not a full collection before freezing: in a process that runs many brokers one after another, each would walk
the whole heap; what is young is collected, what survived two collections is long-lived by the collector's own rule.

The broker drops long-lived state rarely and never in bulk (no topic is deleted from a running broker; a damaged
partition reopened empty and sealed segments deleted by retention are the exceptions, their objects freed by
reference counting unless in a cycle), so what a freeze can keep beyond its time is bounded by those events.
"""

from __future__ import annotations

import gc
import logging
from typing import Callable

log = logging.getLogger("tiered")

SLOW_SETTLE_S = 0.05  # a settle that took longer is logged (it holds the GIL: requests wait)


class Heap:
    """Freezes the process's long-lived objects after they grow (`settle`), unfreezes them at stop (`thaw`)."""

    def __init__(self, monotonic: Callable[[], float]):
        self.monotonic = monotonic
        self.settles = 0  # exported as tiered_heap_settles_total

    def settle(self, why: str) -> None:
        """Collects the young generations and freezes every tracked object left: call after bulk growth of
        long-lived state, on the event loop, between requests."""
        started = self.monotonic()
        gc.collect(1)
        gc.freeze()
        self.settles += 1
        took = self.monotonic() - started
        if took > SLOW_SETTLE_S:
            log.info("heap settled after %s in %.3f s (%d objects frozen)", why, took, gc.get_freeze_count())

    @staticmethod
    def thaw() -> None:
        """What was set aside is collectable again (at stop: a cycle among frozen objects is freed by the next full
        pass)."""
        gc.unfreeze()

    @staticmethod
    def frozen() -> int:
        """Objects set aside from the collector now (exported as tiered_heap_frozen_objects)."""
        return gc.get_freeze_count()
