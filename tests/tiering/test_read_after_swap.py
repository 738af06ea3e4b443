"""The 0xfb of issue 27, driven by hand: a partition of a topic that does not copy its segments (`remote.copy=false`)
is led here, so the remote tier knows its "highest copied seq" (none: 0); a remote compaction replaces its block
runs by segments; a consumer then asks for a seq of the compacted range. The reader must find the segment (the
catalog holds it), never answer "no location holds seq". Against moto's S3 server and both catalog backends."""

from __future__ import annotations

import asyncio

from sqlalchemy import delete

from tests.support.compaction import log_messages, rows
from tests.tiering.test_remote_compaction import GRACE, NOW_S, chunk_bytes, compactor, decode_segment
from tests.tiering.test_run_compaction import RunHistory, logs
from tests.tiering.tier_state import led_state
from tiered.clock import SYSTEM_CLOCK
from tiered import metrics as m
from tiered.catalog.blocks import runs_for_range
from tiered.catalog.check import check_partition
from tiered.catalog.locate import InRun, Nowhere, locate, locations
from tiered.catalog.models import BlockRunModel
from tiered.catalog.compaction import readable_segments
from tiered.metrics import Metrics
from tiered.storage.compaction import compact_partition
from tiered.tier_interface import RemoteChunk, Unreadable
from tiered.tiering.reads.remote_fetch import RemoteReader
from tiered.tiering.remote_tier import RemoteTier
from tiered.topic_partition import TopicPartition


class Sink:
    """The server's side, as far as the remote tier reports to it."""

    def copied(self, *_args) -> None:
        pass

    def first_available_moved(self, *_args) -> None:
        pass


async def test_a_seq_compacted_from_runs_into_a_segment_is_read_by_its_leader(s3_store, cat, acat, tmp_path):
    p0, p1 = logs(tmp_path, seed=21)
    history = RunHistory(s3_store, cat, p0, p1)
    await history.commit_new()
    # Led here, with no segment copied (the topic does not copy them): the state the bug needed.
    state = led_state({("t", 0): history.epoch, ("t", 1): history.epoch}, committed_seq=history.committed[0])
    tier = RemoteTier(s3_store, acat, Sink(), metrics=Metrics(), state=state, fence=lambda *a: None, grace=GRACE,
                      clock=SYSTEM_CLOCK)
    before = {m.seq: m for m in log_messages(p0)}
    seq = max(before)  # in the last run, read before the swap: its location is cached
    chunk = await tier.read(TopicPartition("t", 0), seq, 100_000)
    assert isinstance(chunk, RemoteChunk), chunk
    before_swap = locations(cat, "t", 0, 1, seq, first_page=2)  # small pages: the listing pages in one snapshot
    assert before_swap.segments == [] and before_swap.runs == runs_for_range(cat, "t", 0, 1, 100_000)

    compact_partition(p0, NOW_S, force=True)
    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, p0, history.epoch)
    assert report.groups and report.runs_before
    tier.reader.forget_locations(TopicPartition("t", 0))  # as the service does after a pass with groups
    assert runs_for_range(cat, "t", 0, 1, 100_000) == [] and readable_segments(cat, "t", 0)
    after_swap = locations(cat, "t", 0, 1, seq, first_page=2)
    assert after_swap.runs == [] and after_swap.segments == readable_segments(cat, "t", 0)
    assert after_swap.highest_copied_seq == after_swap.segments[-1].last_seq == seq

    chunk = await tier.read(TopicPartition("t", 0), seq, 100_000)
    assert isinstance(chunk, RemoteChunk), chunk
    got = [m for m in decode_segment(await chunk_bytes(chunk), chunk.first_bundle_seq) if m.seq >= seq]
    assert rows(got[:1]) == rows([before[seq]])
    tier.reader.close()
    p0.close()
    p1.close()


async def test_a_hole_is_reported_only_where_the_catalog_check_finds_one(s3_store, cat, acat, tmp_path):
    p0, p1 = logs(tmp_path, seed=22)
    history = RunHistory(s3_store, cat, p0, p1)
    await history.commit_new()
    metrics = Metrics()
    reader = RemoteReader(s3_store, acat, metrics, clock=SYSTEM_CLOCK)
    committed = history.committed[0]
    assert isinstance(locate(cat, "t", 0, committed), InRun)

    # Past the committed seq: not history yet, so no location and no hole.
    past = locate(cat, "t", 0, committed + 1)
    assert isinstance(past, Nowhere) and not past.is_hole
    assert isinstance(await reader.fetch(TopicPartition("t", 0), committed + 1, 100_000), Unreadable)
    assert metrics.counters[m.UNLOCATED_READS.name] == 0 and check_partition(cat, "t", 0).problems == []

    # A run row lost (by hand): its seqs are a hole, for the check and for the reader alike.
    (run, *_) = runs_for_range(cat, "t", 0, 1, 1)
    with cat.write() as conn:
        conn.execute(delete(BlockRunModel).where(BlockRunModel.block_id == run.block_id,
                                                 BlockRunModel.position == run.position))
    hole = locate(cat, "t", 0, run.last_seq)
    assert isinstance(hole, Nowhere) and hole.is_hole and hole.committed_seq == committed
    (problem,) = check_partition(cat, "t", 0).problems
    assert problem.endswith(f"..{run.last_seq} have no location")
    assert isinstance(await reader.fetch(TopicPartition("t", 0), run.last_seq, 100_000), Unreadable)
    assert metrics.counters[m.UNLOCATED_READS.name] == 1
    reader.close()
    p0.close()
    p1.close()


async def test_fetches_of_one_partition_at_once_share_one_catalog_lookup(s3_store, cat, acat, tmp_path):
    """A consumer and the read-ahead ahead of it ask for seqs of the same location at once: the first asks the
    catalog, the others wait for it and find the location it remembered. Another partition is not held up."""
    p0, p1 = logs(tmp_path, seed=24)
    history = RunHistory(s3_store, cat, p0, p1)
    await history.commit_new()
    metrics = Metrics()
    reader = RemoteReader(s3_store, acat, metrics, clock=SYSTEM_CLOCK)
    (run, *_) = runs_for_range(cat, "t", 0, 1, 1)
    seqs = list(range(run.first_seq, run.last_seq + 1))[:6]
    tp = TopicPartition("t", 0)
    answers = await asyncio.gather(*(reader.fetch(tp, seq, 100_000) for seq in seqs))
    assert all(isinstance(a, RemoteChunk) for a in answers), answers
    for seq, chunk in zip(seqs, answers):
        got = [m for m in decode_segment(await chunk_bytes(chunk), chunk.first_bundle_seq) if m.seq >= seq]
        assert got and got[0].seq == seq
    assert metrics.counters[m.REMOTE_CATALOG_QUERIES.name] == 1
    other = await asyncio.gather(reader.fetch(TopicPartition("t", 1), 1, 100_000), reader.fetch(tp, seqs[0], 100_000))
    assert all(isinstance(a, RemoteChunk) for a in other), other
    assert metrics.counters[m.REMOTE_CATALOG_QUERIES.name] == 2  # partition 1's own lookup; partition 0 cached
    reader.close()
    p0.close()
    p1.close()
