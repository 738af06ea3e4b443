"""What clients may hold of a broker, together (tiered.server.limits): a receive budget for big frames, a connection
limit, a deadline for a request to arrive whole. Past a limit only the connection asking for more is closed, said
once with a count; everybody else is served."""

from __future__ import annotations

import asyncio
import logging
import struct

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.frame import FRAME_HEADER, MsgType
from tiered.server import connection as connection_module
from tiered.server.limits import AcceptErrors, ReceiveBudget

from tests.server.rawwire import RawConnection


async def serves(port: int) -> None:
    async with await Client.connect("127.0.0.1", port) as c:
        await c.produce("t", 0, [b"still here"])
        assert [m.value async for m in c.drain("t", 0, 0)][-1] == b"still here"


async def test_big_frames_past_the_receive_budget_close_only_the_connection_asking(broker, client, caplog):
    await client.create_topic("t", 1)
    budget = broker.broker.receive_budget = ReceiveBudget(limit=3 << 20)
    port = broker.broker.port
    part_of_a_big_produce = FRAME_HEADER.pack(MsgType.PRODUCE, 200 << 20) + bytes(1536 << 10)

    async def announce(conn: RawConnection) -> None:  # 200 MiB announced, 1.5 MiB sent (2 MiB of buffer)
        await conn.send_bytes(part_of_a_big_produce)
        for _ in range(100):
            if budget.used >= 2 << 20 or conn.reader.at_eof():
                return
            await asyncio.sleep(0.02)

    first = await RawConnection.open(port)
    await announce(first)
    assert budget.used == 2 << 20
    second = await RawConnection.open(port)
    await announce(second)
    assert await second.closed_by_peer(timeout_s=2.0)  # 2 MiB more do not fit
    assert "buffer budget for requests" in caplog.text
    assert budget.used == 2 << 20  # the refused connection's share came back
    await serves(port)  # small requests draw nothing
    await first.close()
    for _ in range(100):  # every byte drawn comes back once the connection is gone
        if budget.used == 0:
            break
        await asyncio.sleep(0.02)
    assert budget.used == 0
    third = await RawConnection.open(port)
    await announce(third)
    assert budget.used == 2 << 20 and not third.reader.at_eof()
    await third.close()


async def test_a_whole_big_frame_returns_its_budget_once_handled(broker, client):
    await client.create_topic("t", 1)
    budget = broker.broker.receive_budget = ReceiveBudget(limit=8 << 20)
    big = bytes(1 << 20)
    await client.produce("t", 0, [big, big, big])  # one ~3 MiB frame
    assert budget.used == 0
    await serves(broker.broker.port)


async def test_a_request_trickling_past_its_deadline_is_closed(broker, client, monkeypatch, caplog):
    caplog.set_level(logging.INFO, "tiered.server")
    await client.create_topic("t", 1)
    monkeypatch.setattr(connection_module, "REQUEST_DEADLINE_S", 0.5)
    broker.broker.idle_timeout_s = 0.2
    raw = await RawConnection.open(broker.broker.port)
    frame = FRAME_HEADER.pack(MsgType.STATUS, 4) + struct.pack("<I", 1)
    closed = False
    for byte in frame[:-1]:  # one byte every 0.1 s: always active, never whole
        try:
            await raw.send_bytes(bytes([byte]))
        except ConnectionError:
            closed = True
            break
        await asyncio.sleep(0.1)
    assert closed or await raw.closed_by_peer(timeout_s=2.0)
    assert "did not arrive whole within" in caplog.text
    await serves(broker.broker.port)


async def test_connections_past_the_limit_are_refused_at_accept_and_said_once(broker, client, caplog):
    await client.create_topic("t", 1)
    broker.broker.max_connections = len(broker.broker.connections) + 2
    kept = [await RawConnection.open(broker.broker.port) for _ in range(2)]
    refused = [await RawConnection.open(broker.broker.port, expect_ping=False) for _ in range(5)]
    assert all([await conn.closed_by_peer(timeout_s=2.0) for conn in refused])
    assert caplog.text.count("connection limit reached") == 1
    for conn in [*kept, *refused]:
        await conn.close()
    await client.close()
    await asyncio.sleep(0.1)
    await serves(broker.broker.port)


async def test_a_consume_of_partition_0xffff_closes_that_connection_with_the_reason(broker, client, caplog):
    await client.create_topic("t", 1)
    raw = await RawConnection.open(broker.broker.port)
    req = rq.ConsumeRequest(1, 0, 0, (rq.ConsumeTopic("t", (rq.ConsumePartition(0xFFFF, 1, 100),)),))
    await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))
    assert await raw.closed_by_peer()
    assert "partition id 0xffff of topic 't' cannot be answered" in caplog.text
    await serves(broker.broker.port)


def test_accept_errors_are_said_once_with_a_count(caplog):
    handled = []
    handler = AcceptErrors(lambda loop, context: handled.append(context))
    caplog.set_level(logging.WARNING)
    for _ in range(500):
        handler(None, {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many")})
    handler(None, {"message": "something else"})
    assert caplog.text.count("accepting connections failed") == 1
    assert handled == [{"message": "something else"}]
    assert handler.said.total == 500
