"""Produce and consume over a real socket, checked through the client and byte for byte on the wire."""

from __future__ import annotations

import pytest

from tiered.client import BoundaryError, Client, UnknownPartition, UnknownTopic
from tiered.protocol import requests as rq
from tiered.protocol import responses as rs
from tiered.protocol.bundle import CODEC_SNAPPY, Message, encode_bundle, read_bundle_header
from tiered.protocol.codes import UINT64_MAX, ConsumeStatus, ProduceStatus
from tiered.protocol.frame import MsgType
from tiered.protocol.varint import encode_varint

from tests.server.rawwire import RawConnection


async def test_produce_then_consume_everything_in_order(client):
    await client.create_topic("events", 2)
    for i in range(20):
        await client.produce("events", i % 2, [Message(f"m{i}".encode(), b"k" if i % 3 == 0 else None, 1000 + i)])
    got = [m async for m in client.drain("events", 0, 0)]
    assert [m.value for m in got] == [f"m{i}".encode() for i in range(0, 20, 2)]
    assert [m.seq for m in got] == list(range(1, 11))
    assert [m.key for m in got][:2] == [b"k", None]
    assert got[0].ts_ms == 1000


async def test_consume_from_the_middle_starts_at_the_bundle_holding_the_seq(broker, client):
    await client.create_topic("pyt", 1)
    await client.produce("pyt", 0, [Message(b"a1", None, 5), Message(b"a2", b"key", 5), Message(b"a3", None, 6)])
    raw = await RawConnection.open(broker.broker.port)
    req = rq.ConsumeRequest(7, 0, 0, (rq.ConsumeTopic("pyt", (rq.ConsumePartition(0, 2, 1000),)),))
    await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))
    msg_id, payload = await raw.recv()
    resp = rs.read_consume_response(payload)
    (p,) = resp.topics[0].partitions
    assert (msg_id, p.status, p.base_seq, p.hwmark) == (MsgType.CONSUME, ConsumeStatus.OK, 1, 3)
    # The chunk is the segment record byte for byte: {varint len, bundle}.
    bundle = encode_bundle([Message(b"a1", None, 5), Message(b"a2", b"key", 5), Message(b"a3", None, 6)])
    assert bytes(resp.chunks[0]) == encode_varint(len(bundle)) + bundle
    await raw.close()
    # The client drops the messages below the requested seq.
    got = await client.consume("pyt", 0, 2)
    assert [m.seq for m in got.messages] == [2, 3]
    assert got.next_seq == 4


async def test_fetch_size_smaller_than_a_bundle_still_returns_the_whole_bundle(client):
    await client.create_topic("big", 1)
    await client.produce("big", 0, [Message(b"x" * 100, None, 1)] * 3, codec=0)
    got = await client.consume("big", 0, 1, fetch_bytes=5)
    assert [m.seq for m in got.messages] == [1, 2, 3]


async def test_snappy_bundles_round_trip_and_are_stored_compressed(broker, client):
    await client.create_topic("zipped", 1)
    messages = [Message(b"payload %d " % i * 20, None, 42) for i in range(600)]
    await client.produce("zipped", 0, messages)  # > 512 messages: the client picks snappy as TANK's does
    got = [m async for m in client.drain("zipped", 0, 0)]
    assert [m.value for m in got] == [m.value for m in messages]
    segment = next((broker.settings.data_dir / "zipped" / "0").glob("*.log"))
    data = segment.read_bytes()
    assert read_bundle_header(data[2:] if data[0] & 0x80 else data[1:]).codec == CODEC_SNAPPY


async def test_sparse_bundles_from_produce_with_seqnum(broker, client):
    await client.create_topic("mirror", 1)
    msgs = [Message(b"m1000", None, 1, 1000), Message(b"m1001", None, 1, 1001),
            Message(b"m1005", None, 1, 1005), Message(b"m1006", None, 1, 1006)]
    await client.produce_with_seqnum("mirror", 0, msgs)
    # A gap starts the segment at the explicit seq, as TANK names it.
    assert any(p.name.startswith("1000_") for p in (broker.settings.data_dir / "mirror" / "0").glob("*.log"))
    raw = await RawConnection.open(broker.broker.port)
    req = rq.ConsumeRequest(9, 0, 0, (rq.ConsumeTopic("mirror", (rq.ConsumePartition(0, 0, 4096),)),))
    await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))
    _, payload = await raw.recv()
    (p,) = rs.read_consume_response(payload).topics[0].partitions
    assert (p.status, p.hwmark) == (ConsumeStatus.SPARSE, 1006)
    await raw.close()
    got = await client.consume("mirror", 0, 0)
    assert [m.seq for m in got.messages] == [1000, 1001, 1005, 1006]
    # Plain produce continues after the sparse range.
    await client.produce("mirror", 0, [b"next"])
    got = await client.consume("mirror", 0, 1007)
    assert [(m.seq, m.value) for m in got.messages] == [(1007, b"next")]


async def test_explicit_seqnums_at_or_below_the_hwmark_are_refused_with_0x0a(client):
    await client.create_topic("seqs", 1)
    await client.produce("seqs", 0, [b"a", b"b"])
    status = await client.produce_raw("seqs", 0, encode_bundle([Message(b"x", None, 1, 2)], sparse=True), base_seq=2)
    assert status == ProduceStatus.INVALID_SEQNUMS


async def test_produce_response_bytes_for_unknown_topic_and_partition(broker, client):
    # docs/protocol.md §3.2: pyt:[0,1,9], nosuch:[0,1], pyt:[2] -> 64000000 00 00 01 ff 00
    await client.create_topic("pyt", 3)
    bundle = encode_bundle([Message(b"v", None, 1)])
    parts = lambda ids: tuple(rq.ProducePartition(i, bundle) for i in ids)  # noqa: E731
    req = rq.ProduceRequest(100, (rq.ProduceTopic("pyt", parts([0, 1, 9])), rq.ProduceTopic("nosuch", parts([0, 1])),
                                  rq.ProduceTopic("pyt", parts([2]))))
    raw = await RawConnection.open(broker.broker.port)
    await raw.send(MsgType.PRODUCE, rq.encode_produce_request(req))
    msg_id, payload = await raw.recv()
    assert msg_id == MsgType.PRODUCE
    assert payload == bytes.fromhex("64000000 00 00 01 ff 00")
    await raw.close()


async def test_consume_errors_unknown_topic_partition_and_boundary(client):
    await client.create_topic("pyt", 1)
    await client.produce("pyt", 0, [b"a", b"b", b"c"])
    with pytest.raises(UnknownTopic):
        await client.consume("nosuch", 0, 0)
    with pytest.raises(UnknownPartition):
        await client.consume("pyt", 7, 0)
    with pytest.raises(BoundaryError) as caught:
        await client.consume("pyt", 0, 10)
    assert (caught.value.first_available, caught.value.hwmark) == (1, 3)


async def test_eof_answered_at_once_with_first_available_as_base(broker, client):
    # docs/protocol.md §3.4: p2 at EOF -> base=firstAvailable, chunk_len 0 (at once: other partitions had data).
    await client.create_topic("pyt", 3)
    await client.produce_many({("pyt", 0): [Message(b"a1")], ("pyt", 2): [Message(b"c1")]})
    raw = await RawConnection.open(broker.broker.port)
    req = rq.ConsumeRequest(200, 5000, 0, (rq.ConsumeTopic("pyt", (
        rq.ConsumePartition(0, 1, 1000), rq.ConsumePartition(2, 2, 1000), rq.ConsumePartition(1, 0, 1000))),))
    await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))
    _, payload = await raw.recv(timeout_s=2)
    p0, p2, p1 = rs.read_consume_response(payload).topics[0].partitions
    assert (p0.status, p0.base_seq, p0.hwmark) == (0, 1, 1) and p0.chunk_len > 0
    assert (p2.status, p2.base_seq, p2.hwmark, p2.chunk_len) == (0, 1, 1, 0)
    assert (p1.status, p1.base_seq, p1.hwmark, p1.chunk_len) == (0, 0, 0, 0)  # empty partition: EOF at 0
    await raw.close()


async def test_multi_partition_produce_in_one_request(client):
    await client.create_topic("multi", 4)
    statuses = await client.produce_many({("multi", p): [Message(b"p%d" % p)] for p in range(4)})
    assert set(statuses.values()) == {ProduceStatus.OK}
    for p in range(4):
        got = await client.consume("multi", p, 1)
        assert [m.value for m in got.messages] == [b"p%d" % p]


async def test_many_connections_share_one_broker(broker):
    clients = [await Client.connect("127.0.0.1", broker.broker.port) for _ in range(8)]
    await clients[0].create_topic("shared", 1)
    for i, c in enumerate(clients):
        await c.produce("shared", 0, [b"from %d" % i])
    got = [m async for m in clients[-1].drain("shared", 0, 0)]
    assert sorted(m.value for m in got) == sorted(b"from %d" % i for i in range(8))
    for c in clients:
        await c.close()


async def test_status_reflects_topics_and_partitions(client):
    await client.create_topic("a", 2)
    await client.create_topic("b", 3)
    s = await client.status()
    assert (s.topics, s.partitions, s.version) == (2, 5, 400)
    assert s.startup_ts > 0


async def test_uint64_max_is_the_tail(client):
    await client.create_topic("t", 1)
    await client.produce("t", 0, [b"old"])
    got = await client.consume("t", 0, UINT64_MAX)
    assert got.messages == [] and got.next_seq == 2 and got.drained


async def test_big_varint_count_bundle(client):
    await client.create_topic("counts", 1)
    await client.produce("counts", 0, [Message(b"%d" % i) for i in range(40)], codec=0)
    got = [m async for m in client.drain("counts", 0, 0)]
    assert [m.value for m in got] == [b"%d" % i for i in range(40)]

