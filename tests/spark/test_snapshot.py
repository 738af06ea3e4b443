"""The latest value per key (tiered.spark.snapshot) against the reference model (tests/support/compaction.py), on
seeded random workloads with keys, tombstones and keyless messages (no key, and an empty one), plain, snappy and
sparse bundles. Each topic's three partitions hold the same kind of history read three ways: uncompacted; compacted
by local passes whose outputs then replaced the bucket's segments; compacted from the bucket alone (a leader with an
empty disk). Each has a tail of block runs above its copied segments, never compacted. A compaction removes only
messages that are not the latest of their key, so every partition's snapshot is the model's over everything ever
appended to it; up to a seq above the compacted range, the model's over the messages up to that seq.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pyarrow.parquet as pq
import pytest

from tiered.catalog import Catalog
from tiered.catalog import topics as catalog_topics
from tiered.catalog.check import check_partition
from tiered.catalog.migrate import upgrade
from tiered.cli.main import main
from tiered.protocol.bundle import Message
from tiered.spark.snapshot import LatestPerKey
from tiered.storage.compaction import compact_partition
from tiered.storage.partition_log import PartitionLog
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.compaction.remote_compaction import RemoteCompactor
from tiered.tiering.objects.store import open_store

from tests.spark.history import BROKER_ID, FileObjects, PartitionHistory, append_compactable
from tests.support.clock import ManualClock
from tests.support.compaction import latest_per_key

NOW_S = 1_800_000_000
RETENTION_S = 100
SEEDS = (1, 2, 3)
UNCOMPACTED, FROM_LOCAL, FROM_BUCKET = 0, 1, 2
TAIL_BUNDLES = 12  # the last bundles stay in block runs


def topic(seed: int) -> str:
    return f"users-{seed}"


def compacted_config(log: PartitionLog):
    return replace(log.config, log_cleanup_policy="cleanup", log_segment_bytes=700,
                   log_cleaner_delete_retention_secs=RETENTION_S)


async def compact(history: PartitionHistory, store, acat, workdir, how: int) -> None:
    """Two passes, the second past the tombstones' retention (so some are dropped), as `how` says."""
    plog = history.log
    plog.reconfigure(compacted_config(plog))
    if how == FROM_BUCKET:
        history.close()
        plog = PartitionLog.open(str(workdir / f"new-leader-{history.partition}"), compacted_config(history.log))
    for now_s in (NOW_S, NOW_S + 2 * RETENTION_S):
        if how == FROM_LOCAL:
            assert compact_partition(plog, now_s, force=True).groups or now_s > NOW_S
        compactor = RemoteCompactor(store, acat, broker_id=BROKER_ID, workdir=str(workdir / "work"),
                                    grace=timedelta(minutes=10), clock=ManualClock(now_s * 1000.0))
        report = await compactor.compact(history.topic, history.partition, plog, history.epoch, force=True)
        assert report.stopped is None and (report.groups or now_s > NOW_S)
    if how == FROM_BUCKET:
        plog.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Per seed, a topic of three partitions (UNCOMPACTED, FROM_LOCAL, FROM_BUCKET) on SQLite and a file store."""
    root = tmp_path_factory.mktemp("snapshot-world")
    url = f"sqlite:///{root / 'catalog.db'}"
    upgrade(url)
    cat = Catalog.open(url)
    objects = FileObjects(root / "objects")
    store, acat = open_store(objects.url), AsyncCatalog(cat)
    histories: dict[str, list[PartitionHistory]] = {}
    try:
        for seed in SEEDS:
            catalog_topics.create_topic(cat, topic(seed), 3)
            parts = histories[topic(seed)] = []
            for partition in (UNCOMPACTED, FROM_LOCAL, FROM_BUCKET):
                history = PartitionHistory(cat, objects, topic(seed), partition, root / f"log-{seed}-{partition}")
                append_compactable(history, seed, tail_bundles=TAIL_BUNDLES)
                if partition != UNCOMPACTED:
                    asyncio.run(compact(history, store, acat, root, partition))
                assert check_partition(cat, topic(seed), partition).problems == []
                parts.append(history)
        yield url, objects, histories
    finally:
        acat.shutdown()
        for parts in histories.values():
            for h in parts:
                h.close()
        cat.close()


def snapshot_rows(histories, partitions=(UNCOMPACTED, FROM_LOCAL, FROM_BUCKET), last_seq=None) -> list[tuple]:
    out = []
    for p in partitions:
        messages = [m for m in histories[p].messages if last_seq is None or m.seq <= last_seq]
        out += [(p, m.seq, m.ts_ms, m.key, m.value) for m in latest_per_key(messages)]
    return out


def readable(url, objects, name: str, partition: int) -> list[Message]:
    """Every message a plain replay of the partition reads."""
    from tiered.spark.execution import split_messages
    from tiered.spark.listing import plan_read
    from tiered.spark.objects import open_range_reader
    from tiered.spark.options import ReadOptions

    options = ReadOptions.parse({"catalog": url, "store": objects.url, "topic": name, "partitions": str(partition)})
    reader = open_range_reader(objects.url)
    return [m for split in plan_read(options) for m in split_messages(reader, split)]


def test_the_histories_hold_what_a_snapshot_must_handle(world):
    """The workloads are not degenerate: the bucket of the compacted partitions lost messages (tombstones among
    them), and the snapshot drops tombstoned keys while keeping keyless messages of both kinds."""
    url, objects, histories = world
    for name, parts in histories.items():
        for p in (FROM_LOCAL, FROM_BUCKET):
            everything = [(m.seq, m.key, m.value) for m in parts[p].messages]
            read = [(m.seq, m.key, m.value) for m in readable(url, objects, name, p)]
            assert set(read) < set(everything) and len(read) < len(everything) * 0.6
            assert any(key and not value for _, key, value in set(everything) - set(read))
        everything = parts[UNCOMPACTED].messages
        snapshot = latest_per_key(everything)
        assert any(m.key is None for m in snapshot) and any(m.key == b"" for m in snapshot)
        tombstoned = {m.key for m in everything if m.key} - {m.key for m in snapshot if m.key}
        assert tombstoned and len(snapshot) < len(everything) / 2
        assert any(r.segments for r in parts) and all(r.runs for r in parts)


# --------------------------------------------------------------------------------------------- tiered replay


def replay_parquet(url, objects, name: str, dest, *flags: str) -> list[tuple]:
    assert main(["replay", name, "--catalog", url, "--store", objects.url, "--parquet", str(dest),
                 "--max-split-bytes", "4KiB", "--latest-per-key", *flags]) == 0
    out = []
    for f in sorted(dest.iterdir()):
        t = pq.read_table(f)
        micros = t.column("timestamp").cast("int64").to_pylist()
        out += [(p, s, us // 1000, k, v) for p, s, us, k, v in zip(
            t.column("partition").to_pylist(), t.column("seq").to_pylist(), micros, t.column("key").to_pylist(),
            t.column("value").to_pylist())]
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_replay_latest_per_key_equals_the_model(world, tmp_path, capsys, monkeypatch, seed):
    url, objects, histories = world
    monkeypatch.setattr(LatestPerKey, "FOLD_ROWS", seed)  # the state folded every few batches, not only at the end
    parts = histories[topic(seed)]
    # File names sort in (partition, seq) order, and each partition's messages come out in seq order.
    assert replay_parquet(url, objects, topic(seed), tmp_path / "all") == snapshot_rows(parts)
    assert "(latest per key)" in capsys.readouterr().err
    # As of a seq in the uncompacted tail of each partition: the model over the messages up to it.
    for p in (UNCOMPACTED, FROM_LOCAL, FROM_BUCKET):
        tail = [m.seq for m in parts[p].messages if m.seq > parts[p].segments[-1].last_seq]
        last = tail[len(tail) // 2]
        got = replay_parquet(url, objects, topic(seed), tmp_path / f"p{p}", "-P", str(p), "--ending-seq", str(last))
        assert got == snapshot_rows(parts, [p], last)


async def test_replay_latest_per_key_into_a_broker_keeping_seqs(world, tmp_path):
    """The snapshot produced with ProduceWithSeqnum: the copy holds exactly the model's messages, at their seqs."""
    from tiered.client import Client
    from tiered.server.app import App

    from tests.support.broker import local_settings

    url, objects, histories = world
    parts = histories[topic(SEEDS[1])]
    app = App(local_settings(tmp_path / "target"), local_only=True)
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as client:
            await client.create_topic("snapshot", 3)
        assert await asyncio.to_thread(main, [
            "replay", topic(SEEDS[1]), "--catalog", url, "--store", objects.url, "--latest-per-key", "--keep-seqs",
            "--to-broker", f"127.0.0.1:{app.broker.port}", "--to-topic", "snapshot", "--bundle-size", "7",
        ]) == 0
        async with await Client.connect("127.0.0.1", app.broker.port) as client:
            copied = [(p, m.seq, m.ts_ms, m.key, m.value)
                      for p in range(3) async for m in client.drain("snapshot", p, 0)]
        assert copied == snapshot_rows(parts)
    finally:
        await app.stop()


@pytest.mark.parametrize("fold_rows", [1, LatestPerKey.FOLD_ROWS])
def test_the_second_pass_reads_only_splits_holding_something_kept(monkeypatch, fold_rows):
    """A split whose messages were all superseded or deleted, and which holds no keyless one, is not read again;
    the same whether the state is folded after every batch or once at the end."""
    import pyarrow as pa

    from tiered.spark.decoding import SCHEMA

    def batch(rows):
        return pa.RecordBatch.from_pylist(
            [{"topic": "t", "partition": 0, "seq": s, "timestamp": None, "key": k, "value": v} for s, k, v in rows],
            SCHEMA)

    monkeypatch.setattr(LatestPerKey, "FOLD_ROWS", fold_rows)
    rule = LatestPerKey()
    rule.learn(0, batch([(1, b"a", b"1"), (2, b"b", b"1"), (3, b"", b"")]))
    rule.learn(1, batch([(5, b"a", b"2")]))
    rule.learn(2, batch([(9, b"b", b""), (10, b"c", b"3")]))
    rule.learn(3, batch([(12, b"c", b"4"), (13, b"d", b"5"), (14, b"e", b"")]))
    rule.finish()
    assert rule.to_read_again() == [0, 1, 3]
    kept = rule.filter(batch([(9, b"b", b""), (10, b"c", b"3"), (11, None, b"x"), (12, b"c", b"4"), (14, b"e", b"")]))
    assert kept.column(2).to_pylist() == [11, 12]
    assert [rule.keeps(seq, key) for seq, key in ((3, b""), (5, b"a"), (9, b"b"), (10, b"c"), (13, b"d"))] == [
        True, True, False, False, True]


# --------------------------------------------------------------------------------------------------- Spark


def test_spark_latest_per_key_equals_the_model(spark, world):
    from pyspark.sql import functions as F

    from tiered.spark.snapshot import latest_per_key as spark_latest_per_key

    url, objects, histories = world
    parts = histories[topic(SEEDS[0])]

    def snapshot(**options) -> list[tuple]:
        reader = spark.read.format("tiered").option("catalog", url).option("store", objects.url) \
            .option("topic", topic(SEEDS[0])).option("maxSplitBytes", "4KiB")
        for name, value in options.items():
            reader = reader.option(name, str(value))
        df = spark_latest_per_key(reader.load())
        assert df.columns == ["topic", "partition", "seq", "timestamp", "key", "value"]
        picked = df.select("partition", "seq", F.unix_millis("timestamp").alias("ts_ms"), "key", "value")
        return sorted((r.partition, r.seq, r.ts_ms, None if r.key is None else bytes(r.key), bytes(r.value))
                      for r in picked.collect())

    assert snapshot() == sorted(snapshot_rows(parts))
    messages = parts[UNCOMPACTED].messages
    last = messages[len(messages) // 2].seq
    assert snapshot(partitions=UNCOMPACTED, endingSeq=last) == sorted(snapshot_rows(parts, [UNCOMPACTED], last))

