"""Topic objects: each topic's catalog row kept in the bucket, so `tiered catalog rebuild` restores topics whole
(partition count, retention and ack settings), not only what their data implies."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tiered.catalog import Catalog
from tiered.catalog import topics as catalog_topics
from tiered.catalog.migrate import upgrade
from tiered.client import Client
from tiered.server.app import App
from tiered.tiering.objects import keys
from tiered.tiering.recovery.rebuild import rebuild_catalog
from tiered.tiering.objects.store import open_store
from tiered.tiering.objects.topic_objects import (
    MAX_TOPIC_OBJECT_BYTES,
    BadTopicObject,
    TopicObject,
    decode_topic_object,
    encode_topic_object,
    read_topic_objects,
)

from tests.support.broker import BrokerProcess, local_settings
from tests.support.cli import one_line_error, tiered

KEY = "topics/events.json"
GOOD = TopicObject("events", 4, "produce.ack=local\nlog.retention.secs=1h\n", 1_700_000_000_000)


def test_a_topic_object_round_trips():
    data = encode_topic_object(GOOD)
    assert decode_topic_object(data, KEY) == GOOD
    assert keys.topic_key("events") == KEY and keys.parse_topic_key(KEY) == "events"
    for foreign in ("topics/a/b.json", "topics/-a.json", "topics/events.txt", "events.json", "topics/.json"):
        assert keys.parse_topic_key(foreign) is None


def test_truncated_oversized_and_random_objects_are_refused_by_name():
    data = encode_topic_object(GOOD)
    for cut in range(len(data)):
        with pytest.raises(BadTopicObject, match="^topics/events.json: "):
            decode_topic_object(data[:cut], KEY)
    with pytest.raises(BadTopicObject, match="more than a topic object may hold"):
        decode_topic_object(data + b" " * MAX_TOPIC_OBJECT_BYTES, KEY)
    rng = random.Random(12)
    for _ in range(300):
        with pytest.raises(BadTopicObject):
            decode_topic_object(rng.randbytes(rng.randrange(0, 200)), KEY)


@pytest.mark.parametrize("change, why", [
    ({"format": 2}, "format 2"), ({"topic": "other"}, "not the one the key names"), ({"topic": "a/b"}, "not the one"),
    ({"partitions": 0}, "1..4096"), ({"partitions": 70000}, "1..4096"), ({"partitions": True}, "not a number"),
    ({"config_text": None}, "not a string"), ({"created_ms": -1}, "not a time"), ({"created_ms": 1.5}, "not a time"),
])
def test_each_field_is_checked(change, why):
    document = {**json.loads(encode_topic_object(GOOD)), **change}
    with pytest.raises(BadTopicObject, match=why):
        decode_topic_object(json.dumps(document).encode(), KEY)


def _settings(tmp_path: Path, data_dir: str, catalog: str):
    return local_settings(tmp_path / data_dir, catalog_url=f"sqlite:///{tmp_path / catalog}",
                          store_url=f"file://{tmp_path / 'objects'}", block_max_age_ms=20, shutdown_timeout_s=3.0)


TOPICS = {  # name: (partitions, options)
    "quick": (2, {"produce.ack": "local", "log.retention.secs": "2h", "remote.retention.secs": "3d"}),
    "safe": (3, {"produce.ack": "durable", "retention.segments.count": "5", "remote.retention.bytes": "1g"}),
    "empty": (5, {"remote.copy": "false"}),  # never gets a message: its partition count is in no block or segment
}


async def test_a_rebuilt_catalog_serves_topics_with_their_original_retention_and_ack_settings(tmp_path):
    app = App(_settings(tmp_path, "data", "original.db"))
    await app.start()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        for name, (partitions, options) in TOPICS.items():
            await c.create_topic(name, partitions, options)
        await c.produce("quick", 1, [b"q"])
        await c.produce("safe", 2, [b"s"])
    original = {name: app.broker.registry.topics[name].partitions[0].config for name in TOPICS}
    await app.stop()
    assert original["quick"].produce_ack == "local" and original["quick"].log_retention_secs == 7200
    assert original["safe"].retention_segments_count == 5 and original["safe"].remote_retention_bytes == 1 << 30

    rebuilt_url = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    upgrade(rebuilt_url)
    store = open_store(f"file://{tmp_path / 'objects'}")
    catalog = Catalog.open(rebuilt_url)
    try:
        report = await rebuild_catalog(store, catalog)
        rows = {row.name: row for row in catalog_topics.list_topics(catalog)}
    finally:
        catalog.close()
        await store.close()
    assert report.topics_without_object == [] and report.damaged == []
    assert {name: row.partitions for name, row in rows.items()} == {n: p for n, (p, _) in TOPICS.items()}

    # A broker on an empty disk with the rebuilt catalog recreates the topics with the configs they were created with.
    app = App(_settings(tmp_path, "empty-disk", "rebuilt.db"))
    await app.start()
    try:
        for name, (partitions, _) in TOPICS.items():
            topic = app.broker.registry.topics[name]
            assert len(topic.partitions) == partitions
            assert all(p.config == original[name] for p in topic.partitions), name
        assert app.broker.registry.get("quick", 0).durable is False
        assert app.broker.registry.get("safe", 0).durable is True
    finally:
        await app.stop()


async def test_a_topic_without_an_object_gets_one_at_the_next_start(tmp_path):
    """Topics created before topic objects existed (or whose PUT failed) are written at start."""
    settings = _settings(tmp_path, "data", "catalog.db")
    app = App(settings)
    await app.start()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("old", 2, {"produce.ack": "local"})
    await app.stop()
    objects = tmp_path / "objects"
    (objects / keys.topic_key("old")).unlink()

    app = App(settings)
    await app.start()
    await app.stop()
    store = open_store(f"file://{objects}")
    try:
        found, problems = await read_topic_objects(store)
    finally:
        await store.close()
    assert problems == []
    assert (found["old"].partitions, found["old"].config_text) == (2, "produce.ack=local\n")


def test_the_rebuild_command_restores_configs_and_names_force_for_a_full_catalog(tmp_path):
    data = tmp_path / "data"
    broker = BrokerProcess(data).start()
    try:
        b = ("-b", f"127.0.0.1:{broker.port}")
        tiered("topic", "create", *b, "keep", "3", "-o", "produce.ack=local,log.retention.secs=1d")
        tiered("produce", *b, "-t", "keep/2", "x")
    finally:
        assert broker.terminate() == 0
    store = f"file://{data.resolve() / '.tiered' / 'objects'}"
    rebuilt = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    argv = ("catalog", "rebuild", "--catalog", rebuilt, "--store", store)
    out = tiered(*argv).stdout.decode()
    assert "topics 1, partitions 3, 1 restored with their config" in out
    cat = Catalog.open(rebuilt)
    try:
        assert catalog_topics.get_topic(cat, "keep").config_text == "produce.ack=local\nlog.retention.secs=1d\n"
    finally:
        cat.close()
    err = one_line_error(tiered(*argv, check=False), "catalog rebuild")
    assert "is not empty" in err and "--force deletes them first" in err
    assert "topics 1, partitions 3" in tiered(*argv, "--force").stdout.decode()
