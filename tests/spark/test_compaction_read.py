"""A Spark read across a remote compaction swap (issue 15): a read planned before the swap and executed after it
reads exactly the history it planned, from the objects the swap replaced (they wait for the deletion grace period).

What fixes a read's history is the plan, not `load()`: `load()` only asks for the schema, and every action plans
afresh from the catalog when Spark builds the physical plan. `DataFrame.rdd` builds it (Spark calls the reader's
`partitions()`, tiered.spark.listing.plan_read) without running a task, so the test can put the swap between the
plan and the tasks. The listing that plans pages through the catalog's segments; a swap between two of its pages
must not hide seqs from the plan either. Partitions are compacted from the bucket alone (a new leader with an empty
disk), one pass with tombstones kept; the tail of block runs above the copied segments is never compacted.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from tiered.catalog import Catalog
from tiered.catalog import locate
from tiered.catalog import segments as catalog_segments
from tiered.catalog import topics as catalog_topics
from tiered.catalog.check import check_partition
from tiered.catalog.migrate import upgrade
from tiered.protocol.bundle import Message
from tiered.spark import listing
from tiered.spark.execution import split_messages
from tiered.spark.listing import plan_read
from tiered.spark.objects import open_range_reader
from tiered.spark.options import ReadOptions
from tiered.storage.partition_log import PartitionLog
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.compaction.remote_compaction import RemoteCompactor
from tiered.tiering.objects.store import open_store

from tests.spark.history import BROKER_ID, FileObjects, PartitionHistory, append_compactable
from tests.support.clock import ManualClock
from tests.support.compaction import Model

TOPIC = "accounts"
PARTITIONS = (0, 1)
NOW_S = 1_800_000_000
RETENTION_S = 100
Row = tuple[int, int, int, bytes | None, bytes]  # (partition, seq, ts_ms, key, value)


@pytest.fixture
def world(tmp_path):
    """Two partitions of keyed history: tiered segments, then a tail of block runs. On SQLite and a file store."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    upgrade(url)
    cat = Catalog.open(url)
    catalog_topics.create_topic(cat, TOPIC, len(PARTITIONS))
    objects = FileObjects(tmp_path / "objects")
    histories = []
    for p in PARTITIONS:
        history = PartitionHistory(cat, objects, TOPIC, p, tmp_path / f"log-{p}")
        append_compactable(history, seed=40 + p, tail_bundles=8)
        history.close()  # the compacting leader's disk holds none of it
        histories.append(history)
    acat = AsyncCatalog(cat)
    try:
        yield cat, acat, url, objects, histories
    finally:
        acat.shutdown()
        cat.close()


def compact_from_bucket(acat, objects: FileObjects, history: PartitionHistory, workdir: Path,
                        segment_bytes: int = 700) -> None:
    """One forced pass of a new leader with an empty disk: every copied segment is compacted from the bucket, into
    segments of about `segment_bytes` (large: the whole range merged into one)."""
    config = replace(history.log.config, log_cleanup_policy="cleanup", log_segment_bytes=segment_bytes,
                     log_cleaner_delete_retention_secs=RETENTION_S)
    plog = PartitionLog.open(str(workdir / f"new-leader-{history.partition}"), config)
    compactor = RemoteCompactor(open_store(objects.url), acat, broker_id=BROKER_ID, workdir=str(workdir / "work"),
                                grace=timedelta(minutes=10), clock=ManualClock(NOW_S * 1000.0))
    try:
        report = asyncio.run(compactor.compact(TOPIC, history.partition, plog, history.epoch, force=True))
    finally:
        plog.close()
    assert report.groups and report.stopped is None


def compacted(history: PartitionHistory) -> list[Message]:
    """The reference model's pass over the copied segments, then the tail of runs as it was."""
    copied = history.segments[-1].last_seq
    sealed = [m for m in history.messages if m.seq <= copied]
    return Model(RETENTION_S * 1000).compact(sealed, NOW_S * 1000) + [m for m in history.messages if m.seq > copied]


def as_rows(histories: dict[int, list[Message]]) -> list[Row]:
    return [(p, m.seq, m.ts_ms, m.key, m.value) for p, messages in sorted(histories.items()) for m in messages]


def load(spark, url, objects):
    from pyspark.sql import functions as F

    df = (spark.read.format("tiered").option("catalog", url).option("store", objects.url).option("topic", TOPIC)
          .option("maxSplitBytes", "4KiB").load())
    return df.select("partition", "seq", F.unix_millis("timestamp").alias("ts_ms"), "key", "value")


def collected(rows) -> list[Row]:
    """Spark's rows as they came: splits in plan order ((partition, seq)), each split's rows in seq order."""
    return [(r.partition, r.seq, r.ts_ms, None if r.key is None else bytes(r.key), bytes(r.value)) for r in rows]


def test_a_read_planned_before_a_swap_reads_the_history_it_planned(spark, world, tmp_path):
    cat, acat, url, objects, histories = world
    before = as_rows({h.partition: h.messages for h in histories})
    after = as_rows({h.partition: compacted(h) for h in histories})
    assert len(after) < len(before) * 0.7  # the swap changes what a plan finds

    options = ReadOptions.parse({"catalog": url, "store": objects.url, "topic": TOPIC, "maxSplitBytes": "4KiB"})
    planned_keys = {piece.object_key for split in plan_read(options) for piece in split.pieces}
    not_planned = load(spark, url, objects)  # load() asks for the schema only
    planned = load(spark, url, objects).rdd  # the physical plan: Spark called partitions(), no task ran
    assert planned.getNumPartitions() > 2 * len(PARTITIONS)

    for history in histories:
        compact_from_bucket(acat, objects, history, tmp_path)
        assert check_partition(cat, TOPIC, history.partition).problems == []
    # The plan names segments the swaps replaced; they wait in the bucket for the grace period.
    readable = {row.object_key for p in PARTITIONS for row in catalog_segments.list_segments(cat, TOPIC, p)
                if row.state == "COPY_FINISHED"}
    replaced = {key for key in planned_keys if key.startswith("segments/") and key not in readable}
    assert replaced and all((objects.root / key).exists() for key in replaced)

    # Exactly the pre-compaction history: every seq once, in order, byte for byte.
    assert collected(planned.collect()) == before
    # A read planned after the swap, by a DataFrame loaded before it or after: the compacted history.
    assert collected(not_planned.collect()) == after
    assert collected(load(spark, url, objects).collect()) == after
    # Run again, the same plan reads the same history.
    assert collected(planned.collect()) == before


def test_a_swap_between_two_pages_of_the_segment_listing_hides_no_seq(world, tmp_path, monkeypatch):
    """Pages of two segments; after the first, a pass merges every copied segment into one, which begins below the
    first page's last segment. The listing reads all its pages in one snapshot (tiered.catalog.locate.locations), so
    the later pages do not see the swap: the plan reads exactly the history before it, every seq once, byte for byte,
    from the old objects (kept for the grace period)."""
    cat, acat, url, objects, histories = world
    history = histories[0]
    monkeypatch.setattr(listing, "FIRST_PAGE_ROWS", 2)
    monkeypatch.setattr(listing, "PAGE_ROWS", 2)
    real = locate._segments_from
    first_page: list = []

    def swap_after_the_first_page(*args):
        rows = real(*args)
        if not first_page and len(rows) == 2:
            first_page.extend(rows)
            compact_from_bucket(acat, objects, history, tmp_path, segment_bytes=1 << 20)
        return rows

    monkeypatch.setattr(locate, "_segments_from", swap_after_the_first_page)
    options = ReadOptions.parse({"catalog": url, "store": objects.url, "topic": TOPIC, "partitions": "0"})
    reader = open_range_reader(objects.url)
    got = [m for split in plan_read(options) for m in split_messages(reader, split)]

    assert len(first_page) == 2 and len(history.segments) > 3
    (merged,) = [row for row in catalog_segments.list_segments(cat, TOPIC, 0) if row.state == "COPY_FINISHED"]
    assert merged.base_seq <= first_page[-1].base_seq and merged.last_seq == history.segments[-1].last_seq
    assert check_partition(cat, TOPIC, 0).problems == []
    assert as_rows({0: got}) == as_rows({0: history.messages})  # the snapshot's history, whole
