"""Leadership history (claim_leadership) and the consistency check (tiered.catalog.check), on both backends."""

from __future__ import annotations

from tiered.catalog import Catalog
from tiered.catalog.blocks import commit_block, expand_blocks, insert_pending_block, prune_runs_below
from tiered.catalog.check import check_catalog
from tiered.catalog.partitions import EpochRow, claim_leadership, claim_partitions
from tiered.catalog.segments import segment_copy_finished, segment_copy_started
from tiered.catalog.topics import create_topic

from .rows import T0, run, segment


def test_a_claim_records_its_epoch_and_returns_the_history_since(cat):
    create_topic(cat, "t", 2)
    first = claim_leadership(cat, 1, "disk-a", "t", {0: None, 1: None})
    assert {p: c.epoch for p, c in first.items()} == {0: 1, 1: 1}
    assert first[0].before.leader_broker is None and first[0].history == ()  # nothing asked about
    block = insert_pending_block(cat, "blk/1", 1, 1, now=T0)
    commit_block(cat, block, 1, [run("t", 0, 1, 10)], {("t", 0): 1})
    claim_leadership(cat, 2, "disk-b", "t", {0: None})  # another volume: epoch 2, from seq 11
    again = claim_leadership(cat, 1, "disk-a", "t", {0: 1, 1: 1})
    assert again[0].before.leader_broker == 2 and again[0].before.hwmark_seq == 10
    assert again[0].history == (EpochRow(2, 2, "disk-b", 11), EpochRow(3, 1, "disk-a", 11))
    assert again[1].history == (EpochRow(2, 1, "disk-a", 1),)


def test_claims_of_many_partitions_go_in_batches(cat):
    create_topic(cat, "wide", 1200)
    claims = claim_leadership(cat, 1, "d", "wide", {p: None for p in range(1200)})
    assert len(claims) == 1200 and {c.epoch for c in claims.values()} == {1}
    again = claim_leadership(cat, 1, "d", "wide", {p: 1 for p in range(1200)})
    assert all(c.history == (EpochRow(2, 1, "d", 1),) for c in again.values())


def committed(cat, key: str, *runs) -> int:
    block = insert_pending_block(cat, key, 1, 1, now=T0)
    commit_block(cat, block, 1, list(runs), {("t", 0): 1})
    expand_blocks(cat, [block])  # as the broker does after the acknowledgements
    return block


def test_a_consistent_catalog_passes(cat):
    create_topic(cat, "t", 2)
    claim_partitions(cat, 1, "t", [0, 1])
    committed(cat, "blk/1", run("t", 0, 1, 10))
    committed(cat, "blk/2", run("t", 0, 11, 20))
    committed(cat, "blk/3", run("t", 0, 40, 50, from_seq=21))  # a jump: 21..39 answered by the run from 40
    segment_copy_started(cat, segment("t", 0, 1, 20, 1), now=T0)
    assert segment_copy_finished(cat, "t", 0, 1, 1, now=T0).pruned.runs_deleted == 2
    report = check_catalog(cat)
    assert report.ok, report.problems
    assert [(p.partition, p.locations) for p in report.partitions] == [(0, 2), (1, 0)]


def test_a_hole_is_reported(cat):
    """What the old prune did after a disk loss: the runs of the lost tail deleted, no segment holding their seqs."""
    create_topic(cat, "t", 1)
    claim_partitions(cat, 1, "t", [0])
    committed(cat, "blk/1", run("t", 0, 1, 10))
    committed(cat, "blk/2", run("t", 0, 11, 20))
    committed(cat, "blk/3", run("t", 0, 21, 30))
    from sqlalchemy import delete

    from tiered.catalog.models import BlockRunModel

    with cat.write() as conn:
        conn.execute(delete(BlockRunModel).where(BlockRunModel.first_seq == 11))
    assert check_catalog(cat).problems == ["t/0: seqs 11..20 have no location"]


def test_two_locations_for_one_seq_are_reported(cat):
    create_topic(cat, "t", 1)
    claim_partitions(cat, 1, "t", [0])
    committed(cat, "blk/1", run("t", 0, 1, 10))
    segment_copy_started(cat, segment("t", 0, 5, 10, 1), now=T0)
    segment_copy_finished(cat, "t", 0, 5, 1, now=T0)  # a segment that does not hold the whole run: both stay
    problems = check_catalog(cat).problems
    assert len(problems) == 1 and "seqs 5..10 have two locations" in problems[0]


def test_a_run_whose_block_row_is_gone_or_not_committed_is_reported(cat):
    """No foreign key holds block_runs to blocks (migration 0005): the check stands in for it."""
    from sqlalchemy import delete, update

    from tiered.catalog.models import BlockModel

    create_topic(cat, "t", 1)
    claim_partitions(cat, 1, "t", [0])
    first = committed(cat, "blk/1", run("t", 0, 1, 10))
    second = committed(cat, "blk/2", run("t", 0, 11, 20))
    assert check_catalog(cat).ok
    with cat.write() as conn:
        conn.execute(delete(BlockModel).where(BlockModel.block_id == first))
        conn.execute(update(BlockModel).where(BlockModel.block_id == second).values(state="deleting"))
    assert check_catalog(cat).problems == [f"t/0: run block {first}@0: its block row is missing",
                                           "t/0: run blk/2@0: its block is deleting, not committed"]


def test_retention_leftovers_below_the_start_are_not_problems(cat):
    create_topic(cat, "t", 1)
    claim_partitions(cat, 1, "t", [0])
    committed(cat, "blk/1", run("t", 0, 1, 10))
    committed(cat, "blk/2", run("t", 0, 11, 20))
    from tiered.catalog.partitions import set_first_available

    set_first_available(cat, "t", 0, 11)
    assert check_catalog(cat).ok
    prune_runs_below(cat, "t", 0, 11, now=T0)
    assert check_catalog(cat).ok


def test_the_check_command_reports_problems_and_exits_1(tmp_path):
    import subprocess
    import sys

    from tiered.catalog.migrate import upgrade

    url = f"sqlite:///{tmp_path}/c.db"
    upgrade(url)
    command = [sys.executable, "-m", "tiered.cli.main", "catalog", "check", "--catalog", url]
    with Catalog.open(url) as cat:
        create_topic(cat, "t", 1)
        claim_partitions(cat, 1, "t", [0])
        committed(cat, "blk/1", run("t", 0, 1, 10))
    ok = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout == "" and "1 partitions, 1 locations checked: ok" in ok.stderr
    with Catalog.open(url) as cat, cat.write() as conn:
        from sqlalchemy import update

        from tiered.catalog.models import PartitionModel

        conn.execute(update(PartitionModel).values(hwmark_seq=15))  # seqs the catalog says it has and does not
    bad = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stdout.splitlines() == ["t/0: seqs 11..15 have no location"]
