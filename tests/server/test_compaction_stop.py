"""A compaction pass runs in a worker thread, which a cancel cannot stop: when the task awaiting it is cancelled,
the pass still counts as running, and `stop` waits for it before the logs close."""

from __future__ import annotations

import asyncio
import threading

from tiered.metrics import Metrics
from tiered.server import compaction
from tiered.server.compaction import Compactor
from tiered.server.registry import Registry, Role
from tiered.storage.compaction import CompactionReport
from tiered.tier_interface import LocalOnly

CLEANUP = "log.cleanup.policy=cleanup\n"


async def test_stop_waits_for_a_pass_whose_caller_was_cancelled(tmp_path, monkeypatch):
    tier = LocalOnly()
    registry = Registry(tmp_path, {})
    registry.create_topic("kept", 1, CLEANUP, tier)
    part = registry.get("kept", 0)
    assert part is not None
    part.role = Role.LEADER
    compactor = Compactor(registry, Metrics(), tier)  # type: ignore[arg-type]
    started, release = threading.Event(), threading.Event()
    real_pass = compaction.compact_partition

    def held_pass(*args, **kwargs) -> CompactionReport:
        started.set()
        assert release.wait(30)
        return real_pass(*args, **kwargs)

    monkeypatch.setattr(compaction, "compact_partition", held_pass)
    try:
        passing = asyncio.ensure_future(compactor.compact(part, force=True))
        assert await asyncio.to_thread(started.wait, 30)
        passing.cancel()
        await asyncio.wait([passing])
        assert passing.cancelled() and compactor._running is not None  # the thread goes on
        stopping = asyncio.ensure_future(compactor.stop(compactor.clock.monotonic() + 30))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not stopping.done()  # waiting for the thread
        release.set()
        await stopping
        assert compactor._running is None
    finally:
        release.set()
        registry.close()
