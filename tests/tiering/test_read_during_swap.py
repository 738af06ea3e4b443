"""A remote read looks a seq up in one transaction (tiered.catalog.locate: the remote segment or the block run), so
a remote compaction that replaces the run by a segment commits either before the lookup (the segment answers) or
after it (the run answers, its object kept for the grace period): the consumer gets the seq, never "no location holds
seq" (0xfb). Against moto's S3 and SQLite, the swap a real one, run right after the lookup."""

from __future__ import annotations

import random
import time

from tests.support.compaction import rows
from tests.tiering.test_rebuild import brokers  # noqa: F401 (a fixture)
from tests.tiering.test_remote_compaction import chunk_bytes, decode_segment
from tests.tiering.test_rebuild_compacted import COMPACTED
from tiered.clock import SYSTEM_CLOCK
from tiered.catalog import Catalog
from tiered.catalog.locate import InRun, locate
from tiered.catalog.blocks import RunLocation, runs_for_range
from tiered.catalog.compaction import readable_segments
from tiered.client import Client
from tiered.metrics import Metrics
from tiered.protocol.bundle import Message
from tiered.storage.compaction import compact_partition
from tiered.tier_interface import RemoteChunk
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.reads.remote_fetch import RemoteReader
from tiered.tiering.objects.store import open_store
from tiered.topic_partition import TopicPartition


def run_for(cat: Catalog, seq: int) -> RunLocation | None:
    return next((r for r in runs_for_range(cat, "compacted", 0, seq, 1) if r.from_seq <= seq <= r.last_seq), None)


async def test_a_run_swapped_for_a_segment_right_after_the_lookup_is_read(brokers, tmp_path):  # noqa: F811
    url = f"sqlite:///{tmp_path}/catalog.db"
    rng = random.Random(5)
    produced: list[Message] = []
    app = await brokers(url, tmp_path / "data")
    store = open_store(brokers.store_url, path_style=True)
    cat = Catalog.open(url)
    acat = AsyncCatalog(cat)
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("compacted", 1, COMPACTED)
            for i in range(30):
                batch = [Message(rng.randbytes(30), b"key-%d" % rng.randrange(200), 1000 + i) for _ in range(4)]
                await c.produce("compacted", 0, batch)
                base = len(produced) + 1
                produced += [Message(m.value, m.key, m.ts_ms, base + j) for j, m in enumerate(batch)]
        log = app.broker.registry.get("compacted", 0).log
        assert compact_partition(log, time.time(), force=True).groups  # the disk's pass; the bucket's is below
        seq = log.segments[-1].last  # in the last sealed segment's runs, which the bucket's pass replaces
        assert readable_segments(cat, "compacted", 0) == [] and run_for(cat, seq)

        reader = RemoteReader(store, acat, Metrics(), clock=SYSTEM_CLOCK)
        query = reader._query
        swapped = []

        async def swap_after_the_lookup(fn, *args):
            got = await query(fn, *args)
            if fn is locate and not swapped:
                assert isinstance(got, InRun)  # the run answers, as the read was planned
                report = await app.tier.compact_remote(TopicPartition("compacted", 0), log)
                swapped.append(report)
            return got

        reader._query = swap_after_the_lookup  # type: ignore[method-assign]
        chunk = await reader.fetch(TopicPartition("compacted", 0), seq, 100_000)
        assert swapped and swapped[0].groups and swapped[0].runs_before
        assert run_for(cat, seq) is None  # the run is gone: the segment answers
        assert isinstance(chunk, RemoteChunk), chunk
        got = [m for m in decode_segment(await chunk_bytes(chunk), chunk.first_bundle_seq) if m.seq >= seq]
        assert rows(got[:1]) == rows([produced[seq - 1]])
    finally:
        acat.shutdown()
        cat.close()
        await store.close()
        await app.stop()
