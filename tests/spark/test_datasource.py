"""`spark.read.format("tiered")` on the shared local[2] session: options, time ranges, filter pushdown, errors.

The history is built as a broker leaves it (tests/spark/history.py) on SQLite with a file store; the end-to-end test
against a running broker is in test_broker_replay.py.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from tiered.catalog import Catalog
from tiered.catalog import topics as catalog_topics

from tests.spark.history import FileObjects, build_history

TOPIC = "events"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two partitions of mixed history, three tiered segments and a tail of runs each. Module-scoped: built once."""
    from tiered.catalog.migrate import upgrade

    root = tmp_path_factory.mktemp("spark-world")
    url = f"sqlite:///{root / 'catalog.db'}"
    upgrade(url)
    cat = Catalog.open(url)
    catalog_topics.create_topic(cat, TOPIC, 2)
    objects = FileObjects(root / "objects")
    histories = [build_history(cat, objects, TOPIC, p, root / f"log{p}", seed=10 + p) for p in (0, 1)]
    yield url, objects, histories
    for h in histories:
        h.close()
    cat.close()


def load(spark, url, objects, **options):
    reader = spark.read.format("tiered").option("catalog", url).option("store", objects.url).option("topic", TOPIC)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def rows(df) -> list[tuple]:
    """(partition, seq, ts_ms, key, value) sorted: timestamps compared as epoch milliseconds, exactly."""
    from pyspark.sql import functions as F

    picked = df.select("partition", "seq", F.unix_millis("timestamp").alias("ts_ms"), "key", "value", "topic")
    out = [(r.partition, r.seq, r.ts_ms, None if r.key is None else bytes(r.key), bytes(r.value))
           for r in picked.collect() if r.topic == TOPIC]
    return sorted(out)


def expected(histories, partitions=(0, 1), keep=lambda m: True) -> list[tuple]:
    return sorted((p, m.seq, m.ts_ms, m.key, m.value) for p in partitions for m in histories[p].messages if keep(m))


def test_schema_matches_spark_kafka_source_names(spark, world):
    url, objects, _ = world
    df = load(spark, url, objects)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("topic", "string"), ("partition", "int"), ("seq", "bigint"), ("timestamp", "timestamp"),
        ("key", "binary"), ("value", "binary"),
    ]


def test_the_whole_topic_and_a_seq_range_of_one_partition(spark, world):
    url, objects, histories = world
    assert rows(load(spark, url, objects, maxSplitBytes="16KiB")) == expected(histories)
    messages = histories[1].messages
    first, last = messages[40].seq, messages[-30].seq
    got = rows(load(spark, url, objects, partitions="1", startingSeq=first, endingSeq=last))
    assert got == expected(histories, [1], lambda m: first <= m.seq <= last)


def test_time_ranges_return_exactly_the_messages_inside_them(spark, world):
    url, objects, histories = world
    stamps = sorted(m.ts_ms for h in histories for m in h.messages)
    start, end = stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3]
    got = rows(load(spark, url, objects, startingTimestamp=start, endingTimestamp=end))
    assert got == expected(histories, keep=lambda m: start <= m.ts_ms < end)
    iso_start = datetime.fromtimestamp(start / 1000, timezone.utc).isoformat()
    got_iso = rows(load(spark, url, objects, startingTimestamp=iso_start, endingTimestamp=end))
    assert got_iso == got


def test_pushed_filters_on_partition_seq_and_timestamp_are_exact(spark, world):
    url, objects, histories = world
    messages = histories[0].messages
    low, high = messages[25].seq, messages[-10].seq
    ts = sorted(m.ts_ms for m in messages)[len(messages) // 2]
    moment = datetime.fromtimestamp(ts / 1000, timezone.utc)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = load(spark, url, objects, filterPushdown="true")
        query = df.where(f"partition IN (0, 5) AND seq > {low} AND seq <= {high}").where(df.timestamp >= moment)
        got = rows(query)
        plan = query._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    assert got == expected(histories, [0], lambda m: low < m.seq <= high and m.ts_ms >= ts)
    # Exactly applied by the source: Spark keeps no Filter node over the scan for them.
    assert not re.search(r"\bFilter\b", plan), plan


def test_unknown_topics_and_partitions_are_named(spark, world):
    """Option parsing itself is tested without Spark (test_options.py); these need the catalog."""
    url, objects, _ = world
    with pytest.raises(Exception, match="no partition 9"):
        load(spark, url, objects, partitions="0,9").collect()
    with pytest.raises(Exception, match="not in the catalog"):
        spark.read.format("tiered").option("catalog", url).option("store", objects.url).option("topic", "nope") \
            .load().collect()
