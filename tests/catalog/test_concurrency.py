"""Concurrent commits and prunes, lock timeouts, and PostgreSQL going away mid-commit."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from sqlalchemy import event

from tiered.catalog import Catalog, CatalogUnavailable
from tiered.catalog.blocks import (
    abandon_block,
    commit_block,
    expand_blocks,
    find_run,
    get_block,
    insert_pending_block,
    prune_runs_below,
    runs_for_range,
)
from tiered.catalog.errors import Discontinuity
from tiered.catalog.partitions import claim_partitions, get_partition_states
from tiered.catalog.topics import create_topic

from tests.support.postgres import libpq_url

from .rows import T0, run

PARTITIONS = 6
BLOCKS_PER_THREAD = 30


def in_threads(*workers) -> list[BaseException]:
    """Runs each worker in its own thread; returns what they raised."""
    errors: list[BaseException] = []

    def guard(worker):
        try:
            worker()
        except BaseException as error:  # reported to the test, which asserts there are none
            errors.append(error)

    threads = [threading.Thread(target=guard, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a worker is stuck"
    return errors


@pytest.fixture
def epochs(cat):
    create_topic(cat, "t", PARTITIONS)
    return {("t", p): e for p, e in claim_partitions(cat, 1, "t", range(PARTITIONS)).items()}


def commit_in_thread(cat, block_id, runs, epochs, **kwargs) -> tuple[threading.Thread, list[object]]:
    """commit_block by broker 1 on a thread of its own, started: its outcome (the result or the error) is appended
    to the list once it returns."""
    outcome: list[object] = []

    def commit():
        try:
            outcome.append(commit_block(cat, block_id, 1, runs, epochs, **kwargs))
        except Exception as error:  # asserted by the caller
            outcome.append(error)

    committer = threading.Thread(target=commit)
    committer.start()
    return committer, outcome


def test_commits_sharing_partitions_do_not_deadlock(cat, epochs):
    """Two committers whose blocks hold the same partitions, listed in opposite orders: the sorted row locks make
    them queue, never deadlock (PostgreSQL would abort one with a deadlock error after deadlock_timeout)."""

    def committer(tag: str, order):
        done = attempt = 0
        while done < BLOCKS_PER_THREAD:
            attempt += 1
            marks = {s.partition: s.hwmark_seq for s in get_partition_states(cat, "t")}
            block_id = insert_pending_block(cat, f"blk/{tag}/{attempt}", 1, 600, now=T0)
            runs = [run("t", p, marks[p] + 1, marks[p] + 10, p * 100) for p in order]
            try:
                commit_block(cat, block_id, 1, runs, epochs, now=T0)
                done += 1
            except Discontinuity:  # the other committer got there first: continue from its hwmark
                abandon_block(cat, block_id, now=T0)

    forward, backward = list(range(PARTITIONS)), list(reversed(range(PARTITIONS)))
    assert in_threads(lambda: committer("f", forward), lambda: committer("b", backward)) == []
    for state in get_partition_states(cat, "t"):
        assert state.hwmark_seq == 2 * BLOCKS_PER_THREAD * 10
        runs = runs_for_range(cat, "t", state.partition, 1, 1000)
        assert len(runs) == 2 * BLOCKS_PER_THREAD
        assert [r.from_seq for r in runs] == [10 * i + 1 for i in range(2 * BLOCKS_PER_THREAD)]


def test_concurrent_prunes_of_shared_blocks_mark_every_block(cat, epochs):
    """Each block holds runs of two partitions, pruned by two threads at once: whichever deletes a block's last
    run must see the other's delete and mark the block. A block left `committed` without runs would leak."""
    ids = []
    for i in range(40):
        block_id = insert_pending_block(cat, f"blk/{i}", 1, 200, now=T0)
        commit_block(cat, block_id, 1, [run("t", 0, i + 1, i + 1), run("t", 1, i + 1, i + 1, 100)], epochs)
        ids.append(block_id)
    expand_blocks(cat, ids)  # as the broker does after the acknowledgements (unexpanded: the test below)

    def pruner(partition):
        while prune_runs_below(cat, "t", partition, 41, limit=1, now=T0).runs_deleted:
            pass

    if cat.backend == "postgresql":
        # Worst case, every time: both threads have deleted their run of the same block (neither committed)
        # before either looks for remaining runs. (SQLite's BEGIN IMMEDIATE runs the two prunes one by one.)
        both_deleted = threading.Barrier(2, timeout=10)

        def after_execute(_conn, _cursor, statement, *_args):
            if statement.startswith("DELETE FROM block_runs"):
                both_deleted.wait()

        event.listen(cat.engine, "after_cursor_execute", after_execute)
    assert in_threads(lambda: pruner(0), lambda: pruner(1)) == []
    assert [get_block(cat, i).state for i in ids] == ["deleting"] * len(ids)


def hold_partition_lock(url: str, partition: int) -> psycopg.Connection:
    """Another session holding the partition row's lock, as a slow committer would."""
    conninfo = libpq_url(url)
    conn = psycopg.connect(conninfo)
    conn.execute("SELECT 1 FROM partitions WHERE topic = 't' AND partition = %s FOR UPDATE", (partition,))
    return conn


def wait_until_blocked(url: str) -> None:
    conninfo = libpq_url(url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for _ in range(200):
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%UPDATE%partitions%'"
            ).fetchone()[0]
            if waiting:
                return
            time.sleep(0.05)
    raise AssertionError("the commit never waited for the lock")


def end_waiting_commits(url: str) -> None:
    """Ends the backends of the commits waiting for a partition's lock, and waits (5 s at most) until they are gone."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        ended = conn.execute(
            "SELECT bool_and(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%UPDATE%partitions%'"
        ).fetchone()[0]
    assert ended, "the waiting commit's backend did not end"


def test_a_lock_wait_times_out_as_catalog_unavailable(catalog_url, epochs):
    impatient = Catalog.open(catalog_url, lock_timeout_ms=200)
    block_id = insert_pending_block(impatient, "blk/1", 1, 100, now=T0)
    if impatient.backend == "postgresql":
        holder = hold_partition_lock(catalog_url, 0)
    else:
        holder = impatient.engine.raw_connection()
        holder.driver_connection.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(CatalogUnavailable):
            commit_block(impatient, block_id, 1, [run("t", 0, 1, 5)], epochs)
        assert time.monotonic() - started < 5
    finally:
        holder.rollback()
        holder.close()
    assert get_block(impatient, block_id).state == "pending"
    assert commit_block(impatient, block_id, 1, [run("t", 0, 1, 5)], epochs) == {("t", 0): 5}
    impatient.close()


def test_a_lock_wait_in_the_runs_copy_times_out_as_catalog_unavailable(pg_url):
    """PostgreSQL receives the runs as a COPY on the driver's cursor, outside SQLAlchemy's error translation: a lock
    wait there times out as CatalogUnavailable too, nothing of the commit or the expansion is kept, and the same
    Catalog commits and expands the block once the lock is gone (the connection it lost is not handed out again)."""
    impatient = Catalog.open(pg_url, lock_timeout_ms=200)
    create_topic(impatient, "t", 1)
    epochs = claim_partitions(impatient, 1, "t", [0])
    epochs = {("t", 0): epochs[0]}
    block_id = insert_pending_block(impatient, "blk/1", 1, 100, now=T0)
    holder = psycopg.connect(libpq_url(pg_url))
    holder.execute("LOCK TABLE block_runs IN EXCLUSIVE MODE")  # as a long reindex would
    try:
        with pytest.raises(CatalogUnavailable, match="lock timeout"):
            commit_block(impatient, block_id, 1, [run("t", 0, 1, 5)], epochs, expand=True)
        assert get_block(impatient, block_id).state == "pending"
        assert [s.hwmark_seq for s in get_partition_states(impatient, "t")][0] == 0
        assert commit_block(impatient, block_id, 1, [run("t", 0, 1, 5)], epochs, expand=False) == {("t", 0): 5}
        with pytest.raises(CatalogUnavailable, match="lock timeout"):
            expand_blocks(impatient, [block_id])
        assert find_run(impatient, "t", 0, 3).block_id == block_id  # still readable, from the block's row
    finally:
        holder.rollback()
        holder.close()
    assert get_block(impatient, block_id).state == "committed"
    assert expand_blocks(impatient, [block_id]) == 1
    assert find_run(impatient, "t", 0, 3).block_id == block_id
    assert find_run(impatient, "t", 0, 3).object_key == "blk/1"
    impatient.close()


def test_a_refusal_whose_reason_is_gone_by_the_time_it_is_asked_commits_on_the_next_try(pg_url):
    """The commit's UPDATE refuses a partition; before the second transaction asks why, another transaction makes it
    continue. The commit does not invent a reason: it tries again, and lands. Sequenced on PostgreSQL with a row
    lock: the other session holds partition 1, so the UPDATE, past partition 0 (refused: a seq is missing), waits
    there; meanwhile that session raises partition 0 to the missing seq, then lets go."""
    cat = Catalog.open(pg_url)
    create_topic(cat, "t", 2)
    epochs = {("t", p): e for p, e in claim_partitions(cat, 1, "t", [0, 1]).items()}
    first = insert_pending_block(cat, "blk/1", 1, 100, now=T0)
    commit_block(cat, first, 1, [run("t", 0, 1, 4), run("t", 1, 1, 4, 100)], epochs)
    block_id = insert_pending_block(cat, "blk/2", 1, 100, now=T0)
    runs = [run("t", 0, 6, 8), run("t", 1, 5, 9, 100)]  # partition 0 lacks seq 5 until the other session adds it
    other = psycopg.connect(libpq_url(pg_url))
    other.execute("SELECT 1 FROM partitions WHERE topic = 't' AND partition = 1 FOR UPDATE")
    committer, outcome = commit_in_thread(cat, block_id, runs, epochs)
    try:
        wait_until_blocked(pg_url)
        other.execute("UPDATE partitions SET hwmark_seq = 5 WHERE topic = 't' AND partition = 0")
        other.commit()
        committer.join(30)
    finally:
        other.close()
    assert outcome == [{("t", 0): 8, ("t", 1): 9}]
    assert [s.hwmark_seq for s in get_partition_states(cat, "t")] == [8, 9]
    assert get_block(cat, block_id).state == "committed"
    cat.close()


@pytest.fixture
def pg_cat(pg_url):
    catalog = Catalog.open(pg_url)
    yield catalog
    catalog.close()


def test_postgresql_restart_mid_commit(pg_cluster, pg_url, pg_cat):
    """The server goes away while a commit waits inside its transaction: the commit fails as CatalogUnavailable,
    nothing of it is kept, and once the server is back the same Catalog (its pool re-checked) commits the block."""
    create_topic(pg_cat, "t", 2)
    epochs = {("t", p): e for p, e in claim_partitions(pg_cat, 1, "t", [0, 1]).items()}
    block_id = insert_pending_block(pg_cat, "blk/1", 1, 200, now=T0)
    runs = [run("t", 0, 1, 10), run("t", 1, 1, 3, 100)]
    holder = hold_partition_lock(pg_url, 1)
    committer, outcome = commit_in_thread(pg_cat, block_id, runs, epochs, now=T0)
    try:
        wait_until_blocked(pg_url)
        # The commit's own backend ends first, while the lock is still held: a fast shutdown alone ends the holder
        # too, and the commit could take the lock and commit before its own end came (seen once in CI).
        end_waiting_commits(pg_url)
        pg_cluster.stop("fast")
        committer.join(30)
    finally:
        pg_cluster.start()
        holder.close()
    assert len(outcome) == 1 and isinstance(outcome[0], CatalogUnavailable), outcome
    assert get_block(pg_cat, block_id).state == "pending"
    assert find_run(pg_cat, "t", 0, 1) is None
    assert [s.hwmark_seq for s in get_partition_states(pg_cat, "t")] == [0, 0]
    assert commit_block(pg_cat, block_id, 1, runs, epochs, now=T0) == {("t", 0): 10, ("t", 1): 3}
    assert find_run(pg_cat, "t", 1, 2).object_key == "blk/1"
