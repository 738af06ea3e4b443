"""The catalog's deadlines from the event loop: a thread's call cannot be stopped, so at the deadline (or when its
caller is cancelled) a call still queued is dropped and never runs, and a running one runs on, its outcome dropped."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tiered.catalog import Catalog
from tiered.catalog.errors import CatalogUnavailable
from tiered.tiering.catalog_access import AsyncCatalog
from tests.support.postgres import fresh_catalog_url


async def test_a_deadline_drops_a_queued_call_and_a_cancel_leaves_a_running_one_to_finish(request, tmp_path):
    access = AsyncCatalog(Catalog.open(fresh_catalog_url(request, "sqlite", tmp_path)))
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def running(_catalog: Catalog) -> str:
        started.set()
        assert release.wait(30)
        ran.append("running")
        return "running"

    def queued(_catalog: Catalog) -> None:
        ran.append("queued")

    try:
        first = asyncio.ensure_future(access.write(running))
        assert await asyncio.to_thread(started.wait, 30)  # the write thread is in it
        with pytest.raises(CatalogUnavailable, match="queued did not answer within 0 s"):
            await access.write(queued, deadline_s=0)  # behind it on the one write thread
        first.cancel()
        await asyncio.wait([first])
        assert first.cancelled()
    finally:
        release.set()
        access.close()  # waits for the threads
    assert ran == ["running"]
