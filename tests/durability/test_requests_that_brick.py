"""Requests and states that stopped a broker for good in the adversarial run: the tail long-poll that missed a
pipelined produce, a topic named after the broker's own directory, a topic with more partitions than the broker can
hold, and a catalog that names a topic this disk cannot serve."""

from __future__ import annotations

import asyncio
import time

from tiered.catalog import Catalog
from tiered.catalog import topics as catalog_topics
from tiered.client import Client
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.codes import UINT64_MAX, CreateTopicStatus
from tiered.protocol.consume_response import read_consume_response
from tiered.protocol.frame import MsgType, encode_frame
from tiered.protocol.requests import (
    ConsumePartition,
    CreateTopicRequest,
    ConsumeRequest,
    ConsumeTopic,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    encode_consume_request,
    encode_create_topic_request,
    encode_produce_request,
)
from tiered.protocol.responses import read_create_topic_response

from tests.server.rawwire import RawConnection


async def test_a_tail_consume_wakes_on_a_produce_pipelined_behind_it(brokers, tmp_path):
    """TANK answers in about a millisecond: the produce lands while the consume is still being resolved, and the
    waiter must be registered (or see it) before the handler gives the event loop away."""
    app = await brokers.start("disk", f"sqlite:///{tmp_path}/c.db")
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("fast", 1, {"produce.ack": "local"})
        await c.produce("fast", 0, [b"first"])
    raw = await RawConnection.open(app.broker.port)
    for separate_writes in (False, True):
        tail = 2 if not separate_writes else 3
        consume = encode_frame(MsgType.CONSUME, encode_consume_request(ConsumeRequest(
            7, 5_000, 0, (ConsumeTopic("fast", (ConsumePartition(0, tail, 1 << 20),)),))))
        produce = encode_frame(MsgType.PRODUCE, encode_produce_request(ProduceRequest(
            8, (ProduceTopic("fast", (ProducePartition(0, encode_bundle([Message(b"next-%d" % tail)])),)),))))
        started = time.monotonic()
        if separate_writes:
            await raw.send_bytes(consume)
            await raw.send_bytes(produce)
        else:
            await raw.send_bytes(consume + produce)
        answers = {}
        while 7 not in answers:
            msg_id, payload = await raw.recv(timeout_s=4.0)
            answers[int.from_bytes(payload[:4], "little") if msg_id == MsgType.PRODUCE
                    else int.from_bytes(payload[4:8], "little")] = (msg_id, payload)
        assert time.monotonic() - started < 1.0  # woken by the produce, not by the 5 s deadline
        response = read_consume_response(answers[7][1])
        [partition] = response.topics[0].partitions
        assert partition.chunk_len > 0 and partition.base_seq == tail
    await raw.close()


async def create_topic_raw(port: int, topic: str, partitions: int) -> int:
    """CreateTopic as any TANK client sends it (ours checks names and counts before sending: the broker must too)."""
    raw = await RawConnection.open(port)
    try:
        await raw.send(MsgType.CREATE_TOPIC, encode_create_topic_request(CreateTopicRequest(1, topic, partitions, b"")))
        _, payload = await raw.recv(timeout_s=10)
        return read_create_topic_response(payload).status
    finally:
        await raw.close()


async def test_a_topic_named_after_the_state_directory_is_refused_before_anything_is_written(brokers, tmp_path):
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    app = await brokers.start("disk", catalog_url)
    assert await create_topic_raw(app.broker.port, "tiered", 1) == CreateTopicStatus.INVALID
    # More partitions than a broker holds: refused at once, not after laying out 65,535 directories.
    started = time.monotonic()
    assert await create_topic_raw(app.broker.port, "wide", 65535) == CreateTopicStatus.INVALID
    assert time.monotonic() - started < 2
    with Catalog.open(catalog_url) as cat:
        assert catalog_topics.list_topics(cat) == []
    await app.stop()
    app = await brokers.start("disk", catalog_url)  # and the broker starts again
    assert app.broker.ready


async def test_a_topic_the_disk_cannot_serve_is_reported_and_the_others_are_served(brokers, tmp_path, caplog):
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    app = await brokers.start("disk", catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("good", 1)
        await c.produce("good", 0, [b"kept"])
    await app.stop()
    with Catalog.open(catalog_url) as cat:  # a row an older broker wrote before it refused the name
        catalog_topics.create_topic(cat, "tiered", 2)
    app = await brokers.start("disk", catalog_url)
    assert "topic tiered cannot be created locally and is not served" in caplog.text
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        assert [m.value async for m in c.drain("good", 0, 0)] == [b"kept"]


async def test_many_partitions_are_claimed_in_batches_on_postgresql(brokers, pg_url):
    app = await brokers.start("disk", pg_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        started = time.monotonic()
        assert await c.create_topic("wide", 1200) == CreateTopicStatus.OK
        await c.produce("wide", 1199, [b"last"])
        assert [m.value async for m in c.drain("wide", 1199, 0)] == [b"last"]
        took = time.monotonic() - started
    # The event loop answered others meanwhile (the topic's directories were laid out in a worker thread).
    ping = await asyncio.wait_for(Client.connect("127.0.0.1", app.broker.port), 5)
    await ping.close()
    assert took < 120
