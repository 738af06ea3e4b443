"""CreateTopic, DiscoverPartitions, ReloadConf, DiscoverTopics, DiscoverTopology and read-only mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tiered.client import Client, TankError
from tiered.protocol import requests as rq
from tiered.protocol import responses as rs
from tiered.protocol.codes import UINT64_MAX, CreateTopicStatus, DiscoverReason, ReloadConfStatus
from tiered.protocol.frame import MsgType
from tiered.server.app import App

from tests.server.rawwire import RawConnection
from tests.support.broker import local_settings


async def _create_status(port, topic, partitions, config=b""):
    raw = await RawConnection.open(port)
    req = rq.CreateTopicRequest(5, topic, partitions, config)
    await raw.send(MsgType.CREATE_TOPIC, rq.encode_create_topic_request(req))
    msg_id, payload = await raw.recv()
    await raw.close()
    assert msg_id == MsgType.CREATE_TOPIC
    return rs.read_create_topic_response(payload).status


async def test_create_topic_statuses_as_tank(broker):
    port = broker.broker.port
    assert await _create_status(port, "events", 2) == CreateTopicStatus.OK
    assert await _create_status(port, "events", 2) == CreateTopicStatus.EXISTS
    assert await _create_status(port, "bad/name", 1) == CreateTopicStatus.INVALID
    assert await _create_status(port, "..", 1) == CreateTopicStatus.INVALID
    assert await _create_status(port, "zero", 0) == CreateTopicStatus.INVALID
    assert await _create_status(port, "cfg", 1, b"log.segment.bytes=1\n") == CreateTopicStatus.BAD_CONFIG
    data = broker.settings.data_dir
    assert sorted(p.name for p in data.iterdir() if not p.name.startswith(".")) == ["events"]
    assert sorted(p.name for p in (data / "events").iterdir()) == ["0", "1"]


async def test_created_topic_config_is_written_in_tank_format(broker):
    assert await _create_status(broker.broker.port, "conf", 1, b"log.segment.bytes=1m\n") == CreateTopicStatus.OK
    assert (broker.settings.data_dir / "conf" / "config").read_text() == "log.segment.bytes=1m\n"


async def test_discover_partitions_all_and_explicit_list_with_unknown_partition(broker, client):
    await client.create_topic("events", 2)
    await client.produce("events", 1, [b"a", b"b"])
    ranges = await client.discover_partitions("events")
    assert [(r.first_available, r.hwmark) for r in ranges] == [(0, 0), (1, 2)]
    # TANK answers 0xfd for every listed partition in standalone mode and aborts on an unknown one: we answer.
    ranges = await client.discover_partitions("events", [1, 0, 9])
    assert [(r.first_available, r.hwmark, r.reason) for r in ranges] == [
        (1, 2, None), (0, 0, None), (UINT64_MAX, UINT64_MAX, DiscoverReason.SYSTEM)]
    with pytest.raises(TankError):
        await client.discover_partitions("nosuch")
    # The broker is still serving after the unknown partition.
    assert (await client.status()).topics == 1


async def test_discover_topics_and_topology(client):
    await client.create_topic("events", 2)
    await client.create_topic("logs", 1)
    topics = await client.discover_topics()
    assert sorted((t.name, t.enabled, t.partitions) for t in topics) == [("events", True, 2), ("logs", True, 1)]
    topology = await client.discover_topology()
    assert topology.cluster_name is None and topology.nodes == ()


async def test_reload_conf_reads_the_partition_config_file(broker, client):
    await client.create_topic("logs", 1)
    assert await client.reload_conf("logs", 0) == ReloadConfStatus.IO  # no partition config yet, as TANK
    assert await client.reload_conf("nosuch", 0) == ReloadConfStatus.UNKNOWN_TOPIC
    assert await client.reload_conf("logs", 5) == ReloadConfStatus.UNKNOWN_PARTITION
    path = broker.settings.data_dir / "logs" / "0" / "config"
    path.write_text("log.segment.bytes=1\n")
    assert await client.reload_conf("logs", 0) == ReloadConfStatus.PARSE
    path.write_text("log.segment.bytes=128k\n")
    assert await client.reload_conf("logs", 0) == ReloadConfStatus.OK
    assert broker.broker.registry.get("logs", 0).config.log_segment_bytes == 128 * 1024


async def test_topics_survive_a_restart(tmp_path):
    settings = local_settings(tmp_path / "data")
    app = App(settings, local_only=True)
    await app.start()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("kept", 3)
        await c.produce("kept", 2, [b"x", b"y"])
    await app.stop()
    app = App(settings, local_only=True)
    await app.start()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        assert [(t.name, t.partitions) for t in await c.discover_topics()] == [("kept", 3)]
        got = await c.consume("kept", 2, 0)
        assert [m.value for m in got.messages] == [b"x", b"y"]
        await c.produce("kept", 2, [b"z"])
        assert [m.seq for m in (await c.consume("kept", 2, 3)).messages] == [3]
    await app.stop()


async def test_read_only_mode_refuses_produce_and_create(tmp_path):
    settings = local_settings(tmp_path / "data")
    app = App(settings, local_only=True)
    await app.start()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("ro", 1)
    await app.stop()
    app = App(replace(settings, read_only=True), local_only=True)
    await app.start()
    try:
        assert await _create_status(app.broker.port, "another", 1) == CreateTopicStatus.READ_ONLY
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            with pytest.raises(TankError) as caught:
                await c.produce("ro", 0, [b"x"])
            assert caught.value.code == 0xFE
    finally:
        await app.stop()
