"""End to end: a real broker (PostgreSQL catalog, S3 through moto) takes plain, sparse (ProduceWithSeqnum) and snappy
bundles, rolls small segments and copies them; the Spark replay of the bucket equals a consume through the broker."""

from __future__ import annotations

import asyncio
import random
import time


from tiered.catalog import Catalog
from tiered.catalog import segments as catalog_segments
from tiered.client import Client
from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, Message
from tiered.server.app import App
from tiered.spark.listing import plan_topic
from tiered.spark.planning import RunPiece, SegmentPiece

from tests.support.broker import local_settings

TOPIC = "mixed"
PARTITIONS = 2
T0_MS = 1_760_000_000_000
CONFIG = {"log.segment.bytes": "6000", "log.index.interval.bytes": "256"}


async def produce_mixed(client: Client, partition: int, rounds: int, seed: int) -> None:
    """Plain, snappy and sparse bundles in turn, keyed or not, timestamps moving forward unevenly."""
    rng = random.Random(seed)
    last = 0
    for i in range(rounds):
        kind = ("plain", "snappy", "sparse", "plain")[i % 4]
        n = rng.randint(600, 700) if kind == "snappy" else rng.randint(1, 12)
        messages = []
        # A sparse bundle may jump ahead of the previous one: gaps between bundles (and so between segments) too.
        seq = last + 1 + (rng.randint(0, 40) if kind == "sparse" else 0)
        for j in range(n):
            ts = T0_MS + i * 1000 + rng.randint(0, 1500)
            key = None if rng.random() < 0.3 else b"user-%d" % rng.randint(0, 50)
            value = b"%s-%d-%d:" % (kind.encode(), i, j) * rng.randint(1, 6)
            messages.append(Message(value, key, ts, seq))
            seq += rng.randint(1, 3)
        if kind == "sparse":
            await client.produce_with_seqnum(TOPIC, partition, messages)
            last = messages[-1].seq
        else:
            await client.produce(TOPIC, partition, messages, codec=CODEC_SNAPPY if kind == "snappy" else CODEC_NONE)
            last += n


async def wait_for_copies(app: App, cat: Catalog, timeout_s: float = 30.0) -> None:
    """Until the copier has copied every segment the broker sealed so far (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = True
        for p in range(PARTITIONS):
            sealed = app.broker.registry.get(TOPIC, p).log.segments
            copied = await asyncio.to_thread(catalog_segments.highest_copied_seq, cat, TOPIC, p)
            done &= bool(sealed) and copied >= sealed[-1].last
        if done:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the segment copier did not copy the sealed segments in time")


def spark_rows(spark, catalog_url: str, store_url: str, **options) -> list[tuple]:
    from pyspark.sql import functions as F

    reader = (spark.read.format("tiered").option("catalog", catalog_url).option("store", store_url)
              .option("topic", TOPIC).option("s3PathStyle", "true").option("maxSplitBytes", "8KiB"))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    df = reader.load().select("partition", "seq", F.unix_millis("timestamp").alias("ts"), "key", "value")
    return sorted((r.partition, r.seq, r.ts, None if r.key is None else bytes(r.key), bytes(r.value))
                  for r in df.collect())


async def consumed(client: Client, partition: int, first: int = 0, last: int | None = None) -> list[tuple]:
    return [(partition, m.seq, m.ts_ms, m.key, m.value)
            async for m in client.drain(TOPIC, partition, first, last, fetch_bytes=64 << 10)]


async def test_spark_replay_equals_a_consume_through_the_broker(spark, pg_url, s3_endpoint, s3_bucket, monkeypatch,
                                                                 tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    store_url = f"s3://{s3_bucket}/tiered"
    settings = local_settings(tmp_path / "data", catalog_url=pg_url, store_url=store_url, s3_path_style=True,
                              block_max_age_ms=5)
    app = App(settings)
    await app.start()
    cat = Catalog.open(pg_url)
    try:
        client = await Client.connect("127.0.0.1", app.broker.port)
        async with client:
            await client.create_topic(TOPIC, PARTITIONS, CONFIG)
            await asyncio.gather(*(produce_mixed(client, p, 24, seed=p) for p in range(PARTITIONS)))
            await wait_for_copies(app, cat)
            # The history spans remote segments and block runs (the active segment's tail at least).
            plans = await asyncio.to_thread(plan_topic, cat, TOPIC)
            for plan in plans:
                kinds = {type(piece) for split in plan.splits for piece in split.pieces}
                assert kinds == {SegmentPiece, RunPiece}, plan.partition

            # Both consumes first: Spark runs for a while, and the broker closes idle connections.
            everything = [row for p in range(PARTITIONS) for row in await consumed(client, p)]
            middle = [row for row in everything if row[0] == 1]
            first, last = middle[len(middle) // 4][1], middle[-len(middle) // 8][1]
            expected_range = await consumed(client, 1, first, last)
        assert len(everything) > 3000
        assert await asyncio.to_thread(spark_rows, spark, pg_url, store_url) == sorted(everything)
        got = await asyncio.to_thread(spark_rows, spark, pg_url, store_url, partitions="1", startingSeq=first,
                                      endingSeq=last)
        assert got == expected_range
    finally:
        cat.close()
        await app.stop()
