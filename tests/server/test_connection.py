"""How a connection cuts frames and answers them: whole, byte by byte, big frames received in place, frames queued
behind a request that waits (reading pauses), a half-closed client, and an oversized frame after good ones."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import CODEC_NONE, Message, encode_bundle
from tiered.protocol.frame import FRAME_HEADER, MAX_FRAME_BYTES, MsgType, encode_frame
from tiered.server.app import App, tiering_service
from tiered.server.connection import BIG_FRAME_BYTES, MAX_QUEUED_BYTES, MIN_READ_BYTES, READ_BYTES

from tests.server.rawwire import RawConnection
from tests.support.broker import local_settings


def produce_frame(request_id: int, topic: str, values: list[bytes]) -> bytes:
    bundle = encode_bundle([Message(v, None, 1) for v in values], codec=CODEC_NONE)
    req = rq.ProduceRequest(request_id, (rq.ProduceTopic(topic, (rq.ProducePartition(0, bundle),)),))
    return encode_frame(MsgType.PRODUCE, rq.encode_produce_request(req))


def status_frame(request_id: int) -> bytes:
    return encode_frame(MsgType.STATUS, rq.encode_status_request(rq.StatusRequest(request_id)))


async def answers(raw: RawConnection, count: int) -> list[tuple[int, int]]:
    """(msg_id, request id) of the next `count` responses."""
    out = []
    for _ in range(count):
        msg_id, payload = await raw.recv()
        out.append((msg_id, rq.REQUEST_ID.unpack_from(payload)[0]))
    return out


async def drained(port: int, topic: str) -> list[bytes]:
    async with await Client.connect("127.0.0.1", port) as c:
        return [m.value async for m in c.drain(topic, 0, 0)]


@pytest.fixture
async def port(broker, client):
    await client.create_topic("c", 1)
    return broker.broker.port


def server_no_delay(app: App) -> list[int]:
    """TCP_NODELAY of each connection the broker accepted."""
    return [c.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for c in app.broker.connections]


async def test_accepted_connections_have_nagle_off(broker, client):
    """A consume answer is the frame head, then the segment's bytes by sendfile: with Nagle on, the second send
    waits for the client's delayed ACK (about 40 ms per answer). Checked on the socket, not timed."""
    await client.create_topic("n", 1)
    await client.produce("n", 0, [Message(b"v", None, 1)])
    assert [m.value for m in (await client.consume("n", 0, 1)).messages] == [b"v"]
    flags = server_no_delay(broker)
    assert flags and all(flags), flags


@pytest.mark.parametrize("step", [1, 3, 4096, None], ids=["byte-by-byte", "3-bytes", "4-KiB", "one-write"])
async def test_pipelined_requests_in_any_cut(port, step):
    big = b"B" * (BIG_FRAME_BYTES * 3)  # received into a buffer of its own
    stream = b"".join([produce_frame(1, "c", [b"a"]), status_frame(2), produce_frame(3, "c", [big, b"b"]),
                       encode_frame(MsgType.PING, b""), produce_frame(4, "c", [b"c"] * 20), status_frame(5)])
    raw = await RawConnection.open(port)
    step = step or len(stream)
    for i in range(0, len(stream), step):
        await raw.send_bytes(stream[i : i + step])
    assert await answers(raw, 5) == [(MsgType.PRODUCE, 1), (MsgType.STATUS, 2), (MsgType.PRODUCE, 3),
                                     (MsgType.PRODUCE, 4), (MsgType.STATUS, 5)]
    await raw.close()
    assert await drained(port, "c") == [b"a", big, b"b"] + [b"c"] * 20


async def test_frames_queue_and_reading_pauses_while_a_request_waits(tmp_path, s3_endpoint, s3_bucket, s3_faults,
                                                                     monkeypatch):
    """A durable produce waits for admission while uploads stall (the store is away, 8 blocks in flight): the frames
    behind it queue up past MAX_QUEUED_BYTES and reading pauses; once the store is back, every request is answered
    OK, in order, and every message is there."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    settings = local_settings(tmp_path / "data", store_url=f"s3://{s3_bucket}/tiered", s3_path_style=True,
                              block_max_age_ms=20, shutdown_timeout_s=5.0)
    app = App(settings, tier=tiering_service(ack_timeout_s=60.0))
    await app.start()
    try:
        port = app.broker.port
        async with await Client.connect("127.0.0.1", port) as c:
            await c.create_topic("d", 1, {"produce.ack": "durable"})
        s3_faults.go_away()
        raw = await RawConnection.open(port)
        pipeline = app.tier.durable.pipeline
        request_id = 0
        while pipeline.in_flight < pipeline.max_in_flight:  # one block per request: each waits out the block age
            await raw.send_bytes(produce_frame(request_id, "d", [b"early"]))
            request_id += 1
            await asyncio.sleep(0.05)
            assert request_id < 100, "uploads never stalled"
        value = b"v" * (100 << 10)
        backlog = 2 * MAX_QUEUED_BYTES // len(value)
        await raw.send_bytes(b"".join(produce_frame(request_id + i, "d", [value]) for i in range(backlog)))
        conn = next(iter(app.broker.connections))
        for _ in range(1000):  # bounded: 10 s
            if conn.reading_paused:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("reading never paused")
        s3_faults.come_back()
        got = []
        for _ in range(request_id + backlog):
            msg_id, payload = await raw.recv(timeout_s=60)
            got.append((msg_id, payload))
        assert {p[4:] for _, p in got} == {bytes(1)}  # OK, each
        assert sorted(rq.REQUEST_ID.unpack_from(p)[0] for _, p in got) == list(range(request_id + backlog))
        await raw.close()
        assert len(await drained(port, "d")) == request_id + backlog
    finally:
        s3_faults.come_back()
        await app.stop()


async def test_a_half_closed_client_gets_its_answers(port):
    raw = await RawConnection.open(port)
    await raw.send_bytes(produce_frame(1, "c", [b"x"]) + status_frame(2))
    raw.writer.transport.write_eof()
    assert await answers(raw, 2) == [(MsgType.PRODUCE, 1), (MsgType.STATUS, 2)]
    assert await raw.closed_by_peer()
    assert await drained(port, "c") == [b"x"]


async def test_an_oversized_frame_closes_the_connection_after_the_requests_before_it(port):
    raw = await RawConnection.open(port)
    await raw.send_bytes(produce_frame(1, "c", [b"first"]) + FRAME_HEADER.pack(MsgType.PRODUCE, MAX_FRAME_BYTES + 1))
    assert await answers(raw, 1) == [(MsgType.PRODUCE, 1)]
    assert await raw.closed_by_peer()
    assert await drained(port, "c") == [b"first"]


async def test_a_frame_as_large_as_the_read_buffer_and_larger(port):
    sizes = [READ_BYTES - 100, READ_BYTES, 3 * READ_BYTES + 7]
    raw = await RawConnection.open(port)
    sock: socket.socket = raw.writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i, size in enumerate(sizes):
        await raw.send_bytes(produce_frame(i, "c", [bytes([65 + i]) * size]))
    assert await answers(raw, 3) == [(MsgType.PRODUCE, i) for i in range(3)]
    await raw.close()
    assert [len(v) for v in await drained(port, "c")] == sizes


async def test_memory_follows_the_bytes_received_not_the_length_announced(broker, port):
    raw = await RawConnection.open(port)
    await raw.send_bytes(FRAME_HEADER.pack(MsgType.PRODUCE, MAX_FRAME_BYTES) + b"x" * 1000)
    for _ in range(500):  # bounded: 5 s
        conns = [c for c in broker.broker.connections if c.receive_buffer_bytes > MIN_READ_BYTES]
        if conns:
            break
        await asyncio.sleep(0.01)
    assert [c.receive_buffer_bytes for c in conns] == [MIN_READ_BYTES + READ_BYTES]  # not 256 MiB
    await raw.send_bytes(b"y" * (2 * READ_BYTES))
    for _ in range(500):
        if conns[0].receive_buffer_bytes > MIN_READ_BYTES + READ_BYTES:
            break
        await asyncio.sleep(0.01)
    assert MIN_READ_BYTES + 2 * READ_BYTES < conns[0].receive_buffer_bytes <= MIN_READ_BYTES + 4 * READ_BYTES
    await raw.close()


def test_receive_buffers_are_sized_and_grown_buffers_keep_their_bytes():
    """receive_buffer leaves its bytes unset (natively): a grown buffer holds exactly the bytes it was given at its
    start, and a frame is cut from received bytes only (the pipelined tests above hold every byte to the wire's)."""
    from tiered.protocol.buffers import receive_buffer
    from tiered.server.connection import _grown

    assert [len(receive_buffer(n)) for n in (0, 1, BIG_FRAME_BYTES)] == [0, 1, BIG_FRAME_BYTES]
    assert isinstance(receive_buffer(3), bytearray)
    with pytest.raises((ValueError, OverflowError)):
        receive_buffer(-1)
    data = bytearray(b"header" + bytes(range(256)) * 4)
    grown = _grown(data, 6, 1000, 4096)
    assert len(grown) == 4096 and grown[:1000] == data[6:1006]
    data[6:10] = b"XXXX"  # the grown buffer is a copy: later writes to the receive buffer do not reach it
    assert grown[:4] == bytes(range(4))
