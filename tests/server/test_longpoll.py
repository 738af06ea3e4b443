"""Long-poll consumes: TANK's max_wait normalisation, min_bytes across partitions, and the three EOF base values."""

from __future__ import annotations

import asyncio
import time

import pytest

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol import responses as rs
from tiered.protocol.bundle import Message
from tiered.protocol.codes import UINT64_MAX
from tiered.protocol.frame import MsgType
from tiered.server.waiters import normalized_max_wait_ms, wakeup_deadline_ms

from tests.server.rawwire import RawConnection


@pytest.mark.parametrize("given, expected", [(0, 0), (1, 320), (320, 320), (321, 384), (1000, 1024),
                                             (5_000_000, 3_600_000), (0xFFFF_FFFF, 3_600_000)])
def test_max_wait_normalisation_matches_tank(given, expected):
    assert normalized_max_wait_ms(given) == expected


def test_wakeup_is_aligned_to_128_ms():
    assert wakeup_deadline_ms(1000, 1) == 1408  # 1000 + 320 = 1320, aligned up to 1408
    assert wakeup_deadline_ms(1088, 1000) % 128 == 0


async def _consume_raw(raw, request_id, parts, max_wait_ms, min_bytes, topic="pyt"):
    req = rq.ConsumeRequest(request_id, max_wait_ms, min_bytes,
                            (rq.ConsumeTopic(topic, tuple(rq.ConsumePartition(p, s, 4096) for p, s in parts)),))
    await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))


async def test_timed_out_long_poll_answers_base_zero(broker, client):
    await client.create_topic("pyt", 1)
    await client.produce("pyt", 0, [b"a"])
    raw = await RawConnection.open(broker.broker.port)
    started = time.monotonic()
    await _consume_raw(raw, 1, [(0, 2)], max_wait_ms=1, min_bytes=0)
    _, payload = await raw.recv(timeout_s=3)
    waited = time.monotonic() - started
    (p,) = rs.read_consume_response(payload).topics[0].partitions
    assert (p.status, p.base_seq, p.hwmark, p.chunk_len) == (0, 0, 1, 0)
    assert 0.3 <= waited < 1.5  # TANK: max_wait=1 answered after ~0.38 s
    await raw.close()


async def test_long_poll_is_woken_by_produce_with_the_first_new_seq_as_base(broker, client):
    await client.create_topic("pyt", 1)
    await client.produce("pyt", 0, [b"a"])
    raw = await RawConnection.open(broker.broker.port)
    await _consume_raw(raw, 2, [(0, UINT64_MAX)], max_wait_ms=10_000, min_bytes=0)
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await client.produce("pyt", 0, [b"b", b"c"])
    _, payload = await raw.recv(timeout_s=5)
    assert time.monotonic() - started < 2
    resp = rs.read_consume_response(payload)
    (p,) = resp.topics[0].partitions
    assert (p.status, p.base_seq, p.hwmark) == (0, 2, 3) and p.chunk_len == len(resp.chunks[0]) > 0
    await raw.close()


async def test_min_bytes_sums_across_partitions_before_waking(broker, client):
    await client.create_topic("pyt", 2)
    raw = await RawConnection.open(broker.broker.port)
    await _consume_raw(raw, 3, [(0, UINT64_MAX), (1, UINT64_MAX)], max_wait_ms=10_000, min_bytes=60)
    await asyncio.sleep(0.1)
    await client.produce("pyt", 0, [Message(b"x" * 10, None, 1)])  # about 24 bytes on disk: not enough yet
    with pytest.raises(asyncio.TimeoutError):
        await raw.recv(timeout_s=0.5)
    await client.produce("pyt", 1, [Message(b"y" * 10, None, 1)])
    await client.produce("pyt", 0, [Message(b"z" * 10, None, 1)])
    _, payload = await raw.recv(timeout_s=5)
    resp = rs.read_consume_response(payload)
    p0, p1 = resp.topics[0].partitions
    assert (p0.base_seq, p1.base_seq) == (1, 1)
    assert p0.chunk_len + p1.chunk_len >= 60
    await raw.close()


async def test_a_long_poll_does_not_hold_up_later_requests_on_the_connection(broker):
    async with await Client.connect("127.0.0.1", broker.broker.port) as c:
        await c.create_topic("pyt", 1)
        waiting = asyncio.ensure_future(c.consume("pyt", 0, UINT64_MAX, max_wait_ms=10_000))
        await asyncio.sleep(0.1)
        status = await asyncio.wait_for(c.status(), 2)  # answered while the consume still waits
        assert status.topics == 1
        await c.produce("pyt", 0, [b"wake"])
        got = await asyncio.wait_for(waiting, 5)
        assert [m.value for m in got.messages] == [b"wake"]


async def test_tail_follows_new_messages(broker, client):
    await client.create_topic("tailed", 1)
    seen = []

    async def follow():
        async with await Client.connect("127.0.0.1", broker.broker.port) as c:
            async for m in c.tail("tailed", 0, UINT64_MAX, max_wait_ms=2000):
                seen.append(m.value)
                if len(seen) == 5:
                    return

    task = asyncio.ensure_future(follow())
    await asyncio.sleep(0.2)
    for i in range(5):
        await client.produce("tailed", 0, [b"n%d" % i])
    await asyncio.wait_for(task, 10)
    assert seen == [b"n%d" % i for i in range(5)]
