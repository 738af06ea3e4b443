"""Unexpanded blocks (migration 0013, tiered.catalog.blocks): a committed block's runs wait packed in its row until an
expansion moves them into block_runs. Every reader finds them there, nothing that deletes or moves locations can be
undone by a later expansion, and two expanders never insert a run twice. On both backends: the commit is asked not
to expand (`expand=False`), as PostgreSQL's commit does by default."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered.catalog import blocks, compaction, locate, partitions, segments, topics
from tiered.catalog.check import check_catalog
from tiered.catalog.models import BlockRunModel
from tiered.catalog.usage import bytes_stored

from .rows import T0, run, segment


@pytest.fixture
def epochs(cat):
    topics.create_topic(cat, "t", 2)
    return {("t", p): e for p, e in partitions.claim_partitions(cat, 1, "t", [0, 1]).items()}


def commit(cat, epochs, key: str, *runs, expand: bool = False) -> int:
    block_id = blocks.insert_pending_block(cat, key, 1, 1000, now=T0)
    keys = {(r.topic, r.partition) for r in runs}
    blocks.commit_block(cat, block_id, 1, list(runs), {k: v for k, v in epochs.items() if k in keys}, now=T0,
                        expand=expand)
    return block_id


def block_run_rows(cat, block_id: int) -> int:
    from sqlalchemy import func, select

    with cat.read() as conn:
        return conn.execute(select(func.count()).select_from(BlockRunModel)
                            .where(BlockRunModel.block_id == block_id)).scalar_one()


def history(cat, epochs):
    """Partition 0: 1-10 expanded, 11-20 and 21-30 unexpanded (one block shared with partition 1's 1-5), 31-40
    expanded (expansions need not come in order)."""
    ids = [commit(cat, epochs, "blk/1", run("t", 0, 1, 10), expand=True),
           commit(cat, epochs, "blk/2", run("t", 0, 11, 20), run("t", 1, 1, 5, 100)),
           commit(cat, epochs, "blk/3", run("t", 0, 21, 30)),
           commit(cat, epochs, "blk/4", run("t", 0, 31, 40))]
    blocks.expand_blocks(cat, [ids[3]])
    return ids


def test_the_packed_runs_decode_to_what_was_committed():
    runs = [run("t", 0, 1, 10), run("ü/x", 7, 5, 9, 100, from_seq=3, epoch=4), run("t", 1, 2**40, 2**40 + 1, 2**33)]
    assert blocks.unpack_runs(blocks.pack_runs(runs)) == runs
    with pytest.raises(ValueError, match="unknown format"):
        blocks.unpack_runs(b"\x07" + blocks.pack_runs(runs)[1:])


def test_every_reader_finds_the_unexpanded_runs(cat, epochs):
    ids = history(cat, epochs)
    assert [block_run_rows(cat, i) for i in ids] == [1, 0, 0, 1]
    for seq, block_id in ((5, ids[0]), (15, ids[1]), (25, ids[2]), (35, ids[3])):
        found = blocks.find_run(cat, "t", 0, seq)
        assert found.block_id == block_id and found.holds(seq), seq
        where = locate.locate(cat, "t", 0, seq)
        assert isinstance(where, locate.InRun) and where.run == found, seq
    assert blocks.find_run(cat, "t", 1, 1).object_key == "blk/2"
    assert [r.last_seq for r in blocks.runs_for_range(cat, "t", 0, 1, 10)] == [10, 20, 30, 40]
    assert [r.last_seq for r in blocks.runs_for_range(cat, "t", 0, 12, 2)] == [20, 30]
    assert [r.last_seq for r in locate.locations(cat, "t", 0, 1, 40, first_page=1).runs] == [10, 20, 30, 40]
    nowhere = locate.locate(cat, "t", 0, 41)
    assert isinstance(nowhere, locate.Nowhere) and not nowhere.is_hole
    assert check_catalog(cat).ok, check_catalog(cat).problems
    assert check_catalog(cat).partitions[0].locations == 4
    assert bytes_stored(cat)["t"] == 5 * 100
    # Expanded, the same answers.
    assert blocks.expand_blocks(cat, ids) == 3
    assert [block_run_rows(cat, i) for i in ids] == [1, 2, 1, 1]
    assert [r.last_seq for r in blocks.runs_for_range(cat, "t", 0, 1, 10)] == [10, 20, 30, 40]
    assert check_catalog(cat).ok and bytes_stored(cat)["t"] == 5 * 100


def test_a_run_both_expanded_and_unexpanded_is_two_locations_for_the_check(cat, epochs):
    block_id = commit(cat, epochs, "blk/1", run("t", 0, 1, 10))
    with cat.write() as conn:  # an expansion that forgot to clear the packed runs
        blocks._insert_runs(None, conn, block_id, [run("t", 0, 1, 10)])
    (problem,) = check_catalog(cat).problems
    assert "seqs 1..10 have two locations" in problem and "(unexpanded)" in problem


def test_a_copy_expands_what_it_prunes_and_no_expansion_brings_it_back(cat, epochs):
    ids = history(cat, epochs)
    epoch = epochs[("t", 0)]
    segments.segment_copy_started(cat, segment("t", 0, 11, 30, epoch), now=T0)
    done = segments.segment_copy_finished(cat, "t", 0, 11, epoch, now=T0)
    assert done.pruned.runs_deleted == 2 and done.segment.from_seq == 11
    assert blocks.get_block(cat, ids[1]).state == "committed"  # partition 1's run stays in it
    assert blocks.get_block(cat, ids[2]).state == "deleting"
    assert blocks.expand_blocks(cat, ids) == 0  # the copy expanded them: nothing comes back
    assert [block_run_rows(cat, i) for i in ids] == [1, 1, 0, 1]
    assert check_catalog(cat).ok, check_catalog(cat).problems
    assert isinstance(locate.locate(cat, "t", 0, 15), locate.InSegment)


def test_a_copy_takes_its_from_seq_from_an_unexpanded_run(cat, epochs):
    commit(cat, epochs, "blk/1", run("t", 0, 5, 10, from_seq=1))  # a produce that jumped seqs 1-4
    epoch = epochs[("t", 0)]
    segments.segment_copy_started(cat, segment("t", 0, 5, 10, epoch), now=T0)
    done = segments.segment_copy_finished(cat, "t", 0, 5, epoch, now=T0)
    assert (done.segment.from_seq, done.pruned.runs_deleted) == (1, 1)
    assert check_catalog(cat).ok, check_catalog(cat).problems


def test_retention_prunes_unexpanded_runs_below_the_start(cat, epochs):
    ids = history(cat, epochs)
    partitions.set_first_available(cat, "t", 0, 31)
    assert blocks.partitions_with_runs_below_start(cat, ["t"]) == [("t", 0)]
    pruned = blocks.prune_runs_below(cat, "t", 0, 31, now=T0)
    assert (pruned.runs_deleted, pruned.blocks_marked) == (3, 2)  # blk/2 keeps partition 1's run
    assert blocks.expand_blocks(cat, ids) == 0
    assert blocks.partitions_with_runs_below_start(cat, ["t"]) == []
    assert check_catalog(cat).ok, check_catalog(cat).problems


def test_runs_below_the_start_found_among_the_unexpanded_alone(cat, epochs):
    commit(cat, epochs, "blk/1", run("t", 0, 1, 10))
    commit(cat, epochs, "blk/2", run("t", 1, 1, 10))
    partitions.set_first_available(cat, "t", 1, 11)
    assert blocks.partitions_with_runs_below_start(cat, ["t"]) == [("t", 1)]
    assert blocks.partitions_with_runs_below_start(cat, ["t"], after=("t", 1)) == []
    assert blocks.partitions_with_runs_below_start(cat, ["other"]) == []


def test_an_unexpanded_block_is_never_marked_abandoned_or_swept(cat, epochs):
    ids = history(cat, epochs)
    # A prune of partition 1 alone: blk/2 holds a run of partition 0 too, unexpanded until the prune expands it.
    partitions.set_first_available(cat, "t", 1, 6)
    assert blocks.prune_runs_below(cat, "t", 1, 6, now=T0).blocks_marked == 0
    assert blocks.abandon_block(cat, ids[2], now=T0) is False
    assert blocks.get_block(cat, ids[2]).state == "committed"
    assert blocks.blocks_to_sweep(cat, T0 + timedelta(days=1), 10) == []
    assert blocks.delete_block_rows(cat, ids) == 0
    assert check_catalog(cat).ok, check_catalog(cat).problems


def test_the_compaction_swap_expands_the_runs_it_replaces(cat, epochs):
    ids = history(cat, epochs)
    epoch = epochs[("t", 0)]
    new = [segment("t", 0, 1, 20, epoch), segment("t", 0, 21, 40, epoch)]
    swapped = compaction.swap_compacted_locations(cat, "t", 0, epoch, new, broker_id=1, now=T0)
    assert swapped.runs_removed == 4
    assert blocks.expand_blocks(cat, ids) == 0
    assert blocks.runs_for_range(cat, "t", 0, 1, 10) == []
    assert check_catalog(cat).ok, check_catalog(cat).problems


def test_the_sweep_finds_the_blocks_left_unexpanded(cat, epochs):
    ids = history(cat, epochs)
    assert blocks.unexpanded_blocks(cat, T0) == []  # committed at T0: not older than T0
    assert blocks.unexpanded_blocks(cat, T0 + timedelta(seconds=5)) == [ids[1], ids[2]]
    assert blocks.unexpanded_blocks(cat, T0 + timedelta(seconds=5), limit=1) == [ids[1]]
    assert blocks.expand_blocks(cat, blocks.unexpanded_blocks(cat, T0 + timedelta(seconds=5))) == 3
    assert blocks.unexpanded_blocks(cat, T0 + timedelta(seconds=5)) == []


def in_threads(*fns) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(fn):
        try:
            fn()
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.fixture
def pg_cat(request, tmp_path):
    from tests.support.postgres import fresh_catalog_url
    from tiered.catalog import Catalog

    catalog = Catalog.open(fresh_catalog_url(request, "postgresql", tmp_path))
    yield catalog
    catalog.close()


def test_two_expanders_insert_each_run_once(pg_cat):
    """Two brokers' sweeps (or a sweep and the committer) expanding the same blocks at once."""
    cat = pg_cat
    topics.create_topic(cat, "t", 2)
    epochs = {("t", p): e for p, e in partitions.claim_partitions(cat, 1, "t", [0, 1]).items()}
    ids = [commit(cat, epochs, f"blk/{i}", run("t", 0, i + 1, i + 1), run("t", 1, i + 1, i + 1, 100))
           for i in range(30)]
    counts: list[int] = []
    assert in_threads(lambda: counts.append(blocks.expand_blocks(cat, ids)),
                      lambda: counts.append(blocks.expand_blocks(cat, reversed(ids)))) == []
    assert sum(counts) == 60
    assert [block_run_rows(cat, i) for i in ids] == [2] * 30
    assert check_catalog(cat).ok, check_catalog(cat).problems


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(1, 31), expand_first=st.sets(st.integers(0, 9)))
def test_an_expander_against_a_prune_never_leaves_a_pruned_run(pg_cat, start, expand_first):
    """Blocks expanding on one thread while retention prunes below `start` on another: afterwards no run of
    partition 0 ends below the start, every block holding none is `deleting` or still holds partition 1's run, and
    the check is clean."""
    cat = pg_cat
    from sqlalchemy import text

    with cat.write() as conn:  # a fresh history for every example
        for table in ("block_runs", "blocks", "segments", "partition_epochs", "partitions", "topics"):
            conn.execute(text(f"DELETE FROM {table}"))
    topics.create_topic(cat, "t", 2)
    epochs = {("t", p): e for p, e in partitions.claim_partitions(cat, 1, "t", [0, 1]).items()}
    ids = [commit(cat, epochs, f"blk/{i}", run("t", 0, 3 * i + 1, 3 * i + 3), run("t", 1, i + 1, i + 1, 100))
           for i in range(10)]
    blocks.expand_blocks(cat, [ids[i] for i in expand_first])
    partitions.set_first_available(cat, "t", 0, start)

    def prune():
        while blocks.prune_runs_below(cat, "t", 0, start, limit=2, now=T0).runs_deleted:
            pass

    assert in_threads(lambda: blocks.expand_blocks(cat, ids), prune) == []
    prune()  # what a pass that found runs left below the start does next
    assert blocks.partitions_with_runs_below_start(cat, ["t"]) == []
    assert all(r.last_seq >= start for r in blocks.runs_for_range(cat, "t", 0, 1, 100))
    assert check_catalog(cat).ok, check_catalog(cat).problems
