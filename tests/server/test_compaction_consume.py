"""Consuming a compacted partition through a real broker: exactly the model's messages with their original seqs,
a removed seq answered from the next kept message, boundary and EOF answers as before, produces running alongside."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from tests.server.rawwire import RawConnection
from tests.support.compaction import Model, log_messages, rows
from tiered.client import BoundaryError
from tiered.protocol import requests as rq
from tiered.protocol import responses as rs
from tiered.protocol.bundle import CODEC_SNAPPY, Message
from tiered.protocol.codes import ConsumeStatus
from tiered.protocol.frame import MsgType
from tiered.storage.compaction import compact_partition

CONFIG = "log.cleanup.policy=cleanup\nlog.segment.bytes=2kb\nlog.index.interval.bytes=256\nproduce.ack=local\n"


async def produce_history(client, rng: random.Random) -> None:
    for i in range(120):
        messages = [Message(rng.randbytes(rng.randint(0, 30)) if rng.random() > 0.1 else b"",
                            b"key-%d" % rng.randrange(15) if rng.random() > 0.1 else None, 1000 + i)
                    for _ in range(rng.randint(1, 8))]
        await client.produce("compacted", 0, messages, codec=CODEC_SNAPPY if i % 5 == 0 else 0)
    part = [Message(b"mirrored-%d" % s, b"key-1", 5000, s) for s in (2000, 2001, 2005)]
    await client.produce_with_seqnum("compacted", 0, part)  # a sparse bundle, and a jump in seqs
    await client.produce("compacted", 0, [Message(b"tail", b"key-2", 6000)] * 3)


async def consume_all(client, seq: int = 0) -> list[Message]:
    return [m async for m in client.drain("compacted", 0, seq)]


async def test_consumers_read_exactly_the_model_after_compaction(broker, client):
    await client.create_topic("compacted", 1, CONFIG)
    await produce_history(client, random.Random(7))
    log = broker.broker.registry.get("compacted", 0).log
    assert len(log.segments) > 3 and log.active is not None
    sealed_last = log.segments[-1].last
    now = time.time()
    before = await consume_all(client)
    expected = Model(86_400_000).compact([m for m in before if m.seq <= sealed_last], int(now * 1000))
    expected += [m for m in before if m.seq > sealed_last]
    first_available, hwmark = log.first_available, log.last_assigned

    # Produces keep going while the pass runs in a worker thread, as the server will run it.
    async def keep_producing() -> list[Message]:
        produced = []
        for i in range(20):
            await client.produce("compacted", 0, [Message(b"during-%d" % i, b"key-3", 7000)])
            produced.append(i)
            await asyncio.sleep(0)
        return produced

    report, produced = await asyncio.gather(
        asyncio.to_thread(compact_partition, log, now, force=True), keep_producing())
    assert report.groups and report.stopped is None and len(produced) == 20
    after = await consume_all(client)
    assert rows(after[: len(expected)]) == rows(expected)
    assert [m.value for m in after[len(expected):]] == [b"during-%d" % i for i in range(20)]
    assert rows(after) == rows(log_messages(log))

    # A removed seq is answered from the next kept message; seqs before the first available and past the tail
    # get the same answers as before compaction.
    kept = [m.seq for m in after]
    removed = next(s for s in range(first_available, sealed_last) if s not in kept)
    got = await client.consume("compacted", 0, removed)
    assert got.messages[0].seq == min(s for s in kept if s > removed)
    with pytest.raises(BoundaryError) as caught:
        await client.consume("compacted", 0, log.last_assigned + 2)
    assert caught.value.first_available == first_available
    tail = await client.consume("compacted", 0, log.last_assigned + 1)
    assert tail.messages == [] and tail.hwmark == log.last_assigned > hwmark

    # On the wire: a consume from the first available seq starts with a sparse bundle when its first message went.
    raw = await RawConnection.open(broker.broker.port)
    req = rq.ConsumeRequest(5, 0, 0, (rq.ConsumeTopic("compacted", (rq.ConsumePartition(0, first_available, 4096),)),))
    await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))
    _, payload = await raw.recv()
    (p,) = rs.read_consume_response(payload).topics[0].partitions
    first_kept_is_first = kept[0] == first_available
    assert p.status == (ConsumeStatus.OK if first_kept_is_first else ConsumeStatus.SPARSE)
    await raw.close()


async def test_a_tail_compacted_away_waits_for_the_next_message(broker, client):
    await client.create_topic("compacted", 1, CONFIG.replace("log.segment.bytes=2kb", "log.segment.bytes=64"))
    for value in (b"a", b"b", b"c"):
        await client.produce("compacted", 0, [Message(value, b"k", 1)])
    log = broker.broker.registry.get("compacted", 0).log
    log.seal_active()
    await asyncio.to_thread(compact_partition, log, time.time(), force=True)
    assert [m.seq for m in await consume_all(client)] == [3]
    # Seq 4 would be next; seqs 1 and 2 were removed: a consume for 2 is answered from 3.
    assert [m.seq for m in (await client.consume("compacted", 0, 2)).messages] == [3]
    waiting = asyncio.ensure_future(client.consume("compacted", 0, 4, max_wait_ms=5000))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await client.produce("compacted", 0, [Message(b"d", b"j", 1)])
    got = await asyncio.wait_for(waiting, 10)
    assert [(m.seq, m.value) for m in got.messages] == [(4, b"d")]
