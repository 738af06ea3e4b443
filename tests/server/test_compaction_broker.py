"""Key compaction run by the broker: the trigger on a partition led here, consumers reading during and after a pass,
a follower leaving its disk alone, `POST /v1/compact` and `tiered topic compact`, the metrics and `tiered tier
status`; in-process and against `tiered serve` in a child process."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

import pytest

from tests.ops.helpers import ahttp_get, child_env, http_request, scrape
from tests.server.test_compaction_consume import CONFIG, consume_all, produce_history
from tests.support.broker import free_port, local_settings
from tests.support.compaction import Model, rows
from tests.support.polling import eventually
from tests.tiering.test_remote_compaction import decode_segment
from tiered.catalog import Catalog
from tiered.catalog.compaction import readable_segments
from tiered.client import Client
from tiered.protocol.bundle import Message
from tiered.server.app import App
from tiered.server.registry import Role


@pytest.fixture
async def http_broker(tmp_path):
    """A local-only broker with its HTTP endpoint on 127.0.0.1."""
    app = App(local_settings(tmp_path / "data", http_listen="127.0.0.1:0"), local_only=True)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


async def post(port: int, path: str):
    raw = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode()
    answer = await asyncio.to_thread(http_request, port, raw)
    return answer.status, json.loads(answer.body)


def same_messages(got, expected) -> bool:
    return rows(got) == rows(expected)


async def test_the_trigger_compacts_a_led_partition_while_consumers_read(http_broker):
    app = http_broker
    port = app.http.port
    async with await Client.connect("127.0.0.1", app.broker.port) as client:
        await client.create_topic("compacted", 1, CONFIG)
        await client.create_topic("plain", 1, CONFIG.replace("policy=cleanup", "policy=delete"))
        await produce_history(client, random.Random(11))
        await client.produce("plain", 0, [Message(b"v", b"k", 1)] * 50)
        part = app.broker.registry.get("compacted", 0)
        sealed_last = part.log.segments[-1].last
        before = await consume_all(client)
        in_range = [m for m in before if m.seq <= sealed_last]
        expected = Model(86_400_000).compact(in_range, int(time.time() * 1000))
        expected += [m for m in before if m.seq > sealed_last]
        assert (await scrape(port)).value("tiered_compaction_passes_total") == 0
        original = {m.seq: (m.key, m.value) for m in before}

        # A consumer keeps reading the whole partition while the pass swaps its segments.
        reads = 0

        async def keep_reading() -> None:
            nonlocal reads
            while app.broker.compactor.partitions.get(("compacted", 0)) is None or not (
                    app.broker.compactor.partitions[("compacted", 0)].passes):
                got = await consume_all(client)
                assert all(original[m.seq] == (m.key, m.value) for m in got)
                assert [m.seq for m in got] == sorted({m.seq for m in got})
                reads += 1

        reader = asyncio.ensure_future(keep_reading())
        app.broker.compactor.wake()  # the dirty share is 1.0: above the default ratio of 0.5
        await eventually(lambda: reader.done(), what="a compaction pass")
        await reader
        assert reads >= 1
        after = await consume_all(client)
    assert same_messages(after, expected)
    assert len(after) < len(before)

    m = await scrape(port)
    assert m.value("tiered_compaction_passes_total") == 1
    assert m.value("tiered_compaction_failures_total") == 0
    assert m.value("tiered_compaction_groups_total") >= 1
    assert 0 < m.value("tiered_compaction_bytes_after_total") < m.value("tiered_compaction_bytes_before_total")
    assert m.value("tiered_compaction_keys") == len({msg.key for msg in in_range if msg.key})
    assert m.value("tiered_compaction_tombstones") == sum(1 for msg in expected if msg.key and not msg.value
                                                           and msg.seq <= sealed_last)
    assert m.value("tiered_compaction_pass_seconds_count") == 1
    assert m.value("tiered_compaction_running") == 0
    # The plain topic is never compacted, and not listed.
    (state,) = json.loads((await ahttp_get(port, "/v1/compaction")).body)
    assert (state["topic"], state["partition"], state["state"], state["passes"]) == ("compacted", 0, "idle", 1)
    assert state["last"]["groups"] >= 1 and state["last"]["keys"] == m.value("tiered_compaction_keys")
    tier = {p["topic"]: p for p in json.loads((await ahttp_get(port, "/v1/tier")).body)}
    assert tier["plain"]["compaction"] is None and tier["compacted"]["compaction"]["passes"] == 1

    # Nothing is dirty any more: waking the loop again runs no pass.
    app.broker.compactor.wake()
    await asyncio.sleep(0.3)
    assert (await scrape(port)).value("tiered_compaction_passes_total") == 1


async def test_a_follower_leaves_its_disk_alone(http_broker):
    app = http_broker
    async with await Client.connect("127.0.0.1", app.broker.port) as client:
        await client.create_topic("compacted", 1, CONFIG)
        await produce_history(client, random.Random(3))
    part = app.broker.registry.get("compacted", 0)
    files = sorted(s.filename for s in part.log.segments)
    part.role = Role.FOLLOWER
    status, answer = await post(app.http.port, "/v1/compact?topic=compacted")
    assert status == 202 and answer["partitions"] == [] and answer["not_led"] == [{"partition": 0, "leader": ""}]
    app.broker.compactor.wake()
    assert await app.broker.compactor.compact(part, force=True) is None
    state = app.broker.compactor.partitions[("compacted", 0)]
    assert state.last.skipped == "this broker does not lead the partition" and state.passes == 0
    assert sorted(s.filename for s in part.log.segments) == files
    assert (await scrape(app.http.port)).value("tiered_compaction_passes_total") == 0


async def test_compaction_requests_that_cannot_be_served(http_broker):
    app = http_broker
    port = app.http.port
    async with await Client.connect("127.0.0.1", app.broker.port) as client:
        await client.create_topic("plain", 2)
        await client.create_topic("compacted", 1, CONFIG)
    assert (await post(port, "/v1/compact?topic=nope"))[0] == 404
    assert (await post(port, "/v1/compact?topic=compacted&partition=1"))[0] == 404
    status, answer = await post(port, "/v1/compact?topic=plain")
    assert status == 409 and "not compacted" in answer["error"]
    assert (await post(port, "/v1/compact?topic=compacted&partition=x"))[0] == 400
    assert (await ahttp_get(port, "/v1/compact?topic=compacted")).status == 405
    # Nothing to rewrite yet (no sealed segment): the ticket is answered with the reason.
    status, answer = await post(port, "/v1/compact?topic=compacted&partition=0")
    assert status == 202 and answer["partitions"] == [{"partition": 0, "ticket": 1}]

    async def answered() -> dict | None:
        (state,) = json.loads((await ahttp_get(port, "/v1/compaction")).body)
        return state if state["finished"] == 1 else None

    state = await eventually(answered, what="the ticket's answer")
    assert state["last"]["skipped"] == "no sealed segment may be rewritten yet" and state["passes"] == 0


def http_get_body(port: int, path: str) -> bytes:
    return http_request(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()).body


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tiered.cli.main", *args], capture_output=True, text=True,
                          env=child_env(), timeout=120)


async def test_topic_compact_against_a_broker_process(broker_process):
    http_port = free_port()
    bp = broker_process("-P", f"127.0.0.1:{http_port}")
    endpoint = f"127.0.0.1:{http_port}"
    async with await Client.connect("127.0.0.1", bp.port) as client:
        await client.create_topic("compacted", 1, CONFIG)
        await produce_history(client, random.Random(5))
        before = await consume_all(client)

    def copied() -> dict | None:  # the compacted range is what the bucket holds already
        (p,) = json.loads(http_get_body(http_port, "/v1/tier"))
        return p if p["pending_segments"] == 0 and p["highest_copied_seq"] else None

    tier = await eventually(copied, what="the sealed segments to be copied to the bucket")
    sealed_last = tier["highest_copied_seq"]
    expected = Model(86_400_000).compact([m for m in before if m.seq <= sealed_last], int(time.time() * 1000))
    expected += [m for m in before if m.seq > sealed_last]

    proc = await asyncio.to_thread(run_cli, "topic", "compact", "compacted", "-P", endpoint)
    assert proc.returncode == 0, proc.stderr
    assert "compaction of compacted asked for at broker http://" in proc.stderr and ": 1 partition" in proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("compacted/0: ") and " groups" in line and "messages" in line, line
    async with await Client.connect("127.0.0.1", bp.port) as client:
        after = await consume_all(client)
    gone = sorted(set(rows(expected)) - set(rows(after)))[:5]
    extra = sorted(set(rows(after)) - set(rows(expected)))[:5]
    assert same_messages(after, expected), (sealed_last, gone, extra, proc.stdout)

    m = await scrape(http_port)
    assert m.value("tiered_compaction_passes_total") == 1
    assert m.value("tiered_compaction_bytes_before_total") > m.value("tiered_compaction_bytes_after_total") > 0
    # The bucket's copy followed: its readable segments hold the model's messages, and the catalog check passes.
    assert m.value("tiered_remote_compaction_groups_total") >= 1
    assert 0 < m.value("tiered_remote_compaction_bytes_after_total") < m.value(
        "tiered_remote_compaction_bytes_before_total")
    (state,) = json.loads(http_get_body(http_port, "/v1/compaction"))
    assert state["remote_groups"] >= 1 and state["remote_failures"] == 0
    state_dir = bp.data_dir / ".tiered"
    with Catalog.open(f"sqlite:///{state_dir / 'catalog.db'}") as cat:
        remote = [msg for row in readable_segments(cat, "compacted", 0)
                  for msg in decode_segment((state_dir / "objects" / row.object_key).read_bytes(), row.base_seq)]
    assert same_messages(remote, [msg for msg in expected if msg.seq <= sealed_last])
    check = await asyncio.to_thread(run_cli, "catalog", "check", "-p", str(bp.data_dir))
    assert check.returncode == 0, check.stdout + check.stderr
    status = await asyncio.to_thread(run_cli, "tier", "status", "-P", endpoint)
    assert status.returncode == 0, status.stderr
    header, row = status.stdout.splitlines()
    assert header.split()[-1] == "compaction" and "idle, 1 passes" in row and "bytes" in row

    # A second request with nothing dirty left is answered too; a plain topic's is refused.
    again = await asyncio.to_thread(run_cli, "topic", "compact", "compacted", "-P", endpoint)
    assert again.returncode == 0 and again.stdout.startswith("compacted/0: ")
    refused = await asyncio.to_thread(run_cli, "topic", "compact", "nope", "-P", endpoint)
    assert refused.returncode == 1 and "no topic nope" in refused.stderr


async def test_kill_9_during_passes_leaves_one_set_and_a_restart_finishes(broker_process, tmp_path):
    """kill -9 at random moments of local and remote passes: after each restart the catalog check passes and a
    consumer reads original messages only, every message compaction keeps among them; in the end the disk and the
    bucket both hold exactly the model's messages."""
    rng = random.Random(17)
    data_dir = tmp_path / "data"
    config = CONFIG.replace("log.segment.bytes=2kb", "log.segment.bytes=1kb")
    produced: list[Message] = []  # every message, with the seq the broker gave it (plain produces: 1, 2, 3, ...)
    http_port = free_port()
    bp = broker_process("-P", f"127.0.0.1:{http_port}", data_dir=data_dir)
    async with await Client.connect("127.0.0.1", bp.port) as client:
        await client.create_topic("compacted", 1, config)

    def copied() -> dict | None:
        (p,) = json.loads(http_get_body(http_port, "/v1/tier"))
        return p if p["pending_segments"] == 0 and p["highest_copied_seq"] else None

    for round_ in range(3):
        async with await Client.connect("127.0.0.1", bp.port) as client:
            for _ in range(40):
                batch = [Message(rng.randbytes(rng.randint(20, 60)) if rng.random() > 0.1 else b"",
                                 b"key-%d" % rng.randrange(30), 1000) for _ in range(rng.randint(5, 15))]
                await client.produce("compacted", 0, batch)
                base = len(produced) + 1
                produced.extend([Message(m.value, m.key, m.ts_ms, base + i) for i, m in enumerate(batch)])
        await eventually(copied, what="the sealed segments to be copied")  # so that the pass has work
        await asyncio.to_thread(run_cli, "topic", "compact", "compacted", "-P", f"127.0.0.1:{http_port}",
                                "--no-wait")
        await asyncio.sleep(rng.uniform(0.0, 0.15))
        bp.kill()
        http_port = free_port()
        bp = broker_process("-P", f"127.0.0.1:{http_port}", data_dir=data_dir)
        check = await asyncio.to_thread(run_cli, "catalog", "check", "-p", str(data_dir))
        assert check.returncode == 0, (round_, check.stdout, check.stderr)
        async with await Client.connect("127.0.0.1", bp.port) as client:
            got = await consume_all(client)
        original = {m.seq: (m.key, m.value) for m in produced}
        assert all(original[m.seq] == (m.key, m.value) for m in got), round_
        latest = {m.key: m.seq for m in produced}
        assert {s for s in latest.values() if produced[s - 1].value} <= {m.seq for m in got}, round_

    sealed_last = (await eventually(copied, what="the sealed segments to be copied"))["highest_copied_seq"]
    done = await asyncio.to_thread(run_cli, "topic", "compact", "compacted", "-P", f"127.0.0.1:{http_port}")
    assert done.returncode == 0, done.stderr
    expected = Model(86_400_000).compact([m for m in produced if m.seq <= sealed_last], int(time.time() * 1000))
    expected += [m for m in produced if m.seq > sealed_last]
    async with await Client.connect("127.0.0.1", bp.port) as client:
        assert same_messages(await consume_all(client), expected)
    state_dir = data_dir / ".tiered"
    with Catalog.open(f"sqlite:///{state_dir / 'catalog.db'}") as cat:
        remote = [msg for row in readable_segments(cat, "compacted", 0)
                  for msg in decode_segment((state_dir / "objects" / row.object_key).read_bytes(), row.base_seq)]
    assert same_messages(remote, [m for m in expected if m.seq <= sealed_last])
