"""`-b host:port,host:port`: the CLI's bootstrap list, against fake brokers of one service that redirect
(tests/support/fake_cluster.py); the CLI runs as a child process, as a user runs it."""

from __future__ import annotations

import asyncio

from tests.cli.test_errors import WITHOUT_A_BROKER
from tests.client.test_produce_routing import T0, free_port
from tests.support.cli import one_line_error, tiered
from tiered.cli.common import brokers
from tiered.protocol.frame import MsgType


async def run(*argv: str, **kw):
    return await asyncio.to_thread(tiered, *argv, timeout_s=60, **kw)


async def test_commands_take_a_list_skip_a_dead_broker_and_follow_redirects(fake_cluster):
    fake_cluster.create("t", 1)
    a, b = await fake_cluster.start("a"), await fake_cluster.start("b")
    fake_cluster.lead(T0, b)
    listed = f"127.0.0.1:{free_port()},{a}"
    await run("produce", "-b", listed, "-t", "t/0", "one", "two")
    await run("produce", "-b", listed, "-t", "t/0", "-f", "-", input=b"three\n")
    # Each command's DiscoverPartitions was redirected by a, so its produces went straight to the leader.
    assert [r.partitions for r in a.received(MsgType.DISCOVER_PARTITIONS)] == [None, None]
    assert [r.partitions for r in b.received(MsgType.DISCOVER_PARTITIONS)] == [(0,), (0,)]
    assert (a.count(MsgType.PRODUCE), b.count(MsgType.PRODUCE), fake_cluster.messages(T0)) == (0, 2, 3)
    out = (await run("consume", "-b", listed, "-t", "t/0", "-d")).stdout.decode()
    assert out.splitlines() == ["1\tone", "2\ttwo", "3\tthree"]
    described = (await run("topic", "describe", "-b", listed, "t")).stdout.decode().splitlines()
    assert described[1:] == ["0\t1\t3"]  # b's range, through a's redirect
    assert [r.partitions for r in b.received(MsgType.DISCOVER_PARTITIONS)][-1] == (0,)
    assert a.count(MsgType.CONSUME) == 2 and b.count(MsgType.CONSUME) == 1  # history from a, the tail from b
    status = (await run("status", "-b", listed)).stdout.decode()
    assert status.startswith(f"broker {a}\n") and "topics 1" in status  # the one that answered, not the dead one


async def test_no_broker_of_the_list_reachable_is_one_line_naming_each():
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    proc = await run("status", "-b", ",".join(dead), check=False)
    said = one_line_error(proc, "status")
    assert f"cannot reach any broker of {dead[0]},{dead[1]} (from -b/--broker): {dead[0]}: connection refused; " \
           f"{dead[1]}: connection refused; is `tiered serve` running there?" in said


def test_the_list_is_parsed_with_its_source_and_bad_items_named():
    got = brokers("127.0.0.1:1, :2,10.0.0.3:3,127.0.0.1:1")
    assert got.endpoints == (("127.0.0.1", 1), ("127.0.0.1", 2), ("10.0.0.3", 3)) and got.source == "-b/--broker"
    assert str(brokers(None, environ={"TIERED_BROKER": "h:1,h:2"})) == "h:1,h:2"
    assert any("port must be a number (from -b/--broker; want [addr:]port" in row[3] for row in WITHOUT_A_BROKER)
    for text, says in (("h:1,,h:2", "empty endpoint in 'h:1,,h:2'"), ("h:1,h:x", "port must be a number")):
        proc = tiered("status", "-b", text, check=False)
        assert says in one_line_error(proc, "status", 2)


async def test_a_produce_whose_answer_is_lost_is_reported_not_confirmed_and_not_sent_again(fake_cluster):
    fake_cluster.create("t", 1)
    a, b = await fake_cluster.start("a"), await fake_cluster.start("b")
    fake_cluster.lead(T0, b)
    b.hold(MsgType.PRODUCE)
    proc = await run("produce", "-b", str(a), "-t", "t/0", "lost", check=False)
    said = one_line_error(proc, "produce")
    assert f"t/0: 1 message not confirmed: the connection to the broker at {b} was lost after the produce was " \
           "sent" in said
    assert "they may still be committed: check from seq 1" in said
    assert b.count(MsgType.PRODUCE) == 1 and a.count(MsgType.PRODUCE) == 0
