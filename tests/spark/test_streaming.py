"""`spark.readStream.format("tiered")`: history first, then what the catalog commits afterwards, exactly once."""

from __future__ import annotations

import random

import pytest

from tiered.catalog import Catalog
from tiered.catalog import topics as catalog_topics
from tiered.catalog.migrate import upgrade

from tests.spark.history import FileObjects, build_history, mixed_bundles

TOPIC = "stream"


def run_available_now(spark, url: str, objects: FileObjects, out: str, checkpoint: str, **options) -> None:
    reader = (spark.readStream.format("tiered").option("catalog", url).option("store", objects.url)
              .option("topic", TOPIC))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    query = (reader.load().writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert not query.isActive
    assert query.exception() is None


def written(spark, out: str) -> list[tuple]:
    from pyspark.sql import functions as F

    df = spark.read.parquet(out).select("partition", "seq", F.unix_millis("timestamp").alias("ts"), "key", "value")
    return sorted((r.partition, r.seq, r.ts, None if r.key is None else bytes(r.key), bytes(r.value))
                  for r in df.collect())


def expected(histories) -> list[tuple]:
    return sorted((h.partition, m.seq, m.ts_ms, m.key, m.value) for h in histories for m in h.messages)


def test_a_stream_reads_history_then_new_runs_and_segments_after_a_restart(spark, tmp_path):
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    upgrade(url)
    cat = Catalog.open(url)
    catalog_topics.create_topic(cat, TOPIC, 2)
    objects = FileObjects(tmp_path / "objects")
    histories = [build_history(cat, objects, TOPIC, p, tmp_path / f"log{p}", seed=20 + p, segments=2, tail_runs=2)
                 for p in (0, 1)]
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    try:
        run_available_now(spark, url, objects, out, checkpoint)
        assert written(spark, out) == expected(histories)

        # More arrives: partition 0 tiers its tail into a segment and commits new runs; partition 1 only runs.
        rng = random.Random(5)
        for history in histories:
            mixed_bundles(rng, history, 6)
            history.commit_run()
        histories[0].tier_segment()
        mixed_bundles(rng, histories[0], 4)
        histories[0].commit_run()

        run_available_now(spark, url, objects, out, checkpoint)  # restarts from the checkpointed offsets
        assert written(spark, out) == expected(histories)  # each message once
    finally:
        for h in histories:
            h.close()
        cat.close()


def test_a_stream_starts_at_starting_seq_and_refuses_an_end(spark, tmp_path):
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    upgrade(url)
    cat = Catalog.open(url)
    catalog_topics.create_topic(cat, TOPIC, 2)
    objects = FileObjects(tmp_path / "objects")
    history = build_history(cat, objects, TOPIC, 1, tmp_path / "log1", seed=3, segments=1, tail_runs=1)
    start = history.messages[len(history.messages) // 2].seq
    try:
        out = str(tmp_path / "out")
        run_available_now(spark, url, objects, out, str(tmp_path / "ck"), partitions="1", startingSeq=start)
        assert written(spark, out) == sorted((1, m.seq, m.ts_ms, m.key, m.value) for m in history.messages
                                             if m.seq >= start)
        with pytest.raises(Exception, match="endingSeq"):
            run_available_now(spark, url, objects, str(tmp_path / "o2"), str(tmp_path / "ck2"), endingSeq=5)
    finally:
        history.close()
        cat.close()
