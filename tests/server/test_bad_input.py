"""Bad input closes only the offending connection; the broker keeps serving everyone and loses nothing."""

from __future__ import annotations

import os
import random
import struct

import pytest

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.frame import FRAME_HEADER, MAX_FRAME_BYTES, MsgType

from tests.server.rawwire import RawConnection


async def _still_serving(port: int, topic: str, expected: list[bytes]) -> None:
    async with await Client.connect("127.0.0.1", port) as c:
        got = [m.value async for m in c.drain(topic, 0, 0)]
        assert got == expected


@pytest.fixture
async def seeded(broker, client):
    await client.create_topic("safe", 1)
    await client.produce("safe", 0, [b"one", b"two"])
    return broker.broker.port


async def test_oversized_frame_closes_only_that_connection(seeded, client):
    bystander = await RawConnection.open(seeded)
    raw = await RawConnection.open(seeded)
    await raw.send_bytes(FRAME_HEADER.pack(MsgType.PRODUCE, MAX_FRAME_BYTES + 1))
    assert await raw.closed_by_peer()
    await bystander.send(MsgType.STATUS, rq.encode_status_request(rq.StatusRequest(1)))
    assert (await bystander.recv())[0] == MsgType.STATUS
    await bystander.close()
    await _still_serving(seeded, "safe", [b"one", b"two"])


@pytest.mark.parametrize("msg_id", [0x04, 0x09, 0x0D, 0x7F, 0xFF])
async def test_unknown_or_obsolete_message_ids_close_the_connection(seeded, msg_id):
    raw = await RawConnection.open(seeded)
    await raw.send(msg_id, b"\x00" * 8)
    assert await raw.closed_by_peer()
    await _still_serving(seeded, "safe", [b"one", b"two"])


async def test_malformed_payload_closes_the_connection(seeded):
    raw = await RawConnection.open(seeded)
    await raw.send(MsgType.CONSUME, b"\x02\x00\x01")  # truncated consume request
    assert await raw.closed_by_peer()
    await _still_serving(seeded, "safe", [b"one", b"two"])


async def test_a_produce_with_one_bad_bundle_appends_nothing(seeded):
    good = rq.ProducePartition(0, b"\x04\x00" + b"\x00" * 8 + b"\x01x")  # flags: 1 message, plain
    bad = rq.ProducePartition(0, b"\x03\x01")  # codec 3 does not exist
    req = rq.ProduceRequest(1, (rq.ProduceTopic("safe", (good, bad)),))
    raw = await RawConnection.open(seeded)
    await raw.send(MsgType.PRODUCE, rq.encode_produce_request(req))
    assert await raw.closed_by_peer()
    await _still_serving(seeded, "safe", [b"one", b"two"])


async def test_random_garbage_from_many_connections_leaves_the_broker_whole(seeded):
    rng = random.Random(1234)
    for _ in range(30):
        raw = await RawConnection.open(seeded)
        msg_id = rng.choice([1, 2, 5, 6, 7, 8, 10, 11, 12])
        payload = os.urandom(rng.randrange(0, 200))
        await raw.send_bytes(struct.pack("<BI", msg_id, len(payload)) + payload)
        await raw.close()
    await _still_serving(seeded, "safe", [b"one", b"two"])
    async with await Client.connect("127.0.0.1", seeded) as c:
        await c.produce("safe", 0, [Message(b"three")])
    await _still_serving(seeded, "safe", [b"one", b"two", b"three"])


async def test_idle_connections_are_closed(broker):
    broker.broker.idle_timeout_s = 0.3  # TANK's 16 s, shortened for the test
    raw = await RawConnection.open(broker.broker.port)
    assert await raw.closed_by_peer(timeout_s=5)


async def test_a_client_ping_is_ignored(seeded):
    raw = await RawConnection.open(seeded)
    await raw.send(MsgType.PING, b"")
    await raw.send(MsgType.STATUS, rq.encode_status_request(rq.StatusRequest(77)))
    msg_id, payload = await raw.recv()
    assert msg_id == MsgType.STATUS and payload[:4] == struct.pack("<I", 77)
    await raw.close()


async def test_frames_before_a_bad_one_in_the_same_read_are_answered_then_only_that_connection_closes(seeded):
    """The connection cuts every frame a read holds in one pass (frame.cut_payloads): good produces, then a bad
    frame in the same write (a truncated produce payload, random bytes, a header past 256 MiB), then more good
    produces that must never be applied. The good ones before it are appended and answered in order, the connection
    closes, nothing after the bad frame is appended, and another connection is served as before."""
    rng = random.Random(26)
    expected = [b"one", b"two"]
    for case in range(12):
        before = [b"b%d-%d" % (case, i) for i in range(rng.randrange(0, 4))]
        frames = [rq.encode_produce_request(rq.ProduceRequest(
            100 + i, (rq.ProduceTopic("safe", (rq.ProducePartition(0, encode_bundle([Message(v)])),)),)))
            for i, v in enumerate(before)]
        good = b"".join(struct.pack("<BI", MsgType.PRODUCE, len(f)) + f for f in frames)
        kind = case % 3
        if kind == 0:  # a produce whose payload stops short
            cut = rq.encode_produce_request(rq.ProduceRequest(9, (rq.ProduceTopic("safe", (
                rq.ProducePartition(0, encode_bundle([Message(b"never")])),)),)))
            cut = cut[:rng.randrange(1, len(cut))]
            bad = struct.pack("<BI", MsgType.PRODUCE, len(cut)) + cut
        elif kind == 1:  # random bytes as a produce payload
            junk = os.urandom(rng.randrange(1, 64))
            bad = struct.pack("<BI", MsgType.PRODUCE, len(junk)) + junk
        else:  # a header announcing more than a broker takes
            bad = FRAME_HEADER.pack(MsgType.PRODUCE, MAX_FRAME_BYTES + 1 + rng.randrange(1000))
        after = rq.encode_produce_request(rq.ProduceRequest(7, (rq.ProduceTopic("safe", (
            rq.ProducePartition(0, encode_bundle([Message(b"after")])),)),)))
        raw = await RawConnection.open(seeded)
        await raw.send_bytes(good + bad + struct.pack("<BI", MsgType.PRODUCE, len(after)) + after)
        answers = [await raw.recv() for _ in before]  # durable acks may be answered in any order
        assert sorted(answers) == [(MsgType.PRODUCE, struct.pack("<I", 100 + i) + b"\x00") for i in range(len(before))]
        assert await raw.closed_by_peer()
        expected += before
        await _still_serving(seeded, "safe", expected)
