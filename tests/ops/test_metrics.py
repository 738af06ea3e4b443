"""`/metrics` scraped over HTTP from a durable broker on moto's S3 and parsed by prometheus_client: TANK's metric
names with exact values, and the tiering metrics with the values the bucket and the catalog say they must have."""

from __future__ import annotations

import os
import platform
import random
import re
import time
from datetime import timedelta
from pathlib import Path

from tiered.client import Client
from tiered.protocol.bundle import Message
from tiered.tiering.objects import keys
from tiered.tiering.objects.store import open_store

from tests.ops.helpers import ahttp_get, scrape
from tests.support.polling import eventually
from tests.support.broker import REPO

SMALL_SEGMENTS = {"log.segment.bytes": "4k", "log.index.interval.bytes": "128", "retention.segments.count": "2"}


def log_bytes(data_dir: Path, topic: str) -> int:
    """Bytes of every segment file (sealed `.ilog` and active `.log`) of a topic: what was appended to it."""
    return sum(f.stat().st_size for f in (data_dir / topic).glob("*/*") if f.name.endswith("log"))


async def bucket_blocks(bucket: str, prefix: str = "blocks/") -> list[int]:
    """The sizes of the block objects (or of the objects under `prefix`) in the bucket."""
    store = open_store(f"s3://{bucket}/tiered", path_style=True)
    try:
        return [info.size_bytes async for info in store.list(prefix)]
    finally:
        await store.close()


async def test_tank_metrics_count_exactly_what_was_produced_and_consumed(ops_broker):
    app = await ops_broker()
    port = app.http.port
    requests, messages = 0, 0
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("orders", 2)
        for i in range(7):
            batch = [Message(b"order-%d-%d" % (i, j), b"k%d" % j, 1_700_000_000_000 + i) for j in range(i % 3 + 1)]
            await c.produce("orders", i % 2, batch)
            requests += 1
            messages += len(batch)
        got = [m for p in (0, 1) for m in [m async for m in c.drain("orders", p, 0)]]
    assert len(got) == messages
    m = await scrape(port)
    appended = log_bytes(app.settings.data_dir, "orders")
    for family in ("tanksrv_topic_produced_bytes", "tanksrv_topic_produced_msgs", "tanksrv_topic_consumed_bytes"):
        assert m.kind(family) == "counter"
        assert f'\n{family}{{m="orders"}} ' in m.text  # TANK's exact names, without a _total suffix
    assert m.value("tanksrv_topic_produced_msgs", m="orders") == messages == 13
    assert m.value("tanksrv_topic_produced_bytes", m="orders") == appended
    # One drain per partition reads each segment file once, whole.
    assert m.value("tanksrv_topic_consumed_bytes", m="orders") == appended
    # Produce latency: one sample per request, and a durable ack waits at least the block's 50 ms age.
    assert m.kind("tanksrv_topic_latency") == "histogram"
    buckets = m.buckets("tanksrv_topic_latency", n="orders")
    assert [count for _, count in buckets] == sorted(count for _, count in buckets)
    assert buckets[-1] == (float("inf"), requests)
    assert m.value("tanksrv_topic_latency_count", n="orders") == requests
    assert dict(buckets)[0.025] == 0
    assert m.value("tanksrv_topic_latency_sum", n="orders") >= requests * 0.049


async def test_block_upload_metrics_agree_with_the_bucket(ops_broker, s3_faults):
    app = await ops_broker()
    port = app.http.port
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("audit", 1)
        # Every attempt of the first block PUT fails (the store makes 5): one StoreError, then the pipeline retries.
        s3_faults.fail_next(5, 503, match=lambda method, path: method == "PUT")
        for i in range(4):
            await c.produce("audit", 0, [b"entry-%d" % i])
    assert s3_faults.pending() == 0
    sizes = await bucket_blocks(ops_broker.bucket)
    m = await scrape(port)
    assert m.value("tiered_blocks_uploaded_total") == len(sizes) >= 1
    assert m.value("tiered_block_bytes_uploaded_total") == sum(sizes)
    topic_objects = await bucket_blocks(ops_broker.bucket, "topics/")  # the topic's own object (topics/audit.json)
    assert len(topic_objects) == 1
    # No segment was sealed, so the blocks and the topic object are all the PUTs.
    assert m.value("tiered_store_puts_total") == len(sizes) + 1
    assert m.value("tiered_store_put_bytes_total") == sum(sizes) + sum(topic_objects)
    assert m.value("tiered_put_errors_total") == 1
    assert m.value("tiered_store_errors_total") == 1
    assert m.value("tiered_store_gets_total") == 0  # every read was local
    assert m.value("tiered_commit_seconds_count") == len(sizes)
    assert m.value("tiered_durable_ack_seconds_count") == len(sizes)
    # A block is committed no sooner than its age limit (50 ms) after its first record.
    assert m.value("tiered_durable_ack_seconds_sum") >= len(sizes) * 0.049
    assert m.value("tiered_segments_pending_upload") == 0
    assert m.value("tiered_upload_lag_bytes") == 0
    assert m.value("tiered_upload_lag_seconds") == 0
    assert m.value("tiered_blocks_in_flight") == 0


async def test_upload_lag_and_pending_segments_while_the_store_is_away_then_remote_cache_hits(ops_broker, s3_faults):
    # Local acks, so producers are answered while nothing reaches the bucket; one block for the whole burst.
    app = await ops_broker(block_max_age_ms=300)
    port = app.http.port
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, {**SMALL_SEGMENTS, "produce.ack": "local"})
        s3_faults.go_away()
        started = time.monotonic()
        for i in range(0, 160, 10):
            await c.produce("hist", 0, [Message(b"v%04d-" % j + random.Random(j).randbytes(90), None,
                                                1_700_000_000_000 + j) for j in range(i, i + 10)])
        # Wait until the block has failed to upload once: it is then in flight, retried until the store is back.
        m = await eventually(lambda: _scrape_when(port, lambda m: m.get("tiered_put_errors_total") >= 1),
                             what="a failed block PUT")
        away_s = time.monotonic() - started
        tier = (await ahttp_get(port, "/v1/tier")).body
        part = app.broker.registry.get("hist", 0)
        sealed = list(part.log.segments)
        assert len(sealed) >= 2
        produced = m.value("tanksrv_topic_produced_bytes", m="hist")
        assert produced == log_bytes(app.settings.data_dir, "hist")
        assert m.value("tiered_segments_pending_upload") == len(sealed)
        # The lag counts the records of blocks not yet committed, plus the sealed segments not yet copied.
        assert m.value("tiered_upload_lag_bytes") == produced + sum(s.size for s in sealed), tier
        assert 0.25 <= m.value("tiered_upload_lag_seconds") <= away_s + 1.0
        s3_faults.come_back()
        m = await eventually(lambda: _scrape_when(port, lambda m: m.value("tiered_segments_pending_upload") == 0
                                                  and m.value("tiered_upload_lag_bytes") == 0),
                             timeout_s=30, what="the lag to drain")
        assert m.value("tiered_upload_lag_seconds") == 0
        assert m.value("tiered_segments_copied_total") == len(sealed)
        # Local retention may now drop the oldest segments: their seqs are read from the bucket.
        app.broker.enforce_retention()
        assert part.log.first_available > 1
        for _ in range(2):
            first = await c.consume("hist", 0, 1, fetch_bytes=500)
            assert first.messages[0].seq == 1 and first.messages[0].value.startswith(b"v0000-")
    m = await scrape(port)
    assert m.value("tiered_remote_cache_misses_total") == 1  # the first read looked the segment up ...
    assert m.value("tiered_remote_cache_hits_total") == 1  # ... the second found it cached
    # Each read: one range GET of the segment; the index object is fetched once and cached.
    assert m.value("tiered_remote_gets_total") == 3
    assert m.value("tiered_remote_bytes_total") > 0


async def _scrape_when(port: int, condition):
    m = await scrape(port)
    return m if condition(m) else None


async def test_reconciler_deletions_are_counted(ops_broker):
    app = await ops_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("kept", 1)
        await c.produce("kept", 0, [b"committed"])
    orphan = keys.block_key(5, keys.new_block_id(1_600_000_000_000))  # an upload whose commit never happened
    store = open_store(f"s3://{ops_broker.bucket}/tiered", path_style=True)
    try:
        await store.put(orphan, b"never committed")
    finally:
        await store.close()
    before = await scrape(app.http.port)
    assert before.value("tiered_reconciler_deletions_total") == 0  # exported before the first deletion
    tiering = app.tier
    tiering.remote.grace = timedelta(0)  # the orphan is old enough at once (no block is pending: nothing else qualifies)
    assert await tiering.reconcile_pass() == 1
    m = await scrape(app.http.port)
    assert m.value("tiered_reconciler_deletions_total") == 1
    assert len(await bucket_blocks(ops_broker.bucket)) == 1  # the committed block stays


async def test_every_exported_metric_is_documented_with_its_type(ops_broker):
    """docs/operations.md's table and a fresh broker's /metrics name the same metrics, with the same types."""
    app = await ops_broker()
    m = await scrape(app.http.port)
    exported = dict(re.findall(r"^# TYPE (\S+) (\S+)$", m.text, re.M))
    documented = {}
    for line in (REPO / "docs" / "operations.md").read_text().splitlines():
        row = re.match(r"^\| `((?:tanksrv|tiered|process|python)_[a-z_]+)(?:\{[^}]*\})?` \| (\w+) \|", line)
        if row:
            documented[row.group(1)] = row.group(2)
    assert documented == exported


def test_build_info_and_process_families_read_this_process():
    from tiered import __version__
    from tiered.metrics import Metrics

    text = Metrics().render()
    info = re.search(r'^tiered_build_info\{version="([^"]+)",python="([^"]+)",.*native_bundle_scan="([01])".*\} 1$',
                     text, re.M)
    assert info and info.group(1) == __version__ and info.group(2) == platform.python_version()
    values = {name: float(v) for name, v in re.findall(r"^(process_[a-z_]+) (\S+)$", text, re.M)}
    assert set(values) == {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                           "process_open_fds", "process_max_fds", "process_start_time_seconds"}
    assert values["process_cpu_seconds_total"] > 0 and values["process_resident_memory_bytes"] > 1 << 20
    assert values["process_virtual_memory_bytes"] >= values["process_resident_memory_bytes"]
    assert 3 <= values["process_open_fds"] <= values["process_max_fds"]
    assert abs(values["process_start_time_seconds"] - start_time_by_proc_ctime()) < 5


def start_time_by_proc_ctime() -> float:
    """This process's start by another route: the creation time of /proc/self (set when the process was made)."""
    return os.stat(f"/proc/{os.getpid()}").st_ctime
