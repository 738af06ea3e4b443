"""Key compaction of a topic whose history is held only as block runs (`remote.copy=false`), through `tiered serve`
processes on moto's S3 and a SQLite catalog: keyed messages, tombstones and keyless ones over many segment rolls;
`tiered topic compact` by hand; a consumer reads the reference model's messages through the broker; the catalog
check passes; then a broker on an empty data directory serves the same history from the bucket alone, and the
catalog rebuilt from the bucket indexes the same locations."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

from tests.cluster.conftest import Cluster
from tests.ops.helpers import child_env, http_request
from tests.support.broker import free_port
from tests.support.compaction import Model, rows
from tests.tiering.test_rebuild import snapshot
from tiered.catalog import Catalog
from tiered.catalog.blocks import runs_for_range
from tiered.catalog.check import check_catalog
from tiered.catalog.compaction import readable_segments
from tiered.client import Client
from tiered.protocol.bundle import Message
from tiered.catalog.migrate import upgrade
from tiered.storage.compaction_checkpoint import read_checkpoint
from tiered.tiering.recovery.rebuild import rebuild_catalog
from tiered.tiering.objects.store import open_store

CONFIG = ("log.cleanup.policy=cleanup\nremote.copy=false\nlog.segment.bytes=1kb\nlog.index.interval.bytes=256\n"
          "produce.ack=durable\n")
TOPIC = "runs"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tiered.cli.main", *args], capture_output=True, text=True,
                          env={**child_env(), **(env or {})}, timeout=60)


async def consume_all(port: int) -> list[Message]:
    async with await Client.connect("127.0.0.1", port) as client:
        return [m async for m in client.drain(TOPIC, 0, 0)]


def remote_segments_upto(catalog_url: str) -> int:
    """The last seq the partition's readable (compacted) segments answer for."""
    with Catalog.open(catalog_url) as cat:
        segments = readable_segments(cat, TOPIC, 0)
    return max((s.last_seq for s in segments), default=0)


def cleaned_upto(bp) -> int:
    """The end of the range the passes compacted (the partition's checkpoint, on the broker's disk). A pass from the
    bucket leaves a group that loses nothing as it is (the tail's last run, holding its keys' latest messages), so
    this may pass the last readable segment."""
    return read_checkpoint(str(bp.data_dir / TOPIC / "0")).cleaned_upto


def expected_after(produced: list[Message], upto: int) -> list[Message]:
    """What a consumer reads once [1, upto] is compacted: a pass keeps each key's latest message, so compacting a
    range in steps keeps what one pass over it keeps (tombstones stay for a day)."""
    now_ms = int(time.time() * 1000)
    return Model(86_400_000).compact([m for m in produced if m.seq <= upto], now_ms) + [
        m for m in produced if m.seq > upto]


def check(catalog_url: str) -> None:
    with Catalog.open(catalog_url) as cat:
        report = check_catalog(cat, TOPIC)
    assert report.ok, report.problems


async def test_block_runs_compacted_by_a_broker_process_then_read_from_the_bucket(tmp_path, s3_endpoint, s3_bucket,
                                                                                  monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # for the rebuild's store, in this process
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    cluster = Cluster(tmp_path, catalog_url, f"s3://{s3_bucket}/runs", s3_endpoint)
    rng = random.Random(29)
    produced: list[Message] = []  # with the seqs the broker gave them (plain produces: 1, 2, 3, ...)
    http_port = free_port()
    try:
        bp = cluster.start(1, "-P", f"127.0.0.1:{http_port}")
        async with await Client.connect("127.0.0.1", bp.port) as client:
            await client.create_topic(TOPIC, 1, CONFIG)
            cluster.wait_for_leaders(TOPIC, {1})
            for i in range(60):
                batch = [Message(rng.randbytes(rng.randint(10, 50)) if rng.random() > 0.15 else b"",
                                 b"key-%d" % rng.randrange(25) if rng.random() > 0.15 else None, 1000 + i)
                         for _ in range(rng.randint(2, 10))]
                await client.produce(TOPIC, 0, batch)
                base = len(produced) + 1
                produced.extend(Message(m.value, m.key, m.ts_ms, base + j) for j, m in enumerate(batch))
        with Catalog.open(catalog_url) as cat:  # the history is held as runs only, over many rolls
            assert len(runs_for_range(cat, TOPIC, 0, 1, len(produced))) >= 5
            assert readable_segments(cat, TOPIC, 0) == []
        assert sum(1 for m in produced if m.key and not m.value) > 0 and sum(1 for m in produced if not m.key) > 0
        assert rows(await consume_all(bp.port)) == rows(produced)

        done = await asyncio.to_thread(run_cli, "topic", "compact", TOPIC, "-P", f"127.0.0.1:{http_port}")
        assert done.returncode == 0, done.stderr
        (state,) = json.loads(http_request(
            http_port, b"GET /v1/compaction HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").body)
        assert state["remote_groups"] >= 1 and state["remote_failures"] == 0, state
        upto = cleaned_upto(bp)
        assert remote_segments_upto(catalog_url) == upto > len(produced) // 2, state  # runs replaced by segments
        expected = expected_after(produced, upto)
        assert len(expected) < len(produced)
        assert rows(await consume_all(bp.port)) == rows(expected)
        check(catalog_url)

        # A broker on an empty disk: every message comes from the bucket (compacted segments, then the tail's runs).
        assert cluster.stop(1) == 0
        http_port = free_port()
        bp = cluster.start(1, "-P", f"127.0.0.1:{http_port}", disk="empty")
        cluster.wait_for_leaders(TOPIC, {1})
        assert not any((bp.data_dir / TOPIC / "0").glob("*.ilog"))
        # Its first pass from the bucket may be running: each message read is an original one, and every key's
        # latest message is there.
        got = await consume_all(bp.port)
        original = {m.seq: rows([m]) for m in produced}
        assert all(original[m.seq] == rows([m]) for m in got)
        assert {m.seq for m in expected} >= {m.seq for m in got} >= {m.seq for m in expected_after(produced,
                                                                                                   len(produced))}
        again = await asyncio.to_thread(run_cli, "topic", "compact", TOPIC, "-P", f"127.0.0.1:{http_port}")
        assert again.returncode == 0, again.stderr
        assert remote_segments_upto(catalog_url) >= upto and cleaned_upto(bp) >= upto
        # The pass's broker forgot the locations it had cached before its swaps: it reads the compacted ones now.
        assert rows(await consume_all(bp.port)) == rows(expected_after(produced, cleaned_upto(bp)))
        check(catalog_url)

        # The catalog rebuilt from the bucket, where segments of both passes and the runs they replaced remain,
        # indexes the same locations (tiered/tiering/recovery/rebuild.py).
        assert cluster.stop(1) == 0
        rebuilt_url = f"sqlite:///{tmp_path}/rebuilt.db"
        upgrade(rebuilt_url)
        store = open_store(cluster.store_url, path_style=True)
        try:
            with Catalog.open(rebuilt_url) as rebuilt:
                report = await rebuild_catalog(store, rebuilt, read_timestamps=True)
        finally:
            await store.close()
        assert report.damaged == [] and report.segments_superseded and report.runs_pruned
        before, after = snapshot(catalog_url), snapshot(rebuilt_url)
        for table in ("topics", "partitions", "runs", "segments"):
            assert after[table] == before[table], table
        check(rebuilt_url)
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop_all()
