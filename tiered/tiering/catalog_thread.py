"""The catalog from the event loop: its synchronous calls run on worker threads, never on the loop itself.

One thread runs the block commits, in submission order (commits must land in block order); reads and background
scans use a small pool beside it, so a slow scan never delays a commit.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from tiered.catalog.engine import Catalog


class CatalogThread:
    def __init__(self, catalog: Catalog, read_workers: int = 2):
        self.catalog = catalog
        self._commits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="catalog-commit")
        self._reads = ThreadPoolExecutor(max_workers=read_workers, thread_name_prefix="catalog-read")

    async def commit(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Runs `fn(catalog, *args)` on the ordered commit thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._commits, functools.partial(fn, self.catalog, *args, **kwargs))

    async def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Runs `fn(catalog, *args)` on the read pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reads, functools.partial(fn, self.catalog, *args, **kwargs))

    def close(self) -> None:
        self._commits.shutdown(wait=True)
        self._reads.shutdown(wait=True)
        self.catalog.close()
