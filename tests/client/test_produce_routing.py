"""Produce through several brokers (fake brokers answering real frames, tests/support/fake_cluster.py): TANK's
redirects (0xfc) followed and remembered, 0xfd waited out, unreachable brokers skipped, and never a produce sent
twice when its answer was lost."""

from __future__ import annotations

import asyncio

import pytest

from tiered.client import Client, ConnectionLost, NotConfirmed, TankError, Unreachable
from tiered.client.routing import BACKOFF_FIRST_S, HOP_LIMIT
from tiered.protocol.bundle import Message
from tiered.protocol.codes import Endpoint, ProduceStatus
from tiered.protocol.frame import MsgType

from tests.support.ports import free_port

P = MsgType.PRODUCE
T0, T1 = ("t", 0), ("t", 1)


def produced(broker) -> list[tuple[str, int]]:
    """The partitions of every produce request `broker` received, in order."""
    return [(t.name, p.partition) for req in broker.received(P) for t in req.topics for p in t.partitions]


async def brokers(cluster, *names: str):
    cluster.create("t", 2)
    return [await cluster.start(n) for n in names]


async def test_a_redirected_produce_reaches_the_leader_which_is_asked_directly_next_time(fake_cluster):
    a, b = await brokers(fake_cluster, "a", "b")
    fake_cluster.lead(T0, b)
    async with await Client.connect_any([str(a)]) as c:
        await asyncio.wait_for(c.produce("t", 0, [b"one"]), 10)
        await asyncio.wait_for(c.produce("t", 0, [b"two"]), 10)
    assert produced(a) == [T0]  # redirected once, then never asked again
    assert produced(b) == [T0, T0]
    assert fake_cluster.messages(T0) == 2


async def test_two_hops_reach_the_leader(fake_cluster):
    a, b, c = await brokers(fake_cluster, "a", "b", "c")
    a.leaders[T0] = b.endpoint  # a's view is stale: b handed t/0 over to c
    b.leaders[T0] = c.endpoint
    async with await Client.connect_any([str(a)]) as client:
        await asyncio.wait_for(client.produce("t", 0, [b"x"]), 10)
        assert client.router.leaders[T0] == c.endpoint
    assert (produced(a), produced(b), produced(c)) == ([T0], [T0], [T0])
    assert fake_cluster.messages(T0) == 1


async def test_no_leader_is_asked_again_after_a_growing_backoff_until_one_is_known(fake_cluster):
    a, b = await brokers(fake_cluster, "a", "b")
    fake_cluster.lead(T0, None)
    fake_cluster.lead_later(T0, b, when=a, msg_id=P, count=4)  # three 0xfd answers, then a knows the new leader
    async with await Client.connect_any([str(a)], leader_wait_s=10) as c:
        await asyncio.wait_for(c.produce("t", 0, [b"x"]), 10)
    assert len(produced(a)) == 4 and produced(b) == [T0]
    gaps = [later - earlier for earlier, later in zip(a.arrivals, a.arrivals[1:])]
    assert [g >= BACKOFF_FIRST_S * 2**i * 0.9 for i, g in enumerate(gaps)] == [True, True, True]


async def test_no_leader_past_leader_wait_is_raised_and_returned(fake_cluster):
    a, = await brokers(fake_cluster, "a")
    fake_cluster.lead(T0, None)
    async with await Client.connect_any([str(a)], leader_wait_s=0.3) as c:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TankError) as caught:
            await asyncio.wait_for(c.produce("t", 0, [b"x"]), 10)
        assert caught.value.code == ProduceStatus.NO_LEADER and not isinstance(caught.value, NotConfirmed)
        assert loop.time() - started >= 0.3
        asked = len(produced(a))
        assert asked >= 3  # asked again with a backoff, not once
        got = await asyncio.wait_for(c.produce_many({T0: [Message(b"y")]}), 10)
        assert got == {T0: ProduceStatus.NO_LEADER}
    assert fake_cluster.messages(T0) == 0


async def test_connect_raises_no_leader_at_once_as_a_single_broker_did(fake_cluster):
    a, = await brokers(fake_cluster, "a")
    fake_cluster.lead(T0, None)
    async with await Client.connect("127.0.0.1", a.port) as c:
        with pytest.raises(TankError) as caught:
            await asyncio.wait_for(c.produce("t", 0, [b"x"]), 10)
    assert caught.value.code == ProduceStatus.NO_LEADER
    assert produced(a) == [T0]


async def test_only_the_redirected_bundles_are_sent_again_and_the_answers_merged(fake_cluster):
    a, b = await brokers(fake_cluster, "a", "b")
    fake_cluster.lead(T1, b)
    bundles = {T0: [Message(b"zero")], T1: [Message(b"one")], ("nosuch", 3): [Message(b"lost")]}
    async with await Client.connect_any([str(a)]) as c:
        got = await asyncio.wait_for(c.produce_many(bundles), 10)
    assert got == {T0: ProduceStatus.OK, T1: ProduceStatus.OK, ("nosuch", 3): ProduceStatus.UNKNOWN_TOPIC}
    assert list(got) == list(bundles)  # in the caller's order
    assert produced(a) == [T0, T1, ("nosuch", 3)]
    assert produced(b) == [T1]
    [resent] = b.received(P)
    assert bytes(resent.topics[0].partitions[0].bundle) == bytes(a.received(P)[0].topics[0].partitions[1].bundle)
    assert (fake_cluster.messages(T0), fake_cluster.messages(T1)) == (1, 1)


async def test_a_redirect_loop_stops_at_the_hop_limit_with_a_clear_error(fake_cluster):
    a, b = await brokers(fake_cluster, "a", "b")
    a.leaders[T0] = b.endpoint
    b.leaders[T0] = a.endpoint
    async with await Client.connect_any([str(a)]) as c:
        with pytest.raises(TankError) as caught:
            await asyncio.wait_for(c.produce("t", 0, [b"x"]), 10)
    said = str(caught.value)
    assert caught.value.code == ProduceStatus.OTHER_LEADER
    assert f"t/0: still redirected after {HOP_LIMIT} hops ({a} -> {b} -> {a} -> {b}" in said
    assert "disagree on who leads it" in said
    assert len(produced(a)) + len(produced(b)) == HOP_LIMIT + 1
    assert fake_cluster.messages(T0) == 0


async def test_a_dead_leader_is_skipped_for_another_known_broker_which_redirects(fake_cluster):
    a, b, c = await brokers(fake_cluster, "a", "b", "c")
    fake_cluster.lead(T0, b)
    async with await Client.connect_any([str(a)]) as client:
        await asyncio.wait_for(client.produce("t", 0, [b"to b"]), 10)
        await b.stop()  # b dies; the service moved t/0 to c
        fake_cluster.lead(T0, c)
        await asyncio.wait_for(client.produce("t", 0, [b"to c"]), 10)
        assert client.router.leaders[T0] == c.endpoint
    assert produced(a) == [T0, T0]  # the first redirect, then the way around dead b
    assert (produced(b), produced(c)) == ([T0], [T0])
    assert fake_cluster.messages(T0) == 2


async def test_a_redirect_to_a_broker_just_found_dead_waits_for_the_service_to_notice(fake_cluster):
    a, b, c = await brokers(fake_cluster, "a", "b", "c")
    fake_cluster.lead(T0, b)
    async with await Client.connect_any([str(a)], leader_wait_s=10) as client:
        await asyncio.wait_for(client.produce("t", 0, [b"to b"]), 10)
        await b.stop()  # a still names b for a while: its lease has not expired yet
        fake_cluster.lead_later(T0, c, when=a, msg_id=P, count=3)
        await asyncio.wait_for(client.produce("t", 0, [b"to c"]), 10)
    assert produced(a) == [T0, T0, T0]
    assert produced(c) == [T0]


async def test_a_dead_bootstrap_broker_is_skipped_and_none_reachable_is_unreachable(fake_cluster):
    a, = await brokers(fake_cluster, "a")
    dead = f"127.0.0.1:{free_port()}"
    async with await Client.connect_any([dead, str(a)]) as c:
        await asyncio.wait_for(c.produce("t", 0, [b"x"]), 10)
    assert produced(a) == [T0]
    other = f"127.0.0.1:{free_port()}"
    with pytest.raises(Unreachable) as caught:
        await Client.connect_any([dead, other])
    assert set(caught.value.failures) == {dead, other}
    assert f"{dead}: connection refused" in str(caught.value)


async def test_a_produce_whose_answer_is_lost_raises_not_confirmed_and_is_not_sent_again(fake_cluster):
    a, b = await brokers(fake_cluster, "a", "b")
    fake_cluster.lead(T0, b)
    b.hold(P)  # b reads the produce and closes the connection without answering
    async with await Client.connect_any([str(a)], leader_wait_s=10) as c:
        with pytest.raises(ConnectionLost) as caught:
            await asyncio.wait_for(c.produce("t", 0, [b"x"]), 10)
        await asyncio.sleep(0.3)  # nothing is sent again in the background either
        assert isinstance(caught.value, NotConfirmed) and isinstance(caught.value, ConnectionError)
        assert f"the connection to the broker at {b} was lost after the produce was sent" in caught.value.reason
        assert (produced(a), produced(b)) == ([T0], [T0])
        await asyncio.wait_for(c.produce("t", 0, [b"y"]), 10)  # b reconnected to, for the next one
    assert produced(b) == [T0, T0]


async def test_a_lost_connection_is_opened_again_for_the_next_request(fake_cluster):
    a, = await brokers(fake_cluster, "a")
    async with await Client.connect("127.0.0.1", a.port) as c:
        await asyncio.wait_for(c.produce("t", 0, [b"x"]), 10)
        a.hold(MsgType.STATUS)
        with pytest.raises(ConnectionError):  # written, then the connection ended: raised, as a status always was
            await asyncio.wait_for(c.status(), 10)
        await asyncio.wait_for(c.produce("t", 0, [b"y"]), 10)
    assert produced(a) == [T0, T0]


async def test_produce_with_seqnum_and_raw_follow_redirects(fake_cluster):
    a, b = await brokers(fake_cluster, "a", "b")
    fake_cluster.lead(T1, b)
    async with await Client.connect_any([str(a)]) as c:
        await asyncio.wait_for(c.produce_with_seqnum("t", 1, [Message(b"s", seq=10)]), 10)
        assert b.received(MsgType.PRODUCE_WITH_SEQNUM)[0].topics[0].partitions[0].base_seq == 10
        c.router.leaders.clear()
        raw = bytes(a.received(MsgType.PRODUCE_WITH_SEQNUM)[0].topics[0].partitions[0].bundle)
        assert await asyncio.wait_for(c.produce_raw("t", 1, raw, 11), 10) == ProduceStatus.OK
    assert b.count(MsgType.PRODUCE_WITH_SEQNUM) == 2 and a.count(MsgType.PRODUCE_WITH_SEQNUM) == 2


def test_bad_endpoints_are_refused_before_connecting():
    from tiered.client.client import parse_endpoints

    assert parse_endpoints(["h:1", ("0.0.0.0", 2), Endpoint("10.0.0.1", 3), ":4"]) == [
        Endpoint("h", 1), Endpoint("127.0.0.1", 2), Endpoint("10.0.0.1", 3), Endpoint("127.0.0.1", 4)]
    for bad in (["h"], ["h:x"], ["h:0"], ["h:70000"], []):
        with pytest.raises(ValueError):
            parse_endpoints(bad)
