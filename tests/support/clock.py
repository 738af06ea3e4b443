"""A clock that moves only when the test says so, for the parts that take a `tiered.clock.Clock`.

`advance(seconds)` moves both the wall and the monotonic clock and wakes every `sleep` that is now due, in order;
`await settle()` lets the woken tasks run. Nothing here ever waits on real time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class ManualClock:
    def __init__(self, start_ms: float = 1_700_000_000_000.0):
        self._now_ms = start_ms
        self._mono = 1000.0
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._ids = itertools.count()

    def now_ms(self) -> float:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + max(seconds, 0.0), next(self._ids), future))
        await future

    @property
    def sleeping(self) -> int:
        return sum(1 for *_, f in self._sleepers if not f.done())

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._now_ms += seconds * 1000.0
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    async def settle(self, turns: int = 20) -> None:
        """Lets the event loop run the tasks woken so far (and what they wake in turn)."""
        for _ in range(turns):
            await asyncio.sleep(0)
