"""The catalog from the event loop: every synchronous query function runs on a worker thread, with a deadline.

One thread runs the writes, in submission order (block commits must land in block order, and one writer never
waits behind another's lock); reads and background scans use a small pool beside it, so a slow scan never delays a
commit. A call that does not answer within its deadline raises CatalogUnavailable, which callers treat as any
other transient catalog failure (retried, reported by readiness). A thread's work cannot be cancelled: at the
deadline (or when the caller is cancelled) a call still queued behind others is dropped and never runs, while one
already running goes on, bounded on the server by the engine's lock and statement timeouts, so its worker thread
comes back; its outcome is dropped (a write may have committed: the caller learns it as it learns any unknown one).
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from tiered.cancellation import within
from tiered.catalog.engine import Catalog
from tiered.catalog.errors import CatalogUnavailable

T = TypeVar("T")

DEFAULT_DEADLINE_S = 15.0


class AsyncCatalog:
    def __init__(self, catalog: Catalog, *, read_workers: int = 2, deadline_s: float = DEFAULT_DEADLINE_S):
        self.catalog = catalog
        self.deadline_s = deadline_s
        self._writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="catalog-write")
        self._reads = ThreadPoolExecutor(max_workers=read_workers, thread_name_prefix="catalog-read")

    async def write(self, fn: Callable[..., T], *args: Any, deadline_s: float | None = None, **kwargs: Any) -> T:
        """Runs `fn(catalog, *args, **kwargs)` on the ordered write thread."""
        return await self._run(self._writes, fn, args, kwargs, deadline_s)

    async def read(self, fn: Callable[..., T], *args: Any, deadline_s: float | None = None, **kwargs: Any) -> T:
        """Runs `fn(catalog, *args, **kwargs)` on the read pool."""
        return await self._run(self._reads, fn, args, kwargs, deadline_s)

    async def _run(self, pool: ThreadPoolExecutor, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any],
                   deadline_s: float | None) -> T:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(pool, functools.partial(fn, self.catalog, *args, **kwargs))
        deadline = self.deadline_s if deadline_s is None else deadline_s
        try:
            return await within(future, deadline)
        except TimeoutError:
            raise CatalogUnavailable(f"{getattr(fn, '__name__', fn)} did not answer within {deadline:.0f} s") from None

    def shutdown(self) -> None:
        """Stops the worker threads, leaving the catalog open (its owner closes it)."""
        self._writes.shutdown(wait=True)
        self._reads.shutdown(wait=True)

    def close(self) -> None:
        self.shutdown()
        self.catalog.close()
