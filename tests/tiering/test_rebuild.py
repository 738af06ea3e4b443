"""`tiered catalog rebuild`: the catalog reconstructed from the bucket alone matches the one the broker wrote, and a
broker on an empty disk serves the same history from it. Against moto's S3 server, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import select

from tiered.clock import SYSTEM_CLOCK
from tiered.catalog import Catalog, SegmentState
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog import topics as catalog_topics
from tiered.catalog.migrate import upgrade
from tiered.catalog.models import BlockModel, BlockRunModel, PartitionModel, SegmentModel, TopicModel
from tiered.cli.main import main as cli_main
from tiered.client import BoundaryError, Client
from tiered.protocol.bundle import Message, encode_bundle, encode_record
from tiered.server.app import App, tiering_service
from tiered.storage.topic_config import TopicConfig
from tiered.tiering.objects import keys
from tiered.catalog.blocks import RunMeta
from tiered.catalog.check import check_catalog
from tiered.metrics import Metrics
from tiered.tier_interface import RemoteChunk
from tiered.tiering.blocks.block_format import encode_block
from tiered.tiering.reads.remote_fetch import RemoteReader
from tiered.tiering.reads.run_reads import trim_chunk
from tiered.tiering.recovery.rebuild import UNKNOWN_MAX_TS_MS, CatalogNotEmpty, rebuild_catalog
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.segments.remote_retention import enforce_remote_retention
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.tiering.objects.store import open_store

from tests.support.broker import local_settings
from tests.support.postgres import TEMPLATE_DB
from tests.support.polling import eventually
from tests.tiering.test_remote_compaction import chunk_bytes
from tests.tiering.test_run_reads import as_version_2
from tiered.topic_partition import TopicPartition

SMALL_SEGMENTS = {"log.segment.bytes": "4k", "log.index.interval.bytes": "128"}
TS0 = 1_700_000_000_000


def value(topic: str, partition: int, i: int) -> bytes:
    return b"%s/%d/%05d-" % (topic.encode(), partition, i) + random.Random(i).randbytes(60)



def snapshot(url: str) -> dict[str, list[tuple]]:
    """What the catalog indexes, without ids, times and leadership (which a rebuild cannot and need not restore)."""
    cat = Catalog.open(url)
    try:
        with cat.read() as conn:
            def rows(query) -> list[tuple]:
                return sorted(tuple(r) for r in conn.execute(query))

            return {
                "topics": rows(select(TopicModel.name, TopicModel.partitions)),
                "partitions": rows(select(PartitionModel.topic, PartitionModel.partition, PartitionModel.first_available_seq,
                                          PartitionModel.hwmark_seq, PartitionModel.remote_bytes)),
                "blocks": rows(select(BlockModel.object_key, BlockModel.state, BlockModel.broker_id, BlockModel.size_bytes)),
                "runs": rows(
                    select(BlockModel.object_key, BlockRunModel.topic, BlockRunModel.partition, BlockRunModel.first_seq, BlockRunModel.last_seq,
                           BlockRunModel.position, BlockRunModel.length_bytes, BlockRunModel.messages, BlockRunModel.min_ts_ms,
                           BlockRunModel.max_ts_ms, BlockRunModel.from_seq, BlockRunModel.leader_epoch)
                    .join(BlockModel, BlockModel.block_id == BlockRunModel.block_id)
                ),
                "segments": rows(
                    select(SegmentModel.topic, SegmentModel.partition, SegmentModel.base_seq, SegmentModel.last_seq, SegmentModel.object_key,
                           SegmentModel.index_object_key, SegmentModel.size_bytes, SegmentModel.index_size_bytes, SegmentModel.min_ts_ms,
                           SegmentModel.max_ts_ms, SegmentModel.freeze_ts, SegmentModel.from_seq)
                    .where(SegmentModel.state == SegmentState.COPY_FINISHED)
                ),
            }
    finally:
        cat.close()


@pytest.fixture
def brokers(tmp_path, s3_endpoint, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)

    async def start(catalog_url: str, data_dir: Path) -> App:
        settings = local_settings(data_dir, catalog_url=catalog_url, store_url=f"s3://{s3_bucket}/p",
                                  s3_path_style=True, shutdown_timeout_s=3.0, block_max_age_ms=50,
                                  # Each durable produce waits 5 ms, not 50: what is sent at once still shares.
                                  block_linger_ms=5, block_max_puts_per_s=1000.0)
        app = App(settings, tier=tiering_service())
        await app.start()
        return app

    start.store_url = f"s3://{s3_bucket}/p"
    return start


def _catalog_urls(backend: str, request, tmp_path) -> tuple[str, str]:
    if backend == "postgresql":
        original = request.getfixturevalue("pg_url")  # also builds the migrated template
        return original, request.getfixturevalue("pg_cluster").create_database(template=TEMPLATE_DB)
    rebuilt = f"sqlite:///{tmp_path}/rebuilt.db"
    upgrade(rebuilt)
    return f"sqlite:///{tmp_path}/original.db", rebuilt


PRODUCED = {("orders", 0): 200, ("orders", 1): 120, ("events", 0): 30}


async def _produce_history(app: App) -> dict[tuple[str, int], list[bytes]]:
    history: dict[tuple[str, int], list[bytes]] = {key: [] for key in PRODUCED}
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("orders", 2, SMALL_SEGMENTS)
        await c.create_topic("events", 1)

        async def produce(topic: str, partition: int, count: int) -> None:
            for i in range(0, count, 5):
                batch = [Message(value(topic, partition, j), b"k", TS0 + j) for j in range(i, i + 5)]
                await c.produce(topic, partition, batch)
                history[(topic, partition)] += [m.value for m in batch]

        # The partitions concurrently, so that blocks hold runs of several partitions.
        await asyncio.gather(*(produce(t, p, count) for (t, p), count in PRODUCED.items()))
    copier = app.tier.remote.copier
    sealed = sum(len(app.broker.registry.get("orders", p).log.segments) for p in (0, 1))
    assert sealed >= 4
    await eventually(lambda: copier.pending == 0 and len(copier.copied) >= sealed, what="segments copied")
    return history


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_the_rebuilt_catalog_matches_the_original_and_serves_the_same_history(
    brokers, backend, request, tmp_path
):
    original_url, rebuilt_url = _catalog_urls(backend, request, tmp_path)
    app = await brokers(original_url, tmp_path / "data")
    history = await _produce_history(app)
    await app.stop()

    store = open_store(brokers.store_url, path_style=True)
    original = AsyncCatalog(Catalog.open(original_url))
    # Remote retention drops the oldest remote segment of orders/0: its first available seq moves on.
    expired = await enforce_remote_retention(store, original, "orders", 0, TopicConfig(remote_retention_bytes=1),
                                             datetime.now(timezone.utc), limit=1)
    assert len(expired.deleted) == 1
    original.close()
    before = snapshot(original_url)
    assert any(state == "deleting" for _, state, _, _ in before["blocks"])  # runs pruned below copied segments
    assert any(position > 0 for _, _, _, _, _, position, *_ in before["runs"])  # blocks of several runs
    assert {(t, p) for t, p, *_ in before["segments"]} == {("orders", 0), ("orders", 1)}
    first_available = {(t, p): first for t, p, first, _, _ in before["partitions"]}
    assert first_available[("orders", 0)] == expired.first_available_seq > 1

    rebuilt = Catalog.open(rebuilt_url)
    report = await rebuild_catalog(store, rebuilt, read_timestamps=True)
    rebuilt.close()
    await store.close()
    assert report.damaged == [] and report.foreign == [] and report.incomplete_segments == []
    assert report.runs_superseded == 0 and report.blocks_abandoned == 0
    assert report.blocks_emptied > 0 and report.segments == len(before["segments"])
    after = snapshot(rebuilt_url)
    for table in ("topics", "partitions", "blocks", "runs", "segments"):
        assert after[table] == before[table], table

    # A broker on the rebuilt catalog with an empty data dir serves every seq still available, from the bucket.
    app = await brokers(rebuilt_url, tmp_path / "empty")
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        assert sorted((t.name, t.partitions) for t in await c.discover_topics()) == [("events", 1), ("orders", 2)]
        for (topic, partition), values in history.items():
            first = first_available[(topic, partition)]
            got = [m async for m in c.drain(topic, partition, 0, fetch_bytes=1500)]
            assert [m.seq for m in got] == list(range(first, len(values) + 1)), (topic, partition)
            assert [m.value for m in got] == values[first - 1 :], (topic, partition)
        if first_available[("orders", 0)] > 1:
            with pytest.raises(BoundaryError) as below:
                await c.consume("orders", 0, 1)
            assert below.value.first_available == first_available[("orders", 0)]
        await c.produce("events", 0, [b"after the rebuild"])
        assert [m.value async for m in c.drain("events", 0, len(history[("events", 0)]) + 1)] == [b"after the rebuild"]
    await app.stop()


# --- a bucket with what a live catalog never holds: superseded, damaged, incomplete and foreign objects ----------


def _block(runs: list[tuple[str, int, int, int]]) -> bytes:
    encoded = []
    for topic, partition, first, last in runs:
        bundle = encode_bundle([Message(b"m%d" % s, None, TS0 + s) for s in range(first, last + 1)])
        encoded.append((RunMeta(topic, partition, first, first, last, last - first + 1, TS0 + first, TS0 + last, 0),
                        encode_record(bundle)))
    return encode_block(encoded)[0]


async def _messy_bucket(store) -> dict[str, str]:
    ids = keys.BlockIdClock()
    names: dict[str, str] = {}

    async def put_block(name: str, broker_id: int, ms: int, runs) -> None:
        names[name] = keys.block_key(broker_id, ids.next(ms))
        await store.put(names[name], _block(runs))

    # Oldest first. "old" had its t/0 run re-uploaded in "newer" (a crash between PUT and commit); "stale" holds
    # seqs a later leader reassigned in "newer": it keeps no run at all.
    await put_block("old", 1, 1_000, [("t", 0, 1, 5), ("t", 1, 1, 3)])
    await put_block("stale", 1, 2_000, [("t", 0, 6, 9)])
    await put_block("newer", 2, 3_000, [("t", 0, 1, 7)])
    await put_block("wide", 2, 4_000, [("wide", p, 1, 1) for p in range(80)])  # a footer past the first tail GET
    names["damaged"] = keys.block_key(2, ids.next(5_000))
    await store.put(names["damaged"], b"not a block" * 10)
    names["foreign"] = "blocks/README"
    await store.put(names["foreign"], b"notes")
    segment = keys.segment_key("s", 2, 1, 40, 1_700_000_000)
    await store.put(segment, b"s" * 700)
    await store.put(keys.segment_index_key("s", 2, 1, 40, 1_700_000_000), b"i" * 64)
    names["segment"] = segment
    names["lonely"] = keys.segment_key("s", 2, 41, 50, 1_700_000_100)  # its .index never arrived
    await store.put(names["lonely"], b"s" * 100)
    return names


@pytest.fixture(params=["s3", "local"])
def any_store(request, tmp_path):
    """Each object store backend in turn: moto's S3 server, and a local directory (which holds no connection)."""
    if request.param == "s3":
        return request.getfixturevalue("s3_store")
    return LocalObjectStore(tmp_path / "objects", fsync=False)


async def test_overlaps_are_resolved_newest_first_and_the_rest_reported(any_store, catalog_url):
    store = any_store
    names = await _messy_bucket(store)
    cat = Catalog.open(catalog_url)
    try:
        gets = store.counters.gets
        report = await rebuild_catalog(store, cat)
        assert store.counters.gets - gets == 6  # one tail GET per block, two for the wide footer; none for segments
        assert report.blocks == 3 and report.blocks_abandoned == 1 and report.runs_superseded == 2
        assert report.runs == 1 + 1 + 80 and report.segments == 1
        assert report.damaged[0].startswith(names["damaged"]) and len(report.damaged) == 1
        assert report.foreign == [names["foreign"]] and report.incomplete_segments == [names["lonely"]]

        runs = {p: [(r.first_seq, r.last_seq, r.object_key) for r in catalog_blocks.runs_for_range(cat, "t", p, 1, 10)]
                for p in (0, 1)}
        assert runs == {0: [(1, 7, names["newer"])], 1: [(1, 3, names["old"])]}
        states = {b.object_key: b.state for b in catalog_blocks.pending_blocks_older_than(
            cat, datetime.now(timezone.utc), 10)}
        assert states == {}  # nothing is left pending
        assert [b.object_key for b in catalog_blocks.blocks_to_sweep(cat, datetime(2100, 1, 1, tzinfo=timezone.utc),
                                                                     10)] == [names["stale"]]

        topics = {t.name: t.partitions for t in catalog_topics.list_topics(cat)}
        assert topics == {"t": 2, "wide": 80, "s": 3}  # the highest partition seen + 1
        states = {(s.topic, s.partition): (s.first_available_seq, s.hwmark_seq, s.leader_broker, s.leader_epoch)
                  for s in catalog_partitions.get_partition_states(cat)}
        assert states[("t", 0)] == (1, 7, None, 0) and states[("t", 1)] == (1, 3, None, 0)
        assert states[("s", 2)] == (1, 40, None, 0) and states[("s", 0)] == (0, 0, None, 0)
        segment = catalog_segments.find_remote_segment(cat, "s", 2, 1)
        assert (segment.object_key, segment.size_bytes, segment.index_size_bytes) == (names["segment"], 700, 64)
        assert (segment.min_ts_ms, segment.max_ts_ms, segment.leader_epoch) == (0, UNKNOWN_MAX_TS_MS, 0)
        assert segment.freeze_ts == datetime.fromtimestamp(1_700_000_000, timezone.utc)
        assert catalog_partitions.get_partition_states(cat, "s")[2].remote_bytes == 764

        with pytest.raises(CatalogNotEmpty):
            await rebuild_catalog(store, cat)
        again = await rebuild_catalog(store, cat, force=True)
        assert (again.blocks, again.runs, again.segments) == (report.blocks, report.runs, report.segments)
        assert {t.name for t in catalog_topics.list_topics(cat)} == {"t", "wide", "s"}
    finally:
        cat.close()


def test_the_cli_rebuilds_an_empty_catalog_and_refuses_a_full_one(s3_endpoint, s3_bucket, tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    store_url = f"s3://{s3_bucket}/cli"

    async def fill() -> None:
        store = open_store(store_url, path_style=True)
        await store.put(keys.block_key(1, keys.new_block_id(1_000)), _block([("cli", 0, 1, 4)]))
        await store.close()

    asyncio.run(fill())
    catalog_url = f"sqlite:///{tmp_path}/cli.db"  # not even migrated yet: the command migrates it first
    argv = ["catalog", "rebuild", "--catalog", catalog_url, "--store", store_url, "--s3-path-style"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "topics 1, partitions 1" in out and "blocks 1 committed with 1 runs" in out
    assert cli_main(argv) == 1
    assert "not empty" in (refusal := capsys.readouterr().err) and "--force deletes them first" in refusal
    assert cli_main([*argv, "--force", "--read-timestamps"]) == 0
    cat = Catalog.open(catalog_url)
    try:
        assert catalog_partitions.get_partition_states(cat, "cli")[0].hwmark_seq == 4
    finally:
        cat.close()


# --- block format versions: a bucket written before and after the bundle index ----------------------------------


async def test_a_bucket_of_version_2_and_version_3_blocks_rebuilds_and_reads_back(s3_store, catalog_url):
    """Blocks of an older broker (footer version 2, no bundle index) then of a newer one (version 3, runs past an
    index interval): the rebuild restores every run from the footers alone, the catalog check is green, and every
    seq reads back byte for byte, range-read by the index from version 3 runs and whole from version 2 ones."""
    rng = random.Random(9)
    ids = keys.BlockIdClock()
    written: dict[tuple[str, int], list] = {}  # each partition's runs: (first, last, records)
    next_seq = {("a", 0): 1, ("a", 1): 1}
    for version, ms in ((2, 1_000), (2, 2_000), (3, 3_000), (3, 4_000)):
        runs = []
        for key in next_seq:
            first = next_seq[key]
            count = rng.randint(20, 90)
            records = b"".join(
                encode_record(encode_bundle([Message(rng.randbytes(rng.randint(500, 3000)), None, TS0 + s)]))
                for s in range(first, first + count))
            runs.append((RunMeta(key[0], key[1], first, first, first + count - 1, count, TS0 + first,
                                 TS0 + first + count - 1, 0), records))
            written.setdefault(key, []).append((first, first + count - 1, records))
            next_seq[key] = first + count
        block = encode_block(runs)[0]
        await s3_store.put(keys.block_key(1, ids.next(ms)), as_version_2(block) if version == 2 else block)
    cat = Catalog.open(catalog_url)
    acat = AsyncCatalog(cat)
    try:
        report = await rebuild_catalog(s3_store, cat)
        assert report.blocks == 4 and report.runs == 8 and report.damaged == [] and report.blocks_abandoned == 0
        assert check_catalog(cat).ok, check_catalog(cat).problems
        reader = RemoteReader(s3_store, acat, Metrics(), clock=SYSTEM_CLOCK)
        for (topic, partition), runs in written.items():
            assert catalog_partitions.get_partition_states(cat, topic)[partition].hwmark_seq == runs[-1][1]
            for first, last, records in runs:
                for seq in range(first, last + 1):
                    for fetch_size in (1, 200_000):
                        chunk = await reader.fetch(TopicPartition(topic, partition), seq, fetch_size)
                        assert isinstance(chunk, RemoteChunk), chunk
                        expected = trim_chunk(records, first, seq, fetch_size)[0]  # an answer ends with its run
                        assert await chunk_bytes(chunk) == expected, (topic, partition, seq, fetch_size)
        indexed = [f for f in reader.footers._entries.values() if any(i is not None for i in f.by_position.values())]
        assert len(reader.footers._entries) == 4 and len(indexed) == 2  # the newer blocks' runs are indexed
    finally:
        acat.shutdown()
        cat.close()
