"""Tiered segments and remote reads against moto's S3 server: any seq, from local disk or one range GET."""

from __future__ import annotations

import asyncio
import random
import shutil

import pytest

from tiered.catalog import Catalog
from tiered.catalog import segments as catalog_segments
from tiered.catalog.states import SegmentState
from tiered.client import Client
from tiered.protocol.bundle import Message
from tiered.server.app import App, tiering_service
from tiered.tiering.objects.meter import CATALOG
from tiered.tiering.reads.caches import RangeCache, SizedLru

from tests.support.broker import local_settings
from tests.support.polling import eventually

TOPIC_CONFIG = {"log.segment.bytes": "4k", "log.index.interval.bytes": "128", "retention.segments.count": "2"}


def value(i: int) -> bytes:
    return b"v%05d-" % i + random.Random(i).randbytes(80)



@pytest.fixture
async def tiered_broker(tmp_path, s3_endpoint, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    apps: list[App] = []

    async def make(**overrides) -> App:
        settings = local_settings(tmp_path / "data", catalog_url=catalog_url, store_url=f"s3://{s3_bucket}/t",
                                  s3_path_style=True, shutdown_timeout_s=3.0,
                                  **{"block_max_age_ms": 50, "block_linger_ms": 0, "block_max_puts_per_s": 1000.0,
                                     **overrides})
        app = App(settings, tier=tiering_service())
        await app.start()
        apps.append(app)
        return app

    make.catalog_url = catalog_url
    make.data_dir = tmp_path / "data"
    yield make
    for app in apps:
        await app.stop()  # a no-op for the apps a test stopped itself


async def _produce(client: Client, count: int, start: int = 0, per_bundle: int = 5) -> list[bytes]:
    values = []
    for i in range(start, start + count, per_bundle):
        batch = [Message(value(j), None, 1_700_000_000_000 + j) for j in range(i, min(i + per_bundle, start + count))]
        await client.produce("hist", 0, batch)
        values.extend(m.value for m in batch)
    return values


def _copied(catalog_url: str) -> list:
    cat = Catalog.open(catalog_url)
    try:
        return catalog_segments.list_segments(cat, "hist", 0, states=(SegmentState.COPY_FINISHED,))
    finally:
        cat.close()


async def test_history_across_deleted_local_remote_segments_and_block_runs(tiered_broker):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, TOPIC_CONFIG)
        values = await _produce(c, 400)
        sealed = len(app.broker.registry.get("hist", 0).log.segments)
        await eventually(lambda: len(_copied(tiered_broker.catalog_url)) >= sealed, what="segments copied")
        app.broker.enforce_retention()
        part = app.broker.registry.get("hist", 0)
        assert part.log.first_available > 1  # the oldest segments left the local disk ...
        assert len(part.log.segments) <= 2
        assert part.first_available == 1  # ... and the partition still starts at 1, from the bucket
        got = [m async for m in c.drain("hist", 0, 0, fetch_bytes=2000)]
    assert [m.value for m in got] == values
    assert [m.seq for m in got] == list(range(1, 401))
    await app.stop()


async def test_an_empty_data_dir_serves_everything_from_the_bucket(tiered_broker):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, TOPIC_CONFIG)
        values = await _produce(c, 300)
        sealed = len(app.broker.registry.get("hist", 0).log.segments)
        await eventually(lambda: len(_copied(tiered_broker.catalog_url)) >= sealed, what="segments copied")
    await app.stop()
    shutil.rmtree(tiered_broker.data_dir)
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        got = [m async for m in c.drain("hist", 0, 0, fetch_bytes=3000)]
        assert [m.value for m in got] == values
        # Middle of a remote segment: the chunk starts at the bundle holding the seq, the client drops the rest.
        mid = await c.consume("hist", 0, 123, fetch_bytes=500)
        assert mid.messages[0].seq == 123 and mid.messages[0].value == values[122]
        # The unsealed tail lives only in block runs: cold, one catalog query, the block's footer and the run's pages
        # the small fetch needs; warm, none (the pages are kept).
        counters = app.broker.metrics.counters
        copied = max(row.last_seq for row in _copied(tiered_broker.catalog_url))
        reader = app.tier.remote.reader
        reader.runs = RangeCache(reader.clock.monotonic)  # cold: the drain above cached the run ...
        reader.footers = SizedLru(64 << 20, lambda footer: footer.size_bytes)  # ... its block's footer ...
        reader.run_bytes = SizedLru(64 << 20, len)  # ... and its pages
        queries, gets = counters["tiered_remote_catalog_queries_total"], counters["tiered_remote_gets_total"]
        for _ in range(2):
            run_read = await c.consume("hist", 0, copied + 1, fetch_bytes=500)
            assert run_read.messages[0].seq == copied + 1
        assert counters["tiered_remote_catalog_queries_total"] == queries + 1
        assert counters["tiered_remote_gets_total"] == gets + 2  # the second read comes from the cached page
        more = await _produce(c, 10, start=300)
        tail = [m.value async for m in c.drain("hist", 0, 301)]
        assert tail == more
    await app.stop()


async def test_warm_remote_reads_need_no_catalog_query_and_one_get(tiered_broker):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, TOPIC_CONFIG)
        await _produce(c, 300)
        sealed = len(app.broker.registry.get("hist", 0).log.segments)
        await eventually(lambda: len(_copied(tiered_broker.catalog_url)) >= sealed, what="segments copied")
        app.broker.enforce_retention()
        counters = app.broker.metrics.counters
        app.tier.remote.reader.read_ahead = False  # random reads: nothing to read ahead (see the sequential test)
        await c.consume("hist", 0, 2, fetch_bytes=300)  # cold: one catalog query, the index GET, one data GET
        queries, gets = counters["tiered_remote_catalog_queries_total"], counters["tiered_remote_gets_total"]
        assert (queries, gets) == (1, 2)
        await c.consume("hist", 0, 3, fetch_bytes=300)  # warm: no catalog query, one GET
        assert counters["tiered_remote_catalog_queries_total"] == queries
        assert counters["tiered_remote_gets_total"] == gets + 1
    await app.stop()


async def test_failed_segment_uploads_keep_local_segments_until_copied(tiered_broker, s3_faults):
    s3_faults.fail_next(10_000, 503, match=lambda method, path: path.endswith(".ilog"))
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, TOPIC_CONFIG)
        values = await _produce(c, 300)
        part = app.broker.registry.get("hist", 0)
        await asyncio.sleep(0.5)
        app.broker.enforce_retention()
        assert part.log.first_available == 1  # nothing copied, so nothing deleted locally
        s3_faults.reset()
        sealed = len(part.log.segments)
        await eventually(lambda: len(_copied(tiered_broker.catalog_url)) >= sealed, what="segments copied")
        app.broker.enforce_retention()
        assert part.log.first_available > 1
        got = [m.value async for m in c.drain("hist", 0, 0)]
    assert got == values
    await app.stop()


async def test_remote_retention_and_the_reconciler_run_in_the_broker(tiered_broker):
    from datetime import timedelta

    from tiered.client import BoundaryError
    from tiered.tiering.objects import keys

    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, {**TOPIC_CONFIG, "remote.retention.bytes": "8k"})
        values = await _produce(c, 300)
        part = app.broker.registry.get("hist", 0)
        sealed = len(part.log.segments)
        await eventually(lambda: len(_copied(tiered_broker.catalog_url)) >= sealed, what="segments copied")
        app.broker.enforce_retention()
        tiering = app.tier
        assert await tiering.remote_retention_pass() > 0
        first = part.first_available
        assert first > 1
        with pytest.raises(BoundaryError) as caught:
            await c.consume("hist", 0, 1)
        assert caught.value.first_available == first
        got = [m async for m in c.drain("hist", 0, 0)]
        assert got[0].seq == first and [m.value for m in got] == values[first - 1:]
        # An upload whose commit never happened leaves an object the catalog does not know: the reconciler removes it.
        orphan = keys.block_key(0, keys.new_block_id(1_000))
        await tiering.store.put(orphan, b"orphan", attribution=CATALOG)
        tiering.remote.grace = timedelta(0)
        assert await tiering.reconcile_pass() >= 1
        assert app.broker.metrics.counters["tiered_reconciler_deletions_total"] >= 1
        assert [i.object_key async for i in tiering.store.list(orphan, attribution=CATALOG)] == []
        assert [m.value async for m in c.drain("hist", 0, 0)] == values[first - 1:]


async def test_a_seq_in_a_gap_before_a_remote_segment_starts_at_that_segment(tiered_broker):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, TOPIC_CONFIG)
        part = app.broker.registry.get("hist", 0)
        first = []
        while part.log.active is None or part.log.active.size <= 4096:  # fill the active segment past its size
            first += await _produce(c, 5, start=len(first))
        # A mirror-style produce jumps ahead: the roll before it seals the full segment, so the new segment starts at
        # seq 1000 and the seqs in between exist nowhere: a gap between two segments.
        gap = len(first) + 1
        jumped = [Message(value(i), None, 1_700_000_000_000 + i, 1000 + i) for i in range(60)]
        for i in range(0, 60, 5):
            await c.produce_with_seqnum("hist", 0, jumped[i:i + 5])
        await _produce(c, 200, start=2000)  # more segments, so the jumped ones are sealed, copied and trimmed
        sealed_last = part.log.segments[-1].last
        await eventually(lambda: max(r.last_seq for r in _copied(tiered_broker.catalog_url)) >= sealed_last,
                         what="segments copied")
        assert any(r.base_seq == 1000 for r in _copied(tiered_broker.catalog_url))
        app.broker.enforce_retention()
        assert part.log.first_available > 1060  # both ranges are remote only now
        got = await c.consume("hist", 0, gap)
        assert got.messages[0].seq == 1000 and got.messages[0].value == jumped[0].value
        everything = [m.value async for m in c.drain("hist", 0, 0)]
    assert everything[:len(first) + 60] == first + [m.value for m in jumped]


async def test_a_seq_retention_takes_while_the_broker_reads_it_is_a_boundary_not_a_system_error(tiered_broker):
    """Found by bench/chaos.py --remote-retention-secs: retention moves the catalog's first available seq, deletes
    the segment's objects, and only then tells the broker; a read in between, from bounds that still hold the seq
    (its segment row cached by an earlier read, or named by the catalog just before), finds the object gone. That is
    the seq expiring, answered as TANK's boundary fault with the new first available seq, not 0xfb."""
    from datetime import timedelta

    from tiered.client import BoundaryError
    from tiered.storage.topic_config import TopicConfig
    from tiered.tiering.segments.remote_retention import enforce_remote_retention

    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, TOPIC_CONFIG)
        values = await _produce(c, 300)
        part = app.broker.registry.get("hist", 0)
        sealed = len(part.log.segments)
        await eventually(lambda: len(_copied(tiered_broker.catalog_url)) >= sealed, what="segments copied")
        app.broker.enforce_retention()
        assert part.first_available == 1
        got = await c.consume("hist", 0, 1)  # from the bucket: the reader caches the first segment's row
        assert got.messages[0].value == values[0]
        # A retention pass of 8 KiB, up to its deletions: the broker is not told (the pass tells it at its end).
        tiering = app.tier
        report = await enforce_remote_retention(tiering.store, tiering.catalog, "hist", 0,
                                                TopicConfig(remote_retention_bytes=8 << 10), tiering.remote._now(),
                                                grace=timedelta(minutes=10))
        first = report.first_available_seq
        assert report.deleted and first > 1 and part.first_available == 1
        held = part.bounds().local_first  # the local disk still holds seqs from here on
        assert 90 < held < first
        seqs = (held - 1, 1)  # its segment's row not cached (the catalog is asked), then the cached one
        for seq in seqs:
            with pytest.raises(BoundaryError) as caught:
                await c.consume("hist", 0, seq)
            assert caught.value.first_available == first
        assert part.first_available == first  # learned from the boundary: the disk's older seqs are not served now
        with pytest.raises(BoundaryError):
            await c.consume("hist", 0, held)
        assert [m.value for m in await _drain(c, first)] == values[first - 1:]


async def _drain(client: Client, seq: int) -> list[Message]:
    return [m async for m in client.drain("hist", 0, seq)]
