"""The periodic local retention pass visits only the partitions whose logs hold sealed segments
(`Registry.with_sealed`), and still deletes every segment it expires: those rolled while serving (a roll makes its
partition a candidate) and those recovered from the disk at start. On a manual clock: the pass runs when the
clock passes its interval, never on real time."""

from __future__ import annotations

import time

from tiered.client import Client
from tiered.server.app import App

from tests.support.broker import local_settings
from tests.support.clock import ManualClock

INTERVAL_S = 30.0
RETAINED = {"log.segment.bytes": "4k", "log.index.interval.bytes": "256", "log.retention.secs": "3600"}


def wall_clock() -> ManualClock:
    """A manual clock starting at the wall time: a segment's freeze time is its file's mtime."""
    return ManualClock(start_ms=time.time() * 1000)


def local_app(data_dir, clock: ManualClock) -> App:
    return App(local_settings(data_dir, local_retention_interval_ms=int(INTERVAL_S * 1000)), local_only=True,
               clock=clock, now_s=lambda: clock.now_ms() / 1000)


async def produce(app: App, topic: str, partition: int, count: int) -> None:
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        for i in range(count):
            await c.produce(topic, partition, [b"v%05d-" % i + bytes(200)])


async def pass_runs(clock: ManualClock) -> None:
    clock.advance(INTERVAL_S)
    await clock.settle()


def sealed(app: App, topic: str, partition: int) -> list[int]:
    return [s.base for s in app.registry.get(topic, partition).log.segments]


def candidates(app: App) -> set[tuple[str, int]]:
    return {(p.topic, p.partition) for p in app.registry.with_sealed()}


async def test_the_pass_deletes_expired_segments_of_the_partitions_holding_sealed_ones_only(tmp_path):
    clock = wall_clock()
    app = local_app(tmp_path / "data", clock)
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("t", 4, RETAINED)
        await produce(app, "t", 1, 60)  # rolls several 4 KiB segments
        await produce(app, "t", 2, 1)  # its active segment only
        assert len(sealed(app, "t", 1)) >= 2
        assert sealed(app, "t", 2) == []
        assert candidates(app) == {("t", 1)}  # the partitions without sealed segments are not visited
        await pass_runs(clock)
        assert len(sealed(app, "t", 1)) >= 2  # nothing expired yet
        assert candidates(app) == {("t", 1)}
        await produce(app, "t", 2, 60)  # a roll makes its partition a candidate
        assert len(sealed(app, "t", 2)) >= 2
        assert candidates(app) == {("t", 1), ("t", 2)}
        clock.advance(3600)  # every sealed segment is past log.retention.secs
        await pass_runs(clock)
        assert sealed(app, "t", 1) == [] and sealed(app, "t", 2) == []
        assert candidates(app) == set()  # forgotten once they hold none (until their next roll)
        assert app.registry.get("t", 1).log.last_held == 60  # the active segments stay
    finally:
        await app.stop()


async def test_segments_recovered_at_start_are_expired_by_the_pass(tmp_path):
    clock = wall_clock()
    app = local_app(tmp_path / "data", clock)
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("t", 2, RETAINED)
        await produce(app, "t", 0, 60)
    finally:
        await app.stop()
    app = local_app(tmp_path / "data", clock)
    await app.start()
    await clock.settle()  # its periodic pass is waiting on the clock
    try:
        recovered = sealed(app, "t", 0)
        assert len(recovered) >= 2
        assert candidates(app) == {("t", 0)}
        clock.advance(3600)
        await pass_runs(clock)
        assert sealed(app, "t", 0) == []
    finally:
        await app.stop()
