"""Consume, DiscoverPartitions and the administration requests through several brokers (fake brokers answering real
frames, tests/support/fake_cluster.py): history from any broker, the tail from the leader, which long-polls."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tiered.client import Client, TankError
from tiered.protocol.bundle import Message
from tiered.protocol.codes import UINT64_MAX, ConsumeStatus, DiscoverReason
from tiered.protocol.errors import ProtocolError
from tiered.protocol.requests import ConsumePartition, ConsumeTopic
from tiered.protocol.frame import MsgType

from tests.client.test_produce_routing import T0, T1, free_port

C, D = MsgType.CONSUME, MsgType.DISCOVER_PARTITIONS


async def seeded(cluster, *names: str, messages: int = 3):
    """Brokers of a topic t with 2 partitions, `messages` of them in t/0 and t/1 each, both led by the first."""
    cluster.create("t", 2)
    brokers = [await cluster.start(n) for n in names]
    async with await Client.connect_any([str(brokers[0])]) as c:
        for i in range(messages):
            await c.produce_many({T0: [Message(b"0-%d" % i)], T1: [Message(b"1-%d" % i)]})
    for b in brokers:
        b.requests.clear()
        b.arrivals.clear()
    return brokers


def consumed(broker) -> list[tuple[str, int, int]]:
    return [(t.name, p.partition, p.seq) for req in broker.received(C) for t in req.topics for p in t.partitions]


async def test_history_is_read_from_any_broker_and_the_tail_from_the_leader(fake_cluster):
    a, b = await seeded(fake_cluster, "a", "b")
    fake_cluster.lead(T0, b)
    async with await Client.connect_any([str(a)]) as c:
        got = [(m.seq, m.value) async for m in c.drain("t", 0, 0)]
    assert got == [(1, b"0-0"), (2, b"0-1"), (3, b"0-2")]
    assert consumed(a) == [("t", 0, 0), ("t", 0, 4)]  # history from a; at the tail a redirects ...
    assert consumed(b) == [("t", 0, 4)]  # ... to the leader, which answers that nothing more is there


async def test_a_redirected_long_poll_waits_at_the_leader(fake_cluster):
    a, b = await seeded(fake_cluster, "a", "b")
    fake_cluster.lead(T0, b)
    async with await Client.connect_any([str(a)]) as c:
        tail = c.tail_batches("t", 0, 4, max_wait_ms=8000)
        waiting = asyncio.ensure_future(tail.__anext__())
        for _ in range(200):  # until the long-poll is at the leader
            if b.count(C):
                break
            await asyncio.sleep(0.01)
        assert b.received(C)[0].max_wait_ms == 8000 and not waiting.done()
        async with await Client.connect_any([str(b)]) as producer:
            await producer.produce("t", 0, [b"new"])
        batch = await asyncio.wait_for(waiting, 5)
        await tail.aclose()
    assert [(m.seq, m.value) for m in batch] == [(4, b"new")]
    assert consumed(a) == [("t", 0, 4)] and consumed(b) == [("t", 0, 4)]


async def test_a_consume_of_several_partitions_is_split_and_merged(fake_cluster):
    a, b = await seeded(fake_cluster, "a", "b")
    fake_cluster.lead(T1, b)
    async with await Client.connect_any([str(a)]) as c:
        got = await asyncio.wait_for(c.consume_many([("t", 1, 4, 1 << 16), ("t", 0, 2, 1 << 16)]), 10)
    assert list(got) == [T1, T0]
    assert got[T1].messages == [] and got[T1].drained and got[T1].hwmark == 3
    assert [(m.seq, m.value) for m in got[T0].messages] == [(2, b"0-1"), (3, b"0-2")]
    assert consumed(a) == [("t", 1, 4), ("t", 0, 2)]
    assert consumed(b) == [("t", 1, 4)]  # only the redirected partition


async def test_a_consume_without_a_leader_is_asked_again_then_raised_after_the_wait(fake_cluster):
    a, b = await seeded(fake_cluster, "a", "b")
    fake_cluster.lead(T0, None)
    fake_cluster.lead_later(T0, b, when=a, msg_id=C, count=2)
    async with await Client.connect_any([str(a)], leader_wait_s=10) as c:
        got = await asyncio.wait_for(c.consume("t", 0, 4), 10)
        assert got.drained and consumed(b) == [("t", 0, 4)]
    fake_cluster.lead(T0, None)
    a.before_answer = None
    async with await Client.connect_any([str(a)], leader_wait_s=0.2) as c:
        with pytest.raises(TankError) as caught:
            await asyncio.wait_for(c.consume("t", 0, 4), 10)
    assert caught.value.code == ConsumeStatus.NO_LEADER


async def test_a_consume_whose_connection_is_lost_is_asked_again(fake_cluster):
    a, b = await seeded(fake_cluster, "a", "b")
    fake_cluster.lead(T0, b)
    async with await Client.connect_any([str(a)], leader_wait_s=10) as c:
        assert (await asyncio.wait_for(c.consume("t", 0, 4), 10)).drained  # b is the known leader now
        b.hold(C)  # b reads the next consume and drops the connection
        got = await asyncio.wait_for(c.consume("t", 0, 4), 10)
    assert got.drained and got.hwmark == 3
    assert consumed(b) == [("t", 0, 4)] * 3  # the lost one, then b again through a's redirect
    assert consumed(a) == [("t", 0, 4)] * 3  # the first redirect, then twice after the loss (b had just failed)


async def test_discover_asks_each_partition_of_its_leader_and_learns_them(fake_cluster):
    fake_cluster.create("d", 3)
    a, b, c = [await fake_cluster.start(n) for n in "abc"]
    fake_cluster.lead(("d", 1), b)
    fake_cluster.lead(("d", 2), c)
    async with await Client.connect_any([str(a)]) as client:
        await client.produce("d", 2, [b"x", b"y"])  # to c, through a's redirect
        a.requests.clear()
        ranges = await asyncio.wait_for(client.discover_partitions("d"), 10)
        assert [(r.first_available, r.hwmark, r.reason) for r in ranges] == [(0, 0, None), (0, 0, None), (1, 2, None)]
        assert [r.partitions for r in a.received(D)] == [None]
        assert [r.partitions for r in b.received(D)] == [(1,)]
        assert [r.partitions for r in c.received(D)] == [(2,)]
        listed = await asyncio.wait_for(client.discover_partitions("d", [2, 1, 2]), 10)
        assert [r.hwmark for r in listed] == [2, 0, 2]
        assert [r.partitions for r in c.received(D)] == [(2,), (2,)]  # straight to the leaders now
        await client.produce("d", 1, [b"z"])
    assert a.count(MsgType.PRODUCE) == 0 and b.count(MsgType.PRODUCE) == 1


async def test_discover_waits_out_no_leader_and_then_returns_it(fake_cluster):
    a, b = await seeded(fake_cluster, "a", "b")
    fake_cluster.lead(T1, None)
    fake_cluster.lead_later(T1, b, when=a, msg_id=D, count=3)
    async with await Client.connect_any([str(a)], leader_wait_s=10) as c:
        ranges = await asyncio.wait_for(c.discover_partitions("t"), 10)
        assert [(r.first_available, r.hwmark) for r in ranges] == [(1, 3), (1, 3)]
        assert [r.partitions for r in a.received(D)] == [None, (1,), (1,)]
    fake_cluster.lead(T1, None)
    a.before_answer = None
    async with await Client.connect_any([str(a)], leader_wait_s=0.2) as c:
        ranges = await asyncio.wait_for(c.discover_partitions("t"), 10)
    assert (ranges[1].first_available, ranges[1].hwmark, ranges[1].reason) == (
        UINT64_MAX, UINT64_MAX, DiscoverReason.NO_LEADER)


async def test_administration_goes_to_another_known_broker_when_one_is_gone(fake_cluster):
    a, b = await seeded(fake_cluster, "a", "b")
    dead = f"127.0.0.1:{free_port()}"
    async with await Client.connect_any([dead, str(a), str(b)]) as c:
        assert (await c.status()).topics == 1
        assert a.count(MsgType.STATUS) == 1
        await a.stop()
        assert [t.name for t in await asyncio.wait_for(c.discover_topics(), 10)] == ["t"]
        assert (await asyncio.wait_for(c.status(), 10)).partitions == 2
    assert b.count(MsgType.DISCOVER_TOPICS) == 1 and b.count(MsgType.STATUS) == 1


async def test_answers_for_other_partitions_than_asked_are_refused(fake_cluster):
    a, = await seeded(fake_cluster, "a")
    answer_consume, answer_discover = a._consume, a._discover

    async def other_partition(req):  # answers t/1 when t/0 was asked
        return await answer_consume(replace(req, topics=(ConsumeTopic("t", (ConsumePartition(1, 1, 1 << 16),)),)))

    a._consume = other_partition
    a._discover = lambda req: answer_discover(replace(req, partitions=None))  # every partition, whatever was asked
    async with await Client.connect_any([str(a)]) as c:
        with pytest.raises(ProtocolError, match="the consume response answers nothing for t/0"):
            await asyncio.wait_for(c.consume("t", 0, 1), 10)
        with pytest.raises(ProtocolError, match="answers 2 partitions of 't' for the 1 asked"):
            await asyncio.wait_for(c.discover_partitions("t", [1]), 10)
        assert (await c.status()).topics == 1  # the connection still serves
