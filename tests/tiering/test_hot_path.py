"""Remote reads give way to the hot path (issue 14, isolation): the gate alone, then a broker whose block PUT is
held while a remote read is asked for, over real sockets with moto behind the fault proxy."""

from __future__ import annotations

import asyncio

import pytest

from tiered.client import Client
from tiered.clock import SYSTEM_CLOCK
from tiered.protocol.bundle import Message
from tiered.tiering.blocks.hot_path import LEAD_S, HotPathGate
from tiered.tiering.objects.local_store import LocalObjectStore

from tests.support.polling import eventually
from tests.tiering.test_remote_reads import tiered_broker  # noqa: F401 (the fixture)
from tests.tiering.test_remote_streams import Raw, _fill, _from_the_bucket_only


class FakeClock:
    """A monotonic clock moved by hand, and by each look at it during a pause (so pauses end without real time); its
    sleep only lets the other tasks run."""

    def __init__(self, step: float = 0.0):
        self.now = 100.0
        self.step = step

    def now_ms(self) -> float:
        return self.now * 1000.0

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


async def test_a_quiet_hot_path_never_holds_a_read():
    gate = HotPathGate(0.2, clock=FakeClock())
    await asyncio.wait_for(gate.turn(), 5)
    gate = HotPathGate(0.2, due_in_s=lambda: LEAD_S * 4, clock=FakeClock())  # a block is open but not due soon
    await asyncio.wait_for(gate.turn(), 5)
    assert gate.paused_s == 0


async def test_a_read_waits_while_a_block_is_in_flight_and_goes_on_once_it_left():
    gate = HotPathGate(60.0, clock=SYSTEM_CLOCK)
    gate.enter()
    waiting = asyncio.ensure_future(gate.turn())
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not waiting.done()
    gate.leave()
    await asyncio.wait_for(waiting, 5)
    assert gate.paused_s > 0


async def test_a_read_waits_while_a_block_is_about_to_close():
    due = [LEAD_S / 2]
    gate = HotPathGate(60.0, due_in_s=lambda: due[0], clock=SYSTEM_CLOCK)
    waiting = asyncio.ensure_future(gate.turn())
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not waiting.done()
    due[0] = None  # the block closed and left the pipeline: nothing is open
    await asyncio.wait_for(waiting, 5)


async def test_a_pause_is_bounded_and_then_reads_get_as_long_again():
    clock = FakeClock(step=0.01)
    gate = HotPathGate(0.2, clock=clock)
    gate.enter()  # and never leaves: a produce load that keeps blocks in flight
    await asyncio.wait_for(gate.turn(), 5)
    paused = gate.paused_s
    assert 0.2 <= paused < 0.3
    clock.step = 0.0
    await asyncio.wait_for(gate.turn(), 5)  # within its turn: no pause
    assert gate.paused_s == paused
    clock.now += paused + 0.01  # its turn is over
    clock.step = 0.01
    await asyncio.wait_for(gate.turn(), 5)
    assert gate.paused_s > paused


async def test_yielding_off_never_pauses():
    gate = HotPathGate(0.0, clock=SYSTEM_CLOCK)
    gate.enter()
    await asyncio.wait_for(gate.turn(), 5)
    assert gate.paused_s == 0
    gate.leave()
    gate.leave()  # more leaves than enters stay at zero
    assert gate.busy == 0 and not gate.hot()
    with pytest.raises(ValueError):
        HotPathGate(-1, clock=SYSTEM_CLOCK)


async def test_a_store_without_streaming_paces_once(tmp_path):
    store = LocalObjectStore(tmp_path)
    await store.put("a/b", b"0123456789")
    paced, got = [], []

    async def pace() -> None:
        paced.append(len(got))

    assert await store.read_range_into("a/b", 2, 6, got.append, pace) == 4
    assert got == [b"2345"] and paced == [0]


async def test_a_remote_read_waits_for_the_block_in_flight(tiered_broker, s3_faults):
    """With a block's PUT held by the store, a remote read asked for meanwhile is answered only after the block was
    committed (its produce acked), and byte for byte as before."""
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await _fill(app, c, 1, 400)
    app, _ = await _from_the_bucket_only(app, tiered_broker)
    app.tier.hot_path.max_pause_s = 60.0  # longer than the held PUT
    app.tier.remote.reader.read_ahead = False
    raw = await Raw().open(app.broker.port)
    before = await raw.consume(1, [(0, 5, 3000)])  # warms the caches; the answer to compare with
    s3_faults.stall_next(1, seconds=1.5, match=lambda method, path: method == "PUT" and ".blk" in path)
    order: list[str] = []
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        async def produce() -> None:
            await c.produce("hist", 0, [Message(b"during", None, 1_700_000_001_000)])
            order.append("acked")

        producing = asyncio.ensure_future(produce())
        await eventually(lambda: app.tier.durable.pipeline.in_flight, what="a block in flight")
        answer = await raw.consume(1, [(0, 5, 3000)])
        order.append("answered")
        await asyncio.wait_for(producing, 30)
    raw.close()
    assert order == ["acked", "answered"]
    assert answer == before
    assert app.tier.hot_path.paused_s > 0
