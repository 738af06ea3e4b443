"""Compaction of history held as block runs (a topic with `remote.copy=false`), against moto's S3 server and both
catalog backends: the leader's compacted segments replace the partition's runs in one transaction; blocks whose
other runs (another partition's) remain stay, the others go through the two-phase deletion; a later pass whose
group spans compacted segments and new runs; runs compacted from the bucket by a leader whose disk lacks them; a
crash at every step, from local copies and from the bucket, and kill -9 of a process at every step of a pass from
the bucket, leaving the old or the new locations; the catalog check after each; every message read back."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest

from tests.support.compaction import Model, append_workload, log_messages, random_workload, rows
from tests.support.storage_helpers import FakeClock
from tests.tiering.test_bucket_compaction import kill_9_at_every_step
from tests.tiering.test_remote_compaction import (
    assert_bucket_holds_what_the_catalog_names,
    crash_at_every_step,
    every_step_on,
    BROKER,
    CONFIG,
    GRACE,
    NOW_S,
    RETENTION_S,
    at,
    compactor,
    decode_segment,
    exists,
    open_log,
)
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import RunRow, runs_for_range
from tiered.catalog.check import check_partition
from tiered.catalog.compaction import readable_segments
from tiered.catalog.states import BlockState
from tiered.storage.compaction import compact_partition
from tiered.storage.partition_log import PartitionLog
from tiered.tiering.recovery.reconciler import sweep_deleted_blocks


class RunHistory:
    """What the durable path leaves for two partitions of a topic that does not copy its segments: one block per
    sealed segment of partition 0, holding its run (the segment's bytes); every other block also holds a run of
    partition 1. Only the run bytes are read here (range GETs at the rows' positions), so a block object is the
    runs' bytes back to back."""

    def __init__(self, store, cat, p0: PartitionLog, p1: PartitionLog):
        self.store, self.cat, self.p0, self.p1 = store, cat, p0, p1
        catalog_topics.create_topic(cat, "t", 2, now=at(NOW_S))
        self.epoch = catalog_partitions.claim_partitions(cat, BROKER, "t", [0, 1])[0]
        self.committed = {0: 0, 1: 0}
        self.done: set[int] = set()  # bases of partition 0's segments committed
        self.p1_left = list(p1.segments)
        self.shared: set[str] = set()  # blocks holding runs of both partitions
        self.p1_runs: list[tuple[str, RunRow, bytes]] = []

    def _run(self, partition: int, plog: PartitionLog, segment, position: int) -> tuple[RunRow, bytes]:
        records = list(plog.iter_records(segment.base, segment.last))
        data = b"".join(r.record for r in records)
        run = RunRow("t", partition, self.committed[partition] + 1, records[0].first_seq, records[-1].last_seq,
                     1, 0, 0, self.epoch, position, len(data))
        self.committed[partition] = run.last_seq
        return run, data

    async def commit_new(self) -> None:
        for i, segment in enumerate(s for s in self.p0.segments if s.last > self.committed[0]):
            self.done.add(segment.base)
            run, data = self._run(0, self.p0, segment, 0)
            runs, body = [run], data
            key = f"blocks/t-{segment.base}.blk"
            if i % 2 == 0 and self.p1_left:
                other, other_data = self._run(1, self.p1, self.p1_left.pop(0), len(body))
                runs.append(other)
                body += other_data
                self.shared.add(key)
                self.p1_runs.append((key, other, other_data))
            block_id = catalog_blocks.insert_pending_block(self.cat, key, BROKER, len(body), now=at(NOW_S))
            await self.store.put(key, body)
            catalog_blocks.commit_block(self.cat, block_id, BROKER, runs, {("t", 0): self.epoch, ("t", 1): self.epoch},
                                        now=at(NOW_S))
            catalog_blocks.expand_blocks(self.cat, [block_id])  # as the broker does after the acknowledgements

    async def messages(self, partition: int = 0) -> list:
        """Every message partition 0's locations hold, read from the bucket: readable segments and runs."""
        spans = [(r.from_seq, r.object_key, 0, r.size_bytes, r.base_seq)
                 for r in readable_segments(self.cat, "t", partition)]
        spans += [(r.from_seq, r.object_key, r.position, r.length_bytes, r.first_seq)
                  for r in runs_for_range(self.cat, "t", partition, 1, 100_000)]
        out = []
        for _, key, position, length, first in sorted(spans):
            out.extend(decode_segment(await self.store.get_range(key, position, position + length), first))
        return out

    def check(self) -> None:
        assert check_partition(self.cat, "t", 0).problems == []
        assert check_partition(self.cat, "t", 1).problems == []

    async def partition_1_untouched(self) -> None:
        for key, run, data in self.p1_runs:
            assert await self.store.get_range(key, run.position, run.position + run.length_bytes) == data
        assert len(runs_for_range(self.cat, "t", 1, 1, 100_000)) == len(self.p1_runs)


def logs(tmp_path, seed: int) -> tuple[PartitionLog, PartitionLog]:
    p0 = open_log(tmp_path / "p0")
    append_workload(p0, random_workload(random.Random(seed), 80, 12))
    p0.seal_active()
    p1 = open_log(tmp_path / "p1")
    append_workload(p1, random_workload(random.Random(seed + 100), 40, 50))
    p1.seal_active()
    return p0, p1


def leader_without_history(tmp_path) -> PartitionLog:
    """A broker that took the partition over with an empty disk, on a topic that does not copy its segments."""
    return PartitionLog.open(str(tmp_path / "new-leader"), replace(CONFIG, remote_copy=False), now_s=FakeClock())


def block_states(cat, object_keys) -> dict[str, str]:
    from sqlalchemy import select

    from tiered.catalog.models import BlockModel

    with cat.read() as conn:
        return dict(conn.execute(select(BlockModel.object_key, BlockModel.state)
                                 .where(BlockModel.object_key.in_(list(object_keys)))).all())


async def test_runs_are_replaced_by_compacted_segments_and_shared_blocks_stay(s3_store, cat, acat, tmp_path):
    p0, p1 = logs(tmp_path, seed=21)
    history = RunHistory(s3_store, cat, p0, p1)
    await history.commit_new()
    before = log_messages(p0)
    assert rows(await history.messages()) == rows(before)
    blocks = {f"blocks/t-{base}.blk" for base in history.done}
    model = Model(RETENTION_S * 1000)
    expected = model.compact(before, int(NOW_S * 1000))
    compact_partition(p0, NOW_S, force=True)

    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, p0, history.epoch)
    assert report.groups and report.stopped is None and report.runs_before == len(blocks)
    assert report.segments_before == 0 and report.bytes_after < report.bytes_before
    history.check()
    assert runs_for_range(cat, "t", 0, 1, 100_000) == []
    assert rows(await history.messages()) == rows(expected)
    assert [(r.base_seq, r.last_seq) for r in readable_segments(cat, "t", 0)] == [(s.base, s.last)
                                                                                 for s in p0.segments]
    assert catalog_partitions.get_partition_states(cat, "t")[0].remote_bytes == sum(
        r.total_bytes for r in readable_segments(cat, "t", 0))
    # A block still holding partition 1's runs stays committed; the others wait for their grace period, then go.
    states = block_states(cat, blocks)
    assert {k for k, s in states.items() if s == BlockState.COMMITTED} == history.shared
    assert {k for k, s in states.items() if s == BlockState.DELETING} == blocks - history.shared
    await sweep_deleted_blocks(s3_store, acat, at(NOW_S) + GRACE + timedelta(seconds=1))
    assert [await exists(s3_store, k) for k in sorted(blocks)] == [k in history.shared for k in sorted(blocks)]
    await history.partition_1_untouched()
    history.check()

    # More history: a later local pass merges compacted segments with new ones, whose history is in runs; the
    # bucket follows with groups that replace segments and runs together.
    append_workload(p0, random_workload(random.Random(22), 40, 12), ts_ms=1_700_000_100_000)
    p0.seal_active()
    await history.commit_new()
    more = log_messages(p0)
    expected = model.compact(more, int(NOW_S * 1000) + 1000)
    compact_partition(p0, NOW_S + 1, force=True)
    again = await compactor(s3_store, acat, tmp_path, NOW_S + 1).compact("t", 0, p0, history.epoch)
    assert again.groups and again.stopped is None and again.runs_before and again.segments_before
    history.check()
    assert runs_for_range(cat, "t", 0, 1, 100_000) == []
    assert rows(await history.messages()) == rows(expected) == rows(log_messages(p0))
    await history.partition_1_untouched()
    p0.close()
    p1.close()


# Every step on SQLite, a sample on PostgreSQL (the kill -9 of a real process at every step of this pass runs on
# PostgreSQL below).
@pytest.mark.parametrize("source", ["local", "bucket"])
async def test_a_crash_at_every_step_leaves_the_runs_or_the_new_segments(s3_store, catalog_url, cat, acat, tmp_path,
                                                                         source):
    sample = every_step_on(catalog_url, "sqlite", seed=23)
    p0, p1 = logs(tmp_path, seed=23)
    history = RunHistory(s3_store, cat, p0, p1)
    await history.commit_new()
    before = log_messages(p0)
    original = {m.seq: (m.key, m.value) for m in before}
    expected = Model(RETENTION_S * 1000).compact(before, int(NOW_S * 1000))
    kept = {m.seq for m in expected}
    if source == "local":
        compact_partition(p0, NOW_S, force=True)
        leader = p0
    else:
        leader = leader_without_history(tmp_path)
    steps: list[str] = []
    async for step in crash_at_every_step(
        lambda crash: compactor(s3_store, acat, tmp_path).compact("t", 0, leader, history.epoch, force=True,
                                                                   on_step=crash),
        sample,
    ):
        steps.append(step)
        history.check()
        got = await history.messages()
        assert all(original[m.seq] == (m.key, m.value) for m in got)
        assert kept <= {m.seq for m in got}
        await history.partition_1_untouched()
    kinds = {"upload", "swap"} | ({"write"} if source == "bucket" else set())
    crashed = {s.split()[0] for s in steps}
    assert (crashed == kinds) if sample is None else (steps and crashed <= kinds), steps
    assert rows(await history.messages()) == rows(expected)
    history.check()
    await assert_bucket_holds_what_the_catalog_names(s3_store, acat, cat, "t", 0)
    await history.partition_1_untouched()
    p0.close()
    p1.close()


async def test_runs_only_in_the_bucket_are_compacted_by_a_leader_without_them(s3_store, cat, acat, tmp_path):
    p0, p1 = logs(tmp_path, seed=24)
    history = RunHistory(s3_store, cat, p0, p1)
    await history.commit_new()
    before = log_messages(p0)
    blocks = {f"blocks/t-{base}.blk" for base in history.done}
    leader = leader_without_history(tmp_path)
    model = Model(RETENTION_S * 1000)
    expected = model.compact(before, int(NOW_S * 1000))
    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, leader, history.epoch)
    assert report.groups and report.stopped is None and report.downloaded_bytes > 0
    assert report.runs_before == len(blocks) and report.bytes_after < report.bytes_before
    history.check()
    assert runs_for_range(cat, "t", 0, 1, 100_000) == []
    assert rows(await history.messages()) == rows(expected)
    states = block_states(cat, blocks)
    assert {k for k, s in states.items() if s == BlockState.COMMITTED} == history.shared
    await history.partition_1_untouched()
    assert not any((tmp_path / "work").rglob("*.ilog"))
    # In sync: nothing new, no pass; asked for by hand after the tombstones' retention, they go.
    assert (await compactor(s3_store, acat, tmp_path).compact("t", 0, leader, history.epoch)).groups == 0
    later = NOW_S + RETENTION_S + 1
    forced = await compactor(s3_store, acat, tmp_path, later).compact("t", 0, leader, history.epoch, force=True)
    assert forced.groups and rows(await history.messages()) == rows(model.compact(expected, int(later * 1000)))
    history.check()
    leader.close()
    p0.close()
    p1.close()


# Every step of both sources is crashed in process on both catalogs above; the kill -9 of a real process, a minute a
# catalog, runs on PostgreSQL here and on SQLite in test_bucket_compaction.py.
@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)
async def test_kill_9_at_every_step_of_a_pass_over_runs_from_the_bucket(s3_store, s3_endpoint, s3_bucket, catalog_url,
                                                                      cat, acat, tmp_path):
    p0, p1 = logs(tmp_path, seed=25)
    history = RunHistory(s3_store, cat, p0, p1)
    await history.commit_new()
    before = log_messages(p0)
    original = {m.seq: (m.key, m.value) for m in before}
    expected = Model(RETENTION_S * 1000).compact(before, int(NOW_S * 1000))
    kept = {m.seq for m in expected}

    async def check(step: str) -> None:
        history.check()
        got = await history.messages()
        assert all(original[m.seq] == (m.key, m.value) for m in got), step
        assert kept <= {m.seq for m in got}, step
        await history.partition_1_untouched()

    steps = await kill_9_at_every_step(catalog_url, s3_endpoint, s3_bucket, tmp_path, history.epoch, "runs", check)
    assert {s.split()[0] for s in steps} == {"write", "upload", "swap"}
    assert rows(await history.messages()) == rows(expected)
    assert runs_for_range(cat, "t", 0, 1, 100_000) == []
    history.check()
    await history.partition_1_untouched()
    p0.close()
    p1.close()
