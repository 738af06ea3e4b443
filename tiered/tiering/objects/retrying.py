"""Retrying a call until it succeeds: for the durable path, whose records already sit in the local log and must
reach the bucket and the catalog however long an outage lasts.

Transient failures (a store or catalog error, a deadline passed, a lost connection) are retried with exponential
backoff on the given clock; each failed attempt is counted, and logged at the 1st, 10th and every 100th attempt.
Anything else (StaleEpoch, a refused transition) is the caller's to handle and passes through.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, TypeVar

from tiered.catalog.errors import CatalogUnavailable
from tiered.clock import Clock
from tiered.metrics import Counter, Metrics
from tiered.tiering.objects.store import StoreError

log = logging.getLogger("tiered.tiering")

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0
TRANSIENT = (StoreError, CatalogUnavailable, OSError, asyncio.TimeoutError)

T = TypeVar("T")


class Retrying:
    def __init__(self, metrics: Metrics, *, clock: Clock, first_s: float = RETRY_FIRST_S,
                 max_s: float = RETRY_MAX_S):
        self.metrics = metrics
        self.clock = clock
        self.first_s = first_s
        self.max_s = max_s
        # The latest failure while a call is being retried ("PUT key: error"); None once a call succeeds.
        self.last_failure: str | None = None

    async def __call__(self, what: str, make_call: Callable[[], Awaitable[T]], errors: Counter) -> T:
        delay = self.first_s
        attempt = 0
        while True:
            attempt += 1
            try:
                result = await make_call()
            except TRANSIENT as exc:
                self.last_failure = f"{what}: {exc or type(exc).__name__}"
                self.metrics.inc(errors)
                level = logging.WARNING if attempt in (1, 10) or attempt % 100 == 0 else logging.DEBUG
                log.log(level, "%s failed (attempt %d, retrying in %.2f s): %s", what, attempt, delay,
                        exc or type(exc).__name__)
                await self.clock.sleep(delay)
                delay = min(delay * 2, self.max_s)
                continue
            self.last_failure = None
            return result
