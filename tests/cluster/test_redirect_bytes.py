"""TANK's redirects on the wire, byte for byte (docs/protocol.md §0, §3.2, §3.4, §3.6): a broker answers for a
partition another broker leads with 0xfc and the leader's addr4 + port, in produce, consume and DiscoverPartitions,
and serves the partition's committed history itself."""

from __future__ import annotations

import asyncio
import struct

from tiered.client import Client
from tiered.protocol.chunk import read_chunk
from tiered.protocol.codes import ConsumeStatus, Endpoint
from tiered.protocol.consume_response import read_consume_response
from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.frame import MsgType

from tests.server.rawwire import RawConnection

LOOPBACK = bytes([127, 0, 0, 1])
ALL = b"\xff" * 8


def endpoint(port: int) -> bytes:
    return LOOPBACK + struct.pack("<H", port)


async def two_brokers(cluster) -> dict[int, int]:
    cluster.start_all([0, 1])
    async with await Client.connect(*cluster.endpoint(0)) as client:
        await client.create_topic("ev", 2, {"produce.ack": "durable"})
    return cluster.wait_for_leaders("ev", {0, 1})


async def test_produce_consume_and_discover_name_the_leader(cluster):
    leaders = await two_brokers(cluster)
    assert leaders == {0: 0, 1: 1}  # spread: the fewest leaderships first, then the lowest id
    port1 = cluster.brokers[1].port
    raw = await RawConnection.open(cluster.brokers[0].port)
    try:
        # Produce to partition 1 through broker 0: 0xfc + 127.0.0.1:port1, nothing appended.
        bundle = encode_bundle([Message(b"x")])
        req = rq.ProduceRequest(0x61, (rq.ProduceTopic("ev", (rq.ProducePartition(1, bundle),)),))
        await raw.send(MsgType.PRODUCE, rq.encode_produce_request(req))
        assert await raw.recv() == (MsgType.PRODUCE, bytes.fromhex("61000000") + b"\xfc" + endpoint(port1))

        # Consume at the tail of partition 1: the leader answers (its long-poll), so 0xfc + endpoint.
        req = rq.ConsumeRequest(0x62, 0, 0, (rq.ConsumeTopic("ev", (rq.ConsumePartition(1, 2**64 - 1, 4096),)),))
        await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))
        header = bytes.fromhex("62000000 01 02") + b"ev" + bytes.fromhex("01 0100 fc") + endpoint(port1)
        assert await raw.recv() == (MsgType.CONSUME, struct.pack("<I", len(header)) + header)

        # DiscoverPartitions: partition 0 is led here (empty: 0, 0); partition 1 names its leader.
        req = rq.DiscoverPartitionsRequest(0x63, "ev", None)
        await raw.send(MsgType.DISCOVER_PARTITIONS, rq.encode_discover_partitions_request(req))
        expected = (bytes.fromhex("63000000 02") + b"ev" + bytes.fromhex("0200") + bytes(16) + ALL + ALL + b"\xfc"
                    + endpoint(port1))
        assert await raw.recv() == (MsgType.DISCOVER_PARTITIONS, expected)
    finally:
        await raw.close()
    cluster.check("ev")


async def raw_consume(raw: RawConnection, request_id: int, partition: int, seq: int):
    req = rq.ConsumeRequest(request_id, 0, 0, (rq.ConsumeTopic("ev", (rq.ConsumePartition(partition, seq, 1 << 16),)),))
    await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))
    msg_id, payload = await raw.recv()
    resp = read_consume_response(payload)
    return resp.topics[0].partitions[0], (resp.chunks[0] if resp.chunks else None)


async def test_history_is_served_by_any_broker_and_the_tail_by_the_leader(cluster):
    await two_brokers(cluster)
    async with await Client.connect(*cluster.endpoint(1)) as leader:
        for i in range(5):
            await leader.produce("ev", 1, [f"m{i}"])
        direct = await leader.consume("ev", 1, 1)
    assert [m.value for m in direct.messages] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    raw = await RawConnection.open(cluster.brokers[0].port)  # the follower, no client logic in between
    try:
        read: list = []
        for request_id in range(1, 200):  # the follower learns the committed high-water mark at its next look
            result, chunk = await raw_consume(raw, request_id, 1, len(read) + 1)
            if result.status == ConsumeStatus.OTHER_LEADER:  # past what it knows is committed: the leader's
                assert result.leader == Endpoint("127.0.0.1", cluster.brokers[1].port)
                await asyncio.sleep(0.05)
                continue
            assert result.status == ConsumeStatus.OK and chunk is not None, result
            read += read_chunk(chunk, result.base_seq, len(read) + 1, result.hwmark).messages  # one block's run
            if len(read) == 5:
                break
        assert [(m.seq, m.value) for m in read] == [(m.seq, m.value) for m in direct.messages]
        assert result.hwmark == 5
        result, _ = await raw_consume(raw, 999, 1, 6)  # the tail: the leader's
        assert result.status == ConsumeStatus.OTHER_LEADER
    finally:
        await raw.close()
    cluster.check("ev")
