"""Crash recovery with a real broker process: kill -9 mid-write, a torn tail, a lost index."""

from __future__ import annotations

import asyncio
import random
import threading

from tiered.client import Client
from tiered.protocol.bundle import Message


def payload(i: int) -> bytes:
    """Incompressible and reproducible, so that snappy does not shrink the segments below their roll size."""
    return b"msg-%06d" % i + random.Random(i).randbytes(200)


async def _produce_until_killed(port: int, acked: list[int], stop: threading.Event) -> None:
    try:
        async with await Client.connect("127.0.0.1", port) as c:
            i = 0
            while not stop.is_set() and i < 50_000:
                batch = [Message(payload(i + k), None, 1) for k in range(50)]
                await c.produce("crash", 0, batch)
                acked.extend(range(i, i + 50))
                i += 50
    except (ConnectionError, OSError, asyncio.TimeoutError):
        pass  # the broker was killed under us


async def _drain(port: int) -> list[bytes]:
    async with await Client.connect("127.0.0.1", port) as c:
        return [m.value async for m in c.drain("crash", 0, 0, fetch_bytes=4 << 20)]


async def test_kill_9_mid_write_loses_nothing_acknowledged(broker_process, tmp_path):
    bp = broker_process()
    async with await Client.connect("127.0.0.1", bp.port) as c:
        await c.create_topic("crash", 1, {"log.segment.bytes": "256k"})
    acked: list[int] = []
    stop = threading.Event()
    producer = asyncio.ensure_future(_produce_until_killed(bp.port, acked, stop))
    while len(acked) < 3000:
        await asyncio.sleep(0.02)
    bp.kill()  # SIGKILL while the producer is still sending
    stop.set()
    await asyncio.wait_for(producer, 10)
    restarted = broker_process(data_dir=bp.data_dir)
    # The restarted broker keeps assigning seqs after the last record it recovered; once "after" is acknowledged,
    # every record recovered before it is committed too (commits stay in order).
    async with await Client.connect("127.0.0.1", restarted.port) as c:
        await c.produce("crash", 0, [b"after"])
    values = await _drain(restarted.port)
    assert len(values) > len(acked)
    assert values[: len(acked)] == [payload(i) for i in acked]
    assert values[-1] == b"after"
    # Several segments were rolled on the way.
    assert len(list((bp.data_dir / "crash" / "0").glob("*.ilog"))) >= 2


async def test_torn_tail_is_cut_back_to_the_last_whole_bundle_and_reported(broker_process):
    bp = broker_process()
    async with await Client.connect("127.0.0.1", bp.port) as c:
        await c.create_topic("crash", 1)
        for i in range(10):
            await c.produce("crash", 0, [Message(b"m%d" % i + b"!" * 50, None, 7)])
    bp.kill()
    log_file = next((bp.data_dir / "crash" / "0").glob("*.log"))
    data = log_file.read_bytes()
    log_file.write_bytes(data[:-20])  # power loss: the last bundle only partly reached the disk
    (bp.data_dir / "crash" / "0" / log_file.name.split("_")[0]).with_suffix(".index").unlink()
    restarted = broker_process(data_dir=bp.data_dir)
    assert "cut" in restarted.output() and "bytes" in restarted.output()
    # The cut bundle was acknowledged durably: the broker serves it from its block in the bucket, and new
    # produces continue after the catalog's high-water mark.
    values = await _drain(restarted.port)
    assert values == [b"m%d" % i + b"!" * 50 for i in range(10)]
    async with await Client.connect("127.0.0.1", restarted.port) as c:
        await c.produce("crash", 0, [b"again"])
        assert [(m.seq, m.value) for m in (await c.consume("crash", 0, 11)).messages] == [(11, b"again")]
