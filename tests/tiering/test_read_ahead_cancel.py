"""A fetch that takes a read-ahead and is cancelled as the read-ahead ends cancelled stays cancelled; a read-ahead that
ends cancelled on its own leaves the fetch to read for itself. The two ends are arranged in one step of the loop."""

from __future__ import annotations

import asyncio

from tiered.clock import SYSTEM_CLOCK
from tiered.metrics import Metrics
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.tiering.reads.range_reads import RangeRead
from tiered.tiering.reads.remote_fetch import RemoteReader, _Ahead
from tiered.topic_partition import TopicPartition

TP = TopicPartition("hist", 0)


async def taken_read_ahead(reader: RemoteReader) -> tuple[_Ahead, asyncio.Task[RangeRead | None]]:
    """A read-ahead for seq 5 that never finishes, and a fetch of seq 5 waiting for it."""
    loop = asyncio.get_running_loop()
    never: asyncio.Future[RangeRead | None] = loop.create_future()

    async def reading_ahead() -> RangeRead | None:
        return await never

    entry = _Ahead(5, 0)
    entry.task = loop.create_task(reading_ahead())
    reader._ahead[TP] = [entry]
    fetch = loop.create_task(reader._ahead_for(TP, 5))
    await asyncio.sleep(0)  # both run (scheduled first): the read-ahead waits, the fetch takes it and waits on it
    assert reader._ahead[TP] == [] and not fetch.done()
    return entry, fetch


async def test_a_fetch_cancelled_as_its_read_ahead_ends_cancelled_stays_cancelled(tmp_path, acat):
    reader = RemoteReader(LocalObjectStore(tmp_path / "bucket"), acat, Metrics(), clock=SYSTEM_CLOCK)
    entry, fetch = await taken_read_ahead(reader)
    entry.task.cancel()  # it ends first (its step was scheduled first) ...
    fetch.cancel()  # ... and the fetch's cancel arrives in the same step
    await asyncio.wait([fetch])
    assert entry.task.cancelled() and fetch.cancelled()


async def test_a_read_ahead_that_ends_cancelled_alone_leaves_the_fetch_to_read_for_itself(tmp_path, acat):
    reader = RemoteReader(LocalObjectStore(tmp_path / "bucket"), acat, Metrics(), clock=SYSTEM_CLOCK)
    entry, fetch = await taken_read_ahead(reader)
    entry.task.cancel()
    assert await fetch is None
