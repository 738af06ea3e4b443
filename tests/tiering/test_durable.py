"""Durable acknowledgement against real parts: moto's S3 server over HTTP and PostgreSQL (or SQLite).

What every test checks in the end: each acknowledged message is in the bucket and the catalog, byte for byte as
in the segment file, and nothing the producer was not told is written is reported as written.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace

import pytest

from tiered.catalog import Catalog
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.client import Client, TankError
from tiered.protocol.bundle import Message
from tiered.protocol.codes import ProduceStatus
from tiered.server.app import App, tiering_service
from tiered.tiering.blocks.block_format import decode_block
from tiered.tiering.objects.store import open_store

from tests.support.broker import local_settings
from tests.support.polling import eventually


@pytest.fixture
async def durable(tmp_path, s3_endpoint, s3_bucket, monkeypatch):
    """Builds in-process brokers on one data dir, one catalog and one bucket; `make(catalog_url)` starts one."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    apps: list[App] = []

    async def make(catalog_url: str, *, ack_timeout_s: float = 10.0, **overrides) -> App:
        if "block_max_age_ms" not in overrides:  # blocks close sooner than the 250 ms default: faster tests
            # and a lone durable produce is acked after a 5 ms linger (the latency-first policy), not the 50 ms age
            overrides.update(block_max_age_ms=50, block_linger_ms=5, block_max_puts_per_s=1000.0)
        settings = local_settings(tmp_path / "data", catalog_url=catalog_url, store_url=f"s3://{s3_bucket}/tiered",
                                  s3_path_style=True, **{"shutdown_timeout_s": 3.0, **overrides},
                                  produce_ack_timeout_ms=int(ack_timeout_s * 1000))
        app = App(settings, tier=tiering_service(ack_timeout_s=ack_timeout_s))
        await app.start()
        apps.append(app)
        return app

    make.data_dir = tmp_path / "data"
    make.bucket = s3_bucket
    yield make
    for app in apps:
        await app.stop()  # a no-op for the apps a test stopped itself


async def _stop(app: App) -> None:
    await app.stop()


def set_ack_timeout(app: App, seconds: float) -> None:
    """How long the broker waits for a durable commit before answering "not confirmed" (0x03)."""
    app.broker.settings = replace(app.broker.settings, produce_ack_timeout_ms=int(seconds * 1000))


async def _assert_durable(catalog_url: str, bucket: str, topic: str, partition: int, expected: list[bytes]) -> None:
    """Every seq 1..len(expected) is in a committed run whose object holds exactly these messages."""
    from tiered.protocol.chunk import read_chunk

    store = open_store(f"s3://{bucket}/tiered", path_style=True)
    cat = Catalog.open(catalog_url)
    try:
        seen: list[bytes] = []
        seq = 1
        while seq <= len(expected):
            run = catalog_blocks.find_run(cat, topic, partition, seq)
            assert run is not None, f"seq {seq} of {topic}/{partition} is not in the catalog"
            data = await store.get_range(run.object_key, run.position, run.position + run.length_bytes)
            read = read_chunk(data, run.first_seq, seq, run.last_seq)
            seen.extend(m.value for m in read.messages)
            seq = run.last_seq + 1
        assert seen == expected
    finally:
        cat.close()
        await store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_an_ack_means_the_block_is_in_the_bucket_and_the_catalog(durable, backend, request, tmp_path):
    catalog_url = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path}/c.db"
    app = await durable(catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("orders", 3)
        expected = {p: [] for p in range(3)}
        for i in range(30):
            value = b"order-%d" % i
            await c.produce("orders", i % 3, [Message(value, b"k%d" % (i % 5), 1_700_000_000_000 + i)])
            expected[i % 3].append(value)
    for p in range(3):
        await _assert_durable(catalog_url, durable.bucket, "orders", p, expected[p])
    # The runs are byte for byte the segment records: one block's runs concatenated per partition equal the file.
    store = open_store(f"s3://{durable.bucket}/tiered", path_style=True)
    runs: dict[int, list[tuple[int, bytes]]] = {}
    async for info in store.list("blocks/"):
        for run, data in decode_block(await store.get(info.object_key)):
            runs.setdefault(run.partition, []).append((run.first_seq, bytes(data)))
    await store.close()
    for p in range(3):
        segment = next((durable.data_dir / "orders" / str(p)).glob("*.log")).read_bytes()
        assert b"".join(data for _, data in sorted(runs[p])) == segment
    await _stop(app)


async def test_consumers_see_a_durable_message_only_once_it_is_committed(durable, tmp_path):
    app = await durable(f"sqlite:///{tmp_path}/c.db", block_max_age_ms=1500)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("slow", 1)
        producing = asyncio.ensure_future(c.produce("slow", 0, [b"pending"]))
        await asyncio.sleep(0.3)
        assert not producing.done()
        early = await c.consume("slow", 0, 1)
        assert early.messages == [] and early.hwmark == 0
        waiter = asyncio.ensure_future(c.consume("slow", 0, 1, max_wait_ms=10_000))
        await asyncio.wait_for(producing, 10)
        woken = await asyncio.wait_for(waiter, 5)  # long-poll waiters wake on the commit
        assert [m.value for m in woken.messages] == [b"pending"]
    await _stop(app)


async def test_s3_errors_are_retried_and_every_ack_lands(durable, s3_faults, tmp_path):
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    app = await durable(catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("flaky", 1)
        s3_faults.fail_next(4, 503, match=lambda method, path: method == "PUT")
        s3_faults.drop_next(2, match=lambda method, path: method == "PUT")
        values = [b"v%d" % i for i in range(20)]
        await asyncio.gather(*(c.produce("flaky", 0, [v]) for v in values))
    assert s3_faults.pending() == 0
    got = [m.value async for m in (await Client.connect("127.0.0.1", app.broker.port)).drain("flaky", 0, 0)]
    assert sorted(got) == sorted(values)
    await _assert_durable(catalog_url, durable.bucket, "flaky", 0, got)
    await _stop(app)


async def test_a_store_that_goes_away_answers_not_confirmed_and_nothing_unacknowledged_is_visible(
        durable, s3_faults, tmp_path, caplog):
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    app = await durable(catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("outage", 1)
        await c.produce("outage", 0, [b"before"])
        set_ack_timeout(app, 1.0)  # the producer gives up quickly during the outage
        s3_faults.go_away()
        with pytest.raises(TankError) as caught:
            await c.produce("outage", 0, [b"during"])
        assert caught.value.code == ProduceStatus.ACK_TIMEOUT  # appended, not confirmed: it may still commit
        # The broker's line names why: the store's error on the block's upload.
        said = [r.getMessage() for r in caplog.records if "durable produces not confirmed within" in r.getMessage()]
        assert said and ": PUT " in said[-1], said
        # Not committed, so not visible: a consumer sees only what the catalog holds.
        got = await c.consume("outage", 0, 1)
        assert [m.value for m in got.messages] == [b"before"] and got.hwmark == 1
        s3_faults.come_back()
        set_ack_timeout(app, 10.0)
        await c.produce("outage", 0, [b"after"])
        values = [m.value async for m in c.drain("outage", 0, 0)]
    # The failed record was retried in the background and committed before "after": the catalog has no hole.
    assert values == [b"before", b"during", b"after"]
    await _assert_durable(catalog_url, durable.bucket, "outage", 0, values)
    await _stop(app)


async def test_postgres_restarted_in_the_middle_of_commits(durable, pg_url, pg_cluster):
    app = await durable(pg_url, ack_timeout_s=30.0)
    acked: list[bytes] = []
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("pgrestart", 1)

        async def produce_many() -> None:
            for i in range(60):
                value = b"m%03d" % i
                await c.produce("pgrestart", 0, [value])
                acked.append(value)
                await asyncio.sleep(0.02)

        task = asyncio.ensure_future(produce_many())
        while len(acked) < 10:
            await asyncio.sleep(0.02)
        # "fast" ends every session at once, commits in flight included; "immediate" would also lose commits that
        # the test cluster (synchronous_commit=off, for speed) acknowledged before writing them out.
        await asyncio.to_thread(pg_cluster.restart, "fast")
        await asyncio.wait_for(task, 60)
    assert len(acked) == 60
    await _assert_durable(pg_url, durable.bucket, "pgrestart", 0, acked)
    await _stop(app)


async def test_a_broker_with_a_stale_epoch_is_refused_and_stops_serving(durable, tmp_path):
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    app = await durable(catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("contested", 1)
        await c.produce("contested", 0, [b"mine"])
        cat = Catalog.open(catalog_url)
        catalog_partitions.claim_partitions(cat, 99, "contested", [0])  # another broker takes the partition over
        with pytest.raises(TankError) as refused:
            await c.produce("contested", 0, [b"too late"])
        assert refused.value.code == ProduceStatus.NO_LEADER  # never committed: safe to send to the new leader
        with pytest.raises(TankError) as fenced:
            await c.produce("contested", 0, [b"later"])
        assert fenced.value.code == ProduceStatus.NO_LEADER
        state = catalog_partitions.get_partition_states(cat, "contested")[0]
        assert (state.hwmark_seq, state.leader_broker) == (1, 99)
        cat.close()
    await _stop(app)


async def test_an_idle_broker_makes_no_puts(durable, tmp_path):
    app = await durable(f"sqlite:///{tmp_path}/c.db")
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("quiet", 1)
        await c.produce("quiet", 0, [b"one"])
        puts = app.tier.store.counters.puts
        await asyncio.sleep(1.0)
        assert app.tier.store.counters.puts == puts == 2  # the topic object, then the one block
    await _stop(app)


async def test_records_past_the_catalog_are_uploaded_at_restart_before_they_are_served(durable, s3_faults, tmp_path):
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    app = await durable(catalog_url, shutdown_timeout_s=1.0)  # its stop waits out the outage: 1 s, not 3
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("tail", 1)
        await c.produce("tail", 0, [b"committed"])
        set_ack_timeout(app, 0.5)  # producers give up quickly during the outage
        s3_faults.go_away()
        for value in (b"local-1", b"local-2"):
            with pytest.raises(TankError):
                await c.produce("tail", 0, [value])
    await app.stop()  # the open blocks cannot be committed: their records stay on the local disk
    s3_faults.come_back()
    app = await durable(catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.produce("tail", 0, [b"new"])  # acknowledged only after the recovered tail is committed
        values = [m.value async for m in c.drain("tail", 0, 0)]
    assert values == [b"committed", b"local-1", b"local-2", b"new"]
    await _assert_durable(catalog_url, durable.bucket, "tail", 0, values)
    await _stop(app)


async def test_a_new_empty_volume_continues_from_the_catalog(durable, tmp_path):
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    app = await durable(catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("moved", 2)
        for i in range(5):
            await c.produce("moved", 1, [b"old-%d" % i])
    await app.stop()
    shutil.rmtree(durable.data_dir)  # the pod comes back on a new, empty volume
    app = await durable(catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        assert sorted((t.name, t.partitions) for t in await c.discover_topics()) == [("moved", 2)]
        await c.produce("moved", 1, [b"new"])
        got = [(m.seq, m.value) async for m in c.drain("moved", 1, 0)]
    assert got == [(i + 1, b"old-%d" % i) for i in range(5)] + [(6, b"new")]
    await _stop(app)


async def test_local_ack_topics_answer_at_append_and_are_still_uploaded(durable, tmp_path):
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    app = await durable(catalog_url, block_max_age_ms=100)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("fast", 1, {"produce.ack": "local"})
        await c.produce("fast", 0, [b"a", b"b"])
        assert [m.value for m in (await c.consume("fast", 0, 1)).messages] == [b"a", b"b"]
    # Acknowledged at append, committed later: wait (bounded) for the catalog to name both seqs. Waiting for the
    # block's PUT was not enough: the catalog commit comes after it.
    def committed() -> bool:
        with Catalog.open(catalog_url) as cat:
            return all(catalog_blocks.find_run(cat, "fast", 0, seq) is not None for seq in (1, 2))

    await eventually(committed, what="fast/0's block committed to the catalog")
    await _assert_durable(catalog_url, durable.bucket, "fast", 0, [b"a", b"b"])
    await _stop(app)


def test_settings_replace_keeps_the_store_url(tmp_path):
    settings = local_settings(tmp_path, store_url="s3://b/p")
    assert replace(settings, block_max_age_ms=5).effective_store_url == "s3://b/p"
