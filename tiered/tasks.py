"""Background tasks that never die silently.

Every long-running loop of the broker (block timer, segment copier, retention, reconciler, heartbeat) runs under a
`Supervisor`. A loop that raises is logged, counted (`tiered_task_restarts_total`), shown as failing by `/readyz`
until it has run cleanly again, and restarted after a backoff that grows to `max_backoff_s`. A periodic step that
fails (`every`) is the same, retried at its interval. An outage (the catalog or the store not answering) is one
line when it starts and one when it ends; anything else is a bug and its traceback is logged, once per series.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from tiered.cancellation import cancel_until_done
from tiered.catalog.errors import CatalogUnavailable
from tiered.clock import SYSTEM_CLOCK, Clock
from tiered.metrics import TASK_FAILURES, TASK_RESTARTS, Metrics

log = logging.getLogger("tiered.tasks")

# Failures of the parts a broker depends on, not of its own code; a Supervisor may be given more (the store's).
OUTAGES: tuple[type[BaseException], ...] = (CatalogUnavailable, OSError, TimeoutError)


class Supervisor:
    def __init__(self, metrics: Metrics, *, clock: Clock = SYSTEM_CLOCK, first_backoff_s: float = 0.1,
                 max_backoff_s: float = 10.0, outages: tuple[type[BaseException], ...] = OUTAGES):
        self.metrics = metrics
        self.outages = outages
        self.clock = clock
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.failing: dict[str, str] = {}  # task name -> its last error, while it has not recovered

    def start(self, name: str, loop_fn: Callable[[], Awaitable[None]]) -> None:
        """Runs `loop_fn()` until it returns; restarts it whenever it raises."""
        self._tasks[name] = asyncio.get_running_loop().create_task(self._supervise(name, loop_fn), name=name)

    def every(self, name: str, interval_s: float, step: Callable[[], Awaitable[object]]) -> None:
        """Runs `step()` every `interval_s` (first after one interval)."""

        async def periodic() -> None:
            while True:
                await self.clock.sleep(interval_s)
                try:
                    await step()
                except Exception as exc:
                    self._failed(name, exc, restart=False)
                else:
                    self._recovered(name)

        self.start(name, periodic)

    async def _supervise(self, name: str, loop_fn: Callable[[], Awaitable[None]]) -> None:
        backoff = self.first_backoff_s
        while True:
            started = self.clock.monotonic()
            # A restarted loop that runs for a while without failing again is healthy again.
            healthy = asyncio.ensure_future(self._healthy_after(name, self.max_backoff_s))
            try:
                await loop_fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(name, exc, restart=True)
            finally:
                healthy.cancel()
            if self.clock.monotonic() - started > self.max_backoff_s:
                backoff = self.first_backoff_s  # it ran a while: a fresh failure, not a crash loop
            await self.clock.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _failed(self, name: str, exc: Exception, *, restart: bool) -> None:
        first = name not in self.failing
        self.failing[name] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self.metrics.inc(TASK_RESTARTS if restart else TASK_FAILURES)
        if not first:
            return
        outage = isinstance(exc, self.outages)
        what = f"background task {name} died" if restart else f"{name} failed"
        log.log(logging.WARNING if outage else logging.ERROR, "%s: %s; %s", what, self.failing[name],
                "restarting it" if restart else "retrying", exc_info=not outage)

    def _recovered(self, name: str) -> None:
        if self.failing.pop(name, None) is not None:
            log.info("%s works again", name)

    async def _healthy_after(self, name: str, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self._recovered(name)

    def problems(self) -> str:
        """What readiness reports: every task that is failing, with its last error; "" when none is."""
        return "; ".join(f"{name}: {error}" for name, error in sorted(self.failing.items()))

    async def stop_task(self, name: str) -> None:
        """Stops one task (and its restarts) for good."""
        task = self._tasks.pop(name, None)
        if task is not None:
            await cancel_until_done([task])
        self.failing.pop(name, None)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        await cancel_until_done(tasks)

