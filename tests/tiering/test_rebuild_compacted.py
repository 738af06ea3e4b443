"""`tiered catalog rebuild` of a bucket in which key compaction replaced block runs with compacted segments
(`remote.copy=false`): the replaced runs are still in the bucket, inside blocks that another topic's runs keep
committed or that wait for their grace period, and the segments of an earlier pass wait for theirs beside the ones
that replaced them. The rebuilt catalog indexes what the broker's did, the catalog check is green, and the bucket
reads back the same history through it: each seq once, the compacted segment answering for its range."""

from __future__ import annotations

import asyncio
import random
import time

from tests.support.compaction import Model, rows
from tests.tiering.test_rebuild import brokers, snapshot  # noqa: F401 (a fixture)
from tests.tiering.test_remote_compaction import read_through
from tiered.clock import SYSTEM_CLOCK
from tiered.catalog import Catalog
from tiered.catalog.check import check_catalog
from tiered.catalog.compaction import readable_segments
from tiered.catalog.migrate import upgrade
from tiered.client import Client
from tiered.metrics import Metrics
from tiered.protocol.bundle import Message
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.recovery.rebuild import rebuild_catalog
from tiered.tiering.reads.remote_fetch import RemoteReader
from tiered.tiering.objects.store import open_store

SMALL = {"log.segment.bytes": "1kb", "log.index.interval.bytes": "256", "remote.copy": "false"}
COMPACTED = {**SMALL, "log.cleanup.policy": "cleanup"}


async def produce_round(c: Client, rng: random.Random, produced: dict[str, list[Message]], batches: int) -> None:
    """Both topics at once, so that blocks hold runs of both: the compacted topic's runs share blocks with the plain
    topic's, which keep those blocks committed after compaction replaced the compacted topic's runs; then the
    compacted topic alone, whose blocks compaction empties (`deleting`, in their grace period)."""

    async def produce(topic: str) -> None:
        for i in range(batches):
            batch = [Message(rng.randbytes(rng.randint(10, 40)) if rng.random() > 0.15 else b"",
                             b"key-%d" % rng.randrange(20) if rng.random() > 0.15 else None, 1000 + i)
                     for _ in range(rng.randint(2, 8))]
            await c.produce(topic, 0, batch)
            base = len(produced[topic]) + 1
            produced[topic] += [Message(m.value, m.key, m.ts_ms, base + j) for j, m in enumerate(batch)]

    await asyncio.gather(produce("compacted"), produce("plain"))
    await produce("compacted")


async def bucket_history(store, url: str, topic: str, last: int) -> list[Message]:
    cat = Catalog.open(url)
    acat = AsyncCatalog(cat)
    try:
        return await read_through(RemoteReader(store, acat, Metrics(), clock=SYSTEM_CLOCK), topic, 1, last)
    finally:
        acat.shutdown()
        cat.close()


async def test_a_bucket_of_compacted_runs_rebuilds_to_the_same_history(brokers, tmp_path):  # noqa: F811
    original_url, rebuilt_url = f"sqlite:///{tmp_path}/original.db", f"sqlite:///{tmp_path}/rebuilt.db"
    upgrade(rebuilt_url)
    rng = random.Random(41)
    produced: dict[str, list[Message]] = {"compacted": [], "plain": []}
    model = Model(86_400_000)
    app = await brokers(original_url, tmp_path / "data")
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("compacted", 1, COMPACTED)
            await c.create_topic("plain", 1, SMALL)
            part = app.broker.registry.get("compacted", 0)
            # Two passes: the second merges the first's segments with newly sealed ones, and the first's segments
            # wait for their grace period in the bucket beside the segments that replaced them.
            for round_ in range(2):
                await produce_round(c, rng, produced, 30)
                await app.broker.compactor.compact(part, force=True)
                state = app.broker.compactor.partitions[("compacted", 0)]
                assert state.remote_failures == 0 and state.remote_groups > 0, (round_, state)
            upto = part.log.segments[-1].last  # the compacted range: every sealed segment, committed
            now_ms = int(time.time() * 1000)
    finally:
        await app.stop()
    compacted = produced["compacted"]
    expected = model.compact([m for m in compacted if m.seq <= upto], now_ms) + [m for m in compacted if m.seq > upto]
    assert len(expected) < len(compacted)

    before = snapshot(original_url)
    with Catalog.open(original_url) as cat:
        assert [(s.base_seq, s.last_seq) for s in readable_segments(cat, "compacted", 0)][-1][1] == upto
    assert any(key.startswith("blocks/") and state == "deleting"  # emptied by compaction, in their grace period
               for key, state, _, _ in before["blocks"])
    store = open_store(brokers.store_url, path_style=True)
    try:
        listed = [info.object_key async for info in store.list("segments/compacted/")]
        assert len(listed) > 2 * len([s for s in before["segments"] if s[0] == "compacted"])  # old ones remain
        assert rows(await bucket_history(store, original_url, "compacted", len(compacted))) == rows(expected)

        rebuilt = Catalog.open(rebuilt_url)
        report = await rebuild_catalog(store, rebuilt, read_timestamps=True)
        rebuilt.close()
        assert report.damaged == [] and report.foreign == [] and report.incomplete_segments == []
        assert report.segments_superseded and report.runs_pruned > 0
        # One compacted run per block: a pruned run whose block was not emptied shares it with the plain topic.
        assert report.runs_pruned > report.blocks_emptied > 0
        after = snapshot(rebuilt_url)
        for table in ("topics", "partitions", "runs", "segments"):
            assert after[table] == before[table], table
        # Blocks: committed while the plain topic's runs remain, else deleting, as before. The objects of the
        # segments a later pass replaced are `deleting` rows of the original only: the rebuild reports them as
        # superseded, and the reconciler deletes them as orphans after the grace period (tiered.tiering.recovery.rebuild).
        replaced = [b for b in before["blocks"] if b[0].startswith("segments/")]
        assert replaced and {b[1] for b in replaced} == {"deleting"}
        assert sorted(key for key, *_ in replaced) == sorted(
            k for s in report.segments_superseded for k in (s, s.removesuffix(".ilog") + ".index"))
        assert after["blocks"] == [b for b in before["blocks"] if b not in replaced]
        with Catalog.open(rebuilt_url) as cat:
            check = check_catalog(cat)
        assert check.ok, check.problems
        assert rows(await bucket_history(store, rebuilt_url, "compacted", len(compacted))) == rows(expected)
        assert rows(await bucket_history(store, rebuilt_url, "plain", len(produced["plain"]))) == rows(
            produced["plain"])
    finally:
        await store.close()
