"""`tiered tier status` against a running durable broker: one row per partition, ranges that agree with the disk and
the catalog, and `--json` that parses."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys

from tiered.catalog import Catalog
from tiered.catalog import partitions as catalog_partitions
from tiered.cli.tier import status_url
from tiered.client import Client
from tiered.protocol.bundle import Message

from tests.ops.helpers import child_env
from tests.support.polling import eventually

SMALL_SEGMENTS = {"log.segment.bytes": "2k", "log.index.interval.bytes": "128"}


async def tier_status(*args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "tiered.cli.main", "tier", "status", *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, env=child_env(), timeout=60)


async def test_one_row_per_partition_with_sane_ranges(ops_broker):
    app = await ops_broker()
    endpoint = f"127.0.0.1:{app.http.port}"
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("orders", 3)
        await c.create_topic("hist", 1, SMALL_SEGMENTS)
        for i in range(5):
            await c.produce("orders", 0, [b"order-%d" % i])
        await c.produce("orders", 2, [b"a", b"b"])
        for i in range(0, 60, 10):
            await c.produce("hist", 0, [Message(b"%03d" % j + random.Random(j).randbytes(200), None,
                                                1_700_000_000_000 + j) for j in range(i, i + 10)])
    hist = app.broker.registry.get("hist", 0)
    sealed = list(hist.log.segments)
    assert sealed
    copier = app.tier.remote.copier
    await eventually(lambda: copier.pending == 0 and app.tier.state.highest_copied_seq(("hist", 0)) == sealed[-1].last,
                     what="the sealed segments to be copied")

    proc = await tier_status("-P", endpoint)
    assert proc.returncode == 0, proc.stderr
    header, *rows = [line.split() for line in proc.stdout.decode().splitlines()]
    assert header[:3] == ["topic", "p", "local"]
    by_key = {(r[0], int(r[1])): r for r in rows}
    assert sorted(by_key) == [("hist", 0), ("orders", 0), ("orders", 1), ("orders", 2)]
    # topic, p, local, local bytes, remote, committed, hwmark, pending segs, pending bytes, compaction
    files = lambda t, p: sum(f.stat().st_size for f in (app.settings.data_dir / t / str(p)).glob("*log"))  # noqa: E731
    assert by_key[("orders", 0)] == ["orders", "0", "1..5", str(files("orders", 0)), "1..5", "5", "5", "0", "0", "-"]
    assert by_key[("orders", 1)] == ["orders", "1", "-", "0", "-", "0", "0", "0", "0", "-"]
    assert by_key[("orders", 2)] == ["orders", "2", "1..2", str(files("orders", 2)), "1..2", "2", "2", "0", "0", "-"]
    assert by_key[("hist", 0)] == ["hist", "0", "1..60", str(files("hist", 0)), "1..60", "60", "60", "0", "0", "-"]

    proc = await tier_status("-P", endpoint, "--json")
    assert proc.returncode == 0, proc.stderr
    partitions = json.loads(proc.stdout)
    assert len(partitions) == 4
    hist_json = next(p for p in partitions if p["topic"] == "hist")
    assert hist_json["highest_copied_seq"] == sealed[-1].last and hist_json["remote_first"] == 1
    cat = Catalog.open(ops_broker.catalog_url)
    try:
        states = {(s.topic, s.partition): s for t in ("orders", "hist")
                  for s in catalog_partitions.get_partition_states(cat, t)}
    finally:
        cat.close()
    for p in partitions:
        state = states[(p["topic"], p["partition"])]
        assert p["committed_seq"] == state.hwmark_seq == p["hwmark"]  # durable topics: visible = committed
        assert p["local_first"] <= p["local_last"] and p["remote_first"] <= p["committed_seq"]
        assert p["role"] == "leader" and p["pending_segments"] == 0


async def test_an_unreachable_endpoint_is_a_clear_error():
    proc = await tier_status("-P", "127.0.0.1:1")
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith("tiered tier status: cannot read http://127.0.0.1:1/v1/tier")


def test_the_endpoint_becomes_a_url_for_this_host():
    assert status_url(":9102") == "http://127.0.0.1:9102/v1/tier"
    assert status_url("9300") == "http://127.0.0.1:9300/v1/tier"
    assert status_url("10.0.0.5:9102") == "http://10.0.0.5:9102/v1/tier"
    assert status_url("[::1]:9102") == "http://[::1]:9102/v1/tier"
    assert status_url("[::]:9102") == "http://[::1]:9102/v1/tier"


async def test_a_bad_endpoint_is_refused_before_any_request():
    proc = await tier_status("-P", "127.0.0.1:http")
    assert proc.returncode == 2 and b"port must be a number" in proc.stderr
