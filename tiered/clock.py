"""Time, passed in wherever it matters (ack timeouts, long-poll deadlines, block windows, background timers), so that
the parts that decide by time are tested with a clock the test moves by hand (tests/support/clock.py).

`now_ms` is wall time (it is written to the catalog and compared with other hosts' records); `monotonic` measures
intervals and deadlines; `sleep` waits on the same clock, so a fake clock's waiters wake when the test advances it.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> float:
        """Wall-clock time in milliseconds since the epoch."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: for intervals and deadlines."""

    async def sleep(self, seconds: float) -> None:
        """Waits `seconds` on this clock."""


class SystemClock:
    """The real clock."""

    def now_ms(self) -> float:
        return time.time() * 1000.0

    # The C function itself, not a method wrapping it: the produce path reads it several times per request.
    monotonic = staticmethod(time.monotonic)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


SYSTEM_CLOCK = SystemClock()


def utc_now(clock: Clock) -> datetime:
    """The clock's wall time as an aware UTC datetime: what catalog functions that record or compare times take."""
    return datetime.fromtimestamp(clock.now_ms() / 1000.0, timezone.utc)


async def wait_for_event(clock: Clock, event: asyncio.Event, seconds: float) -> bool:
    """Waits until `event` is set or `seconds` pass on `clock`; True if the event was set."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, timer):
            if not task.done():
                task.cancel()
    return event.is_set()
