"""The cost meter agrees with the bucket: a broker on moto's S3 through a proxy that records every HTTP request
(tests/support/s3.py), two topics produced at different rates, one compacted with `tiered topic compact`, then the
broker's disk lost and the other topic's history read back by a consumer (every old seq a remote read: GETs of
segments and block runs). The proxy's requests, attributed by the test from their keys and the block footers, match
what the brokers' meters counted, per topic and operation, to within one request; the shares add up to the requests
the proxy saw; and `tiered cost` reports what the meters counted.

The replay is a consumer's remote read of old history rather than Spark's: Spark's GETs are the replaying process's
own, not the broker's, and the meter counts the broker's requests.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest

from tiered.client import Client
from tiered.protocol.bundle import Message
from tiered.server.app import App, tiering_service
from tiered.tiering.blocks.block_format import block_tail_bytes, read_block_footer
from tiered.tiering.objects import keys
from tiered.tiering.objects.meter import CATALOG_WIDE, UNATTRIBUTED
from tiered.topic_partition import TopicPartition

from tests.ops.helpers import scrape
from tests.support.broker import REPO, local_settings
from tests.support.polling import eventually

from .s3_ops import request_op

FAST = "fast"  # compacted, produced at six times the rate of SLOW
SLOW = "slow"  # replayed from the bucket
SMALL_SEGMENTS = "log.segment.bytes=2kb\nlog.index.interval.bytes=256\n"
PREFIX = "tiered"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tiered.cli.main", *args], capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, timeout=120)


async def produce(client: Client, other: Client, rng: random.Random) -> None:
    """Every sixth FAST bundle goes with a SLOW one, at once from two connections: their block is shared."""
    for i in range(120):
        fast = client.produce(FAST, 0, [Message(rng.randbytes(rng.randint(5, 40)), b"key-%d" % rng.randrange(10),
                                                1000 + i) for _ in range(rng.randint(1, 6))])
        if i % 6 == 0:
            await asyncio.gather(fast, other.produce(SLOW, 0, [Message(rng.randbytes(40), None, 1000 + i)
                                                               for _ in range(5)]))
        else:
            await fast


def topic_of(object_key: str) -> str | None:
    for parse in (keys.parse_segment_key, keys.parse_segment_index_key):
        if (found := parse(object_key)) is not None:
            return found.topic
    if (topic := keys.parse_topic_key(object_key)) is not None:
        return topic
    if (start := keys.parse_partition_start_key(object_key)) is not None:
        return start[0]
    return None


def block_shares(s3_admin, bucket: str, object_key: str) -> dict[str, float]:
    """The topics of a block and their share of it (run bytes), from its footer, read past the proxy."""
    key = f"{PREFIX}/{object_key}"
    size = s3_admin.head_object(Bucket=bucket, Key=key)["ContentLength"]
    tail = s3_admin.get_object(Bucket=bucket, Key=key, Range=f"bytes={max(0, size - 65536)}-{size - 1}")["Body"].read()
    assert block_tail_bytes(tail) <= len(tail)
    runs = read_block_footer(tail, size)
    total = sum(run.length_bytes for run in runs)
    shares: dict[str, float] = defaultdict(float)
    for run in runs:
        shares[run.topic] += run.length_bytes / total
    return shares


@pytest.fixture
def make_app(tmp_path, s3_endpoint, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)

    async def make() -> App:
        settings = local_settings(tmp_path / "data", catalog_url=f"sqlite:///{tmp_path}/catalog.db",
                                  store_url=f"s3://{s3_bucket}/{PREFIX}", s3_path_style=True, shutdown_timeout_s=5.0,
                                  http_listen="127.0.0.1:0", block_max_age_ms=50,
                                  # A lone produce is acked after 5 ms, not 50; the pairs sent at once still share.
                                  block_linger_ms=5, block_max_puts_per_s=1000.0)
        app = App(settings, tier=tiering_service(ack_timeout_s=10.0))
        await app.start()
        return app

    return make


async def test_the_meter_counts_what_the_bucket_saw_per_topic_and_operation(make_app, tmp_path, s3_faults, s3_bucket,
                                                                           s3_admin):
    app = await make_app()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as client, \
                await Client.connect("127.0.0.1", app.broker.port) as other:
            await client.create_topic(FAST, 1, "log.cleanup.policy=cleanup\n" + SMALL_SEGMENTS)
            await client.create_topic(SLOW, 1, SMALL_SEGMENTS)
            await produce(client, other, random.Random(25))

        def copied() -> bool:
            status = [app.tier.partition_status(TopicPartition(topic, 0)) for topic in (FAST, SLOW)]
            return all(s["pending_segments"] == 0 and s["highest_copied_seq"] for s in status)

        await eventually(copied, timeout_s=60, what="the sealed segments to be copied")
        compact = await asyncio.to_thread(run_cli, "topic", "compact", FAST, "-P", f"127.0.0.1:{app.http.port}")
        assert compact.returncode == 0, compact.stderr
        families = await scrape(app.http.port)
        assert families.value("tiered_object_requests_total", topic=SLOW, op="put") > 0
        assert families.value("tiered_object_bytes_total", topic=FAST, direction="written") > 0
        assert families.kind("tiered_object_bytes_stored") == "gauge"
    finally:
        await app.stop()
    first_meter = app.tier.store.meter

    shutil.rmtree(tmp_path / "data")  # a lost disk: every seq of SLOW is now read from the bucket
    replayed = make_app()
    app = await replayed
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as client:
            messages = [m async for m in client.drain(SLOW, 0, 0)]
        assert len(messages) == 100
    finally:
        await app.stop()
    second_meter = app.tier.store.meter

    counted: dict[tuple[str, str], float] = defaultdict(float)
    for meter in (first_meter, second_meter):
        for key, n in meter.requests.items():
            counted[key] += n
    assert not [key for key in counted if key[0] == UNATTRIBUTED]

    seen: dict[tuple[str, str], float] = defaultdict(float)
    per_op: dict[str, int] = defaultdict(int)
    for method, path in s3_faults.requests:
        object_key, op = request_op(method, path, s3_bucket, PREFIX)
        per_op[op] += 1
        if keys.parse_block_key(object_key) is not None:
            if op == "put":
                for topic, share in block_shares(s3_admin, s3_bucket, object_key).items():
                    seen[topic, op] += share
            else:  # the only block reads are the replay's
                seen[SLOW if op == "get" else CATALOG_WIDE, op] += 1
        elif object_key == "":
            seen[CATALOG_WIDE, op] += 1
        else:
            topic = topic_of(object_key)
            assert topic is not None, f"an object of no topic: {method} {path}"
            seen[topic, op] += 1

    # The load did what it says: blocks shared by both topics, history read back from the bucket.
    assert seen[SLOW, "get"] >= 3 and seen[FAST, "put"] > seen[SLOW, "put"] > 0
    assert any(not float(n).is_integer() for n in seen.values())
    far = {key: (counted.get(key, 0.0), seen.get(key, 0.0)) for key in set(counted) | set(seen)
           if abs(counted.get(key, 0.0) - seen.get(key, 0.0)) > 1}
    assert far == {}, f"(topic, op): (meter, bucket) {far}"
    for op, n in per_op.items():  # the shares of every request add up to one request
        assert sum(v for (_, o), v in counted.items() if o == op) == pytest.approx(n)

    # `tiered cost` sums what both brokers flushed at their stop.
    cost = await asyncio.to_thread(run_cli, "cost", "--catalog", f"sqlite:///{tmp_path}/catalog.db", "--json",
                                   "--since", "2h")
    assert cost.returncode == 0, cost.stderr
    rows = {row["topic"]: row for row in json.loads(cost.stdout)["topics"]}
    for topic in (FAST, SLOW):
        puts = sum(counted.get((topic, op), 0.0) for op in ("put", "copy", "list", "part", "multipart"))
        assert rows[topic]["puts"] == pytest.approx(puts)
        assert rows[topic]["gets"] == pytest.approx(counted.get((topic, "get"), 0.0) + counted.get((topic, "head"),
                                                                                                     0.0))
        assert rows[topic]["gib_ingested"] > 0 and rows[topic]["gib_stored"] > 0
    assert rows[FAST]["gib_ingested"] > rows[SLOW]["gib_ingested"]
    assert rows["total"]["puts"] == pytest.approx(sum(n for (_, op), n in counted.items()
                                                      if op in ("put", "copy", "list", "part", "multipart")))
