"""Every lookup is an index scan (docs/architecture.md, "Catalog"): the statements each query function sends are
captured and EXPLAINed on both backends. On PostgreSQL sequential scans are disabled for the EXPLAIN, so a statement
that no index can serve still shows as a Seq Scan (or as an index scan without an Index Cond)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import event

from tiered.catalog import Catalog, SegmentState, blocks, partitions, segments, topics

from .rows import T0, run, segment


def explain(cat, call) -> list[tuple[str, str]]:
    """Runs `call`, then EXPLAINs every statement it sent: [(statement, plan text)]."""
    sent = []

    def capture(_conn, _cursor, statement, parameters, _context, executemany):
        sent.append((statement, parameters[0] if executemany else parameters))

    event.listen(cat.engine, "before_cursor_execute", capture)
    try:
        call()
    finally:
        event.remove(cat.engine, "before_cursor_execute", capture)
    plans = []
    with cat.engine.connect() as conn:
        if cat.backend == "postgresql":
            conn.exec_driver_sql("SET enable_seqscan = off")
            for statement, parameters in sent:
                rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).all()
                plans.append((statement, "\n".join(r[0] for r in rows)))
        else:
            for statement, parameters in sent:
                rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
                plans.append((statement, "\n".join(r[3] for r in rows)))
        conn.rollback()
    return plans


def full_scans(backend: str, plan: str) -> list[str]:
    if backend == "postgresql":
        nodes = re.split(r"->", plan)
        return [
            n.strip().splitlines()[0]
            for n in nodes
            if "Seq Scan" in n or (re.search(r"Index (Only )?Scan", n) and "Index Cond" not in n
                                   and not _reads_the_unexpanded(n))
        ]
    # A scan of json_each reads the rows the statement was given (tiered.catalog.arrays), not a table; a scan of
    # `anon_N` reads what a subquery (limited, searched by its own lines) gave.
    return [line for line in plan.splitlines()
            if line.startswith("SCAN ") and "CONSTANT ROW" not in line and not line.startswith("SCAN json_each")
            and not line.startswith("SCAN anon_") and not _reads_the_unexpanded(line)]


def _reads_the_unexpanded(node: str) -> bool:
    """A walk of ix_blocks_runs_pending alone: the partial index holds only the unexpanded blocks, a handful at any
    time (tiered.catalog.blocks), so reading all of it is what asking for them costs."""
    return "ix_blocks_runs_pending" in node


@pytest.fixture
def filled(cat):
    """Two topics, committed blocks spanning both, remote segments, and blocks in every state."""
    topics.create_topic(cat, "a", 2)
    topics.create_topic(cat, "b", 1)
    epochs = {("a", p): e for p, e in partitions.claim_partitions(cat, 1, "a", [0, 1]).items()}
    epochs[("b", 0)] = partitions.claim_partitions(cat, 1, "b", [0])[0]
    for i in range(20):
        block_id = blocks.insert_pending_block(cat, f"blk/{i}", 1, 300, now=T0)
        runs = [run("a", 0, 10 * i + 1, 10 * i + 10, 0), run("a", 1, i + 1, i + 1, 100), run("b", 0, i + 1, i + 1, 200)]
        blocks.commit_block(cat, block_id, 1, runs, epochs, now=T0)
        blocks.expand_blocks(cat, [block_id])  # as the broker does after the acknowledgements
    for i in range(5):
        segments.segment_copy_started(cat, segment("a", 0, 10 * i + 1, 10 * i + 10, epochs[("a", 0)]), now=T0)
        segments.segment_copy_finished(cat, "a", 0, 10 * i + 1, epochs[("a", 0)], now=T0)
    blocks.insert_pending_block(cat, "blk/pending", 1, 10, now=T0)
    return epochs


LOOKUPS = {
    "find_run": (lambda c: blocks.find_run(c, "a", 0, 55), "ix_block_runs_lookup"),
    "runs_for_range": (lambda c: blocks.runs_for_range(c, "a", 0, 55, 5), "ix_block_runs_lookup"),
    "find_remote_segment": (lambda c: segments.find_remote_segment(c, "a", 0, 25), "ix_segments_lookup"),
    "readable_segments_from": (lambda c: segments.readable_segments_from(c, "a", 0, 25, 2), "ix_segments_lookup"),
    "highest_copied_seq": (lambda c: segments.highest_copied_seq(c, "a", 0), "ix_segments_lookup"),
    "remote_retention": (
        lambda c: segments.segments_for_remote_retention(c, "a", 0, now=T0, max_age=timedelta(0), max_bytes=None),
        "ix_segments_lookup",
    ),
    "list_segments": (lambda c: segments.list_segments(c, "a", 0, after_base_seq=20), "segments"),
    "unfinished_deletions": (
        lambda c: segments.list_segments(c, "a", 0, states=(SegmentState.DELETE_STARTED,), limit=10),
        "ix_segments_delete_started",
    ),
    "blocks_to_sweep": (lambda c: blocks.blocks_to_sweep(c, T0, 10), "ix_blocks_state_delete_after"),
    "pending_blocks": (lambda c: blocks.pending_blocks_older_than(c, T0, 10), "ix_blocks_state_created_at"),
    "known_object_keys": (lambda c: blocks.known_object_keys(c, ["blk/3", "nope"]), "object_key"),
    "partition_states": (lambda c: partitions.get_partition_states(c, "a"), "partitions"),
}


@pytest.mark.parametrize("name", LOOKUPS)
def test_lookups_are_index_scans(cat, filled, name):
    call, index = LOOKUPS[name]
    [(statement, plan)] = explain(cat, lambda: call(cat))
    assert full_scans(cat.backend, plan) == [], plan
    assert index in plan, plan


def test_find_run_reads_the_covering_index_only_on_postgresql(cat, filled):
    [(_, plan)] = explain(cat, lambda: blocks.find_run(cat, "a", 0, 55))
    if cat.backend == "postgresql":
        assert "Index Only Scan using ix_block_runs_lookup" in plan, plan
        assert "pk_blocks" in plan, plan  # the object key: one primary key probe
    else:
        assert "SEARCH block_runs USING INDEX ix_block_runs_lookup" in plan, plan


def test_runs_for_range_reads_the_covering_index_only_too(cat, filled):
    """The timestamp bounds replay planning prunes by are in the index: runs_for_range visits no run row either."""
    [(_, plan)] = explain(cat, lambda: blocks.runs_for_range(cat, "a", 0, 55, 5))
    if cat.backend == "postgresql":
        assert "Index Only Scan using ix_block_runs_lookup" in plan, plan
    else:
        assert "SEARCH block_runs USING INDEX ix_block_runs_lookup" in plan, plan


def test_writes_touch_rows_through_indexes(cat, filled):
    epochs = filled
    block_id = blocks.insert_pending_block(cat, "blk/new", 1, 10, now=T0)
    block_runs = [run("a", 0, 500, 510, from_seq=201), run("b", 0, 500, 500, 100, from_seq=21)]
    calls = [
        lambda: blocks.commit_block(cat, block_id, 1, block_runs, epochs, now=T0),
        lambda: blocks.prune_runs_below(cat, "a", 0, 50, now=T0),
        lambda: blocks.prune_runs_within(cat, "a", 0, 51, 60, now=T0),
        lambda: segments.segment_copy_started(cat, segment("a", 0, 61, 70, epochs[("a", 0)]), now=T0),
        lambda: segments.segment_copy_finished(cat, "a", 0, 61, epochs[("a", 0)], now=T0),
        lambda: segments.segment_copy_started(cat, segment("a", 0, 71, 80, epochs[("a", 0)]), now=T0),
        lambda: blocks.abandon_block(cat, blocks.pending_blocks_older_than(cat, T0 + timedelta(1), 1)[0].block_id),
        lambda: blocks.delete_block_rows(cat, [1, 2]),
        lambda: partitions.claim_partitions(cat, 2, "a", [0, 1]),
        lambda: segments.segment_delete_started(cat, "a", 0, 1),
        # After the claim above: the copy of 71-80 started under the older epoch is abandoned.
        lambda: segments.segment_copy_abandoned(cat, "a", 0, 71, epochs[("a", 0)] + 1,
                                                older_than=T0 + timedelta(1), now=T0),
    ]
    for call in calls:
        for statement, plan in explain(cat, call):
            assert full_scans(cat.backend, plan) == [], f"{statement}\n{plan}"
    assert segments.get_segment(cat, "a", 0, 71).state == SegmentState.DELETE_STARTED


def test_unfinished_deletions_skip_the_deleted_history(cat, filled):
    """Remote retention's first lookup reads the segments left in DELETE_STARTED through their partial index alone,
    not through every DELETE_FINISHED row of the partition (the primary key would walk them all)."""
    epoch = filled[("a", 0)]
    for i in range(5, 40):
        base = 10 * i + 1
        segments.segment_copy_started(cat, segment("a", 0, base, base + 9, epoch), now=T0)
        segments.segment_copy_finished(cat, "a", 0, base, epoch, now=T0)
        segments.segment_delete_started(cat, "a", 0, base, now=T0)
        if i != 38:
            segments.segment_delete_finished(cat, "a", 0, base, now=T0)
    listed = []
    [(_, plan)] = explain(cat, lambda: listed.extend(
        segments.list_segments(cat, "a", 0, states=(SegmentState.DELETE_STARTED,), limit=10)))
    assert [s.base_seq for s in listed] == [381]
    assert "ix_segments_delete_started" in plan and full_scans(cat.backend, plan) == [], plan


@pytest.mark.parametrize("call, index", [
    (lambda c: segments.partitions_mid_deletion(c), "ix_segments_delete_started"),
    (lambda c: segments.partitions_with_stale_copies(c, older_than=T0), "ix_segments_copy_started"),
], ids=["mid_deletion", "stale_copies"])
def test_the_periodic_passes_read_only_their_partial_index(cat, filled, call, index):
    """The remote passes ask which led partitions have something to do across all partitions at once: a read of
    the whole partial index, which holds only the rows mid-deletion (or being copied), never of the segments
    table, so that the look costs what is in flight, not how many segments or partitions exist."""
    [(_, plan)] = explain(cat, lambda: call(cat))
    scans = full_scans(cat.backend, plan)
    assert index in plan, plan
    assert all(index in scan for scan in scans), plan  # a full scan, if any, of the partial index only


DUE_LIMITS = [segments.RetentionLimits(("a", "b"), timedelta(days=1), None),
              segments.RetentionLimits(("a",), None, 100), segments.RetentionLimits(("b",), timedelta(hours=1), 10)]


@pytest.mark.parametrize("after", [None, ("a", 0)], ids=["first_page", "next_page"])
def test_the_retention_selection_reads_only_what_is_past_its_limits(cat, filled, after):
    """partitions_due_for_retention: one statement over every led topic, each part a range scan of an index that
    holds what is past a limit (readable segments by topic and freeze time, partitions by topic and remote bytes),
    never a read of every partition's oldest segments. The pages' cursor keeps them range scans."""
    named = []
    [(_, plan)] = explain(cat, lambda: named.extend(
        segments.partitions_due_for_retention(cat, DUE_LIMITS, now=T0, after=after)))
    assert named == ([("a", 0)] if after is None else [])  # 5 segments of 10 bytes and their indexes: over 100
    assert full_scans(cat.backend, plan) == [], plan
    # On these few rows a planner may walk the readable segments of the topics by ix_segments_lookup instead (both
    # partial, readable segments only); at scale it is ix_segments_expiry (the tests below).
    assert "ix_partitions_remote_bytes" in plan, plan
    assert "ix_segments_expiry" in plan or "ix_segments_lookup" in plan, plan


def test_runs_below_the_start_are_probed_per_partition_by_index(cat, filled):
    """partitions_with_runs_below_start (once a grace period): the topics' partition rows by primary key, each a
    probe of ix_block_runs_lookup."""
    partitions.set_first_available(cat, "a", 0, 65)  # segments hold 1-50; the runs of 51-60 end below it
    named = []
    [(_, plan), (_, pending)] = explain(cat, lambda: named.extend(
        blocks.partitions_with_runs_below_start(cat, ["a", "b"])))
    assert named == [("a", 0)]
    assert full_scans(cat.backend, plan) == [], plan
    assert "ix_block_runs_lookup" in plan, plan
    assert full_scans(cat.backend, pending) == [] and "ix_blocks_runs_pending" in pending, pending
    [(_, plan), _] = explain(cat, lambda: named.extend(
        blocks.partitions_with_runs_below_start(cat, ["a", "b"], after=("a", 0))))  # the next page: none
    assert named == [("a", 0)] and full_scans(cat.backend, plan) == [], plan


def test_an_unexpanded_block_is_found_through_its_partial_index(cat, filled):
    """A lookup the rows do not answer (the seq's block not expanded yet) reads the rows again and the unexpanded
    blocks in one snapshot: the rows by ix_block_runs_lookup, the blocks by ix_blocks_runs_pending alone."""
    block_id = blocks.insert_pending_block(cat, "blk/new", 1, 10, now=T0)
    blocks.commit_block(cat, block_id, 1, [run("a", 0, 201, 210)], {("a", 0): filled[("a", 0)]}, now=T0,
                        expand=False)
    found = []
    plans = explain(cat, lambda: found.append(blocks.find_run(cat, "a", 0, 205)))
    assert found[0].block_id == block_id and found[0].holds(205)
    assert len(plans) == 3, plans  # the fast path's one statement, then the snapshot's two
    for statement, plan in plans:
        assert full_scans(cat.backend, plan) == [], f"{statement}\n{plan}"
    assert "ix_blocks_runs_pending" in plans[2][1], plans[2][1]
    # Expanded, the fast path answers alone again.
    blocks.expand_blocks(cat, [block_id])
    assert len(explain(cat, lambda: blocks.find_run(cat, "a", 0, 205))) == 1
    assert len(explain(cat, lambda: blocks.expand_blocks(cat, [block_id]))) == 1  # nothing left: the claim finds none


def test_a_full_scan_is_seen(cat, filled):
    """The check above can fail: a lookup by an unindexed column is reported."""
    from sqlalchemy import select

    from tiered.catalog.models import BlockModel

    def unindexed():
        with cat.read() as conn:
            conn.execute(select(BlockModel.block_id).where(BlockModel.size_bytes == 300)).all()

    [(_, plan)] = explain(cat, unindexed)
    assert full_scans(cat.backend, plan) != [], plan


# -- at scale: real statistics, generic plans ------------------------------------------------------------------------

BULK_PARTITIONS, BULK_RUNS, BULK_SEGMENTS = 1000, 50_000, 50_000  # 50 runs and 50 segments per partition


def bulk_load(conn, partitions: int, runs: int, segments: int, runs_per_block: int = 50) -> None:
    """Topic `bulk`: `partitions` partitions, `runs` committed block runs (100 seqs each) and `segments` readable
    remote segments (1,000 seqs each) spread over them, written by generate_series in a few statements. Block ids
    start at 10**9, past any the sequence hands out."""
    conn.exec_driver_sql(
        "INSERT INTO topics (name, partitions, config_text, created_at) VALUES ('bulk', %(p)s, '', now())",
        {"p": partitions})
    conn.exec_driver_sql(
        "INSERT INTO partitions (topic, partition, leader_epoch, first_available_seq, hwmark_seq, remote_bytes,"
        " change_version) SELECT 'bulk', g, 1, 1, (%(r)s / %(p)s) * 100, 0, g + 1 FROM generate_series(0, %(p)s - 1) g",
        {"p": partitions, "r": runs})
    conn.exec_driver_sql(
        "INSERT INTO blocks (block_id, object_key, state, broker_id, size_bytes, created_at, committed_at)"
        " SELECT 1000000000 + g, 'bulk/blk/' || g, 'committed', 1, 8388608, now(), now()"
        " FROM generate_series(0, (%(r)s - 1) / %(k)s) g", {"r": runs, "k": runs_per_block})
    conn.exec_driver_sql(
        "INSERT INTO block_runs (block_id, position, topic, partition, from_seq, first_seq, last_seq, length_bytes,"
        " messages, min_ts_ms, max_ts_ms, leader_epoch)"
        " SELECT 1000000000 + j / %(k)s, (j %% %(k)s) * 1000, 'bulk', j %% %(p)s, (j / %(p)s) * 100 + 1,"
        " (j / %(p)s) * 100 + 1, (j / %(p)s) * 100 + 100, 1000, 100, 0, 0, 1 FROM generate_series(0, %(r)s - 1) j",
        {"r": runs, "k": runs_per_block, "p": partitions})
    conn.exec_driver_sql(
        "INSERT INTO segments (topic, partition, base_seq, last_seq, from_seq, object_key, index_object_key,"
        " size_bytes, index_size_bytes, min_ts_ms, max_ts_ms, freeze_ts, leader_epoch, state, updated_at)"
        " SELECT 'bulk', j %% %(p)s, (j / %(p)s) * 1000 + 1, (j / %(p)s) * 1000 + 1000, (j / %(p)s) * 1000 + 1,"
        " 'bulk/seg/' || j, 'bulk/idx/' || j, 1048576, 4096, 0, 0, now(), 1, 'COPY_FINISHED', now()"
        " FROM generate_series(0, %(s)s - 1) j", {"s": segments, "p": partitions})
    conn.exec_driver_sql("ANALYZE")


@pytest.fixture(scope="module")
def large(_pg_databases):
    """A PostgreSQL catalog with the `bulk` topic loaded and analyzed, shared by this module's tests (they only read
    it). Direct: the plans are the server's, pooled or not."""
    url = _pg_databases.take()
    try:
        with Catalog.open(url) as catalog:
            with catalog.write() as conn:
                bulk_load(conn, BULK_PARTITIONS, BULK_RUNS, BULK_SEGMENTS)
            yield catalog
    finally:
        # Dropped, not given back for reuse: emptied, it would keep this load's statistics (pg_statistic), and the
        # next test's plans would be made for 50,000 rows that are not there.
        _pg_databases.cluster.execute(f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


MIDDLE = BULK_RUNS // BULK_PARTITIONS * 50  # a seq half way through a partition's history
LARGE_LOOKUPS = {
    "find_run": (lambda c: blocks.find_run(c, "bulk", 7, MIDDLE), "ix_block_runs_lookup"),
    "runs_for_range": (lambda c: blocks.runs_for_range(c, "bulk", 7, MIDDLE, 5), "ix_block_runs_lookup"),
    "find_remote_segment": (lambda c: segments.find_remote_segment(c, "bulk", 7, MIDDLE), "ix_segments_lookup"),
    "readable_segments_from": (lambda c: segments.readable_segments_from(c, "bulk", 7, MIDDLE, 2),
                               "ix_segments_lookup"),
    "highest_copied_seq": (lambda c: segments.highest_copied_seq(c, "bulk", 7), "ix_segments_lookup"),
    "remote_retention": (
        lambda c: segments.segments_for_remote_retention(c, "bulk", 7, now=T0, max_age=timedelta(0), max_bytes=None),
        "ix_segments_lookup",
    ),
    "partition_state": (lambda c: partitions.get_partition_state(c, "bulk", 7), "pk_partitions"),
    "unfinished_deletions": (
        lambda c: segments.list_segments(c, "bulk", 7, states=(SegmentState.DELETE_STARTED,), limit=10),
        "ix_segments_delete_started",
    ),
}


def captured(cat, call) -> list[tuple[str, dict]]:
    sent = []

    def capture(_conn, _cursor, statement, parameters, _context, executemany):
        sent.append((statement, parameters))

    event.listen(cat.engine, "before_cursor_execute", capture)
    try:
        call()
    finally:
        event.remove(cat.engine, "before_cursor_execute", capture)
    return sent


def numbered(statement: str, parameters: dict) -> tuple[str, list]:
    """The statement with psycopg's %(name)s placeholders as PostgreSQL's $1, $2... and the values in that order."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, statement).replace("%%", "%")
    return text, [parameters[n] for n in names]


@pytest.mark.parametrize("name", LARGE_LOOKUPS)
def test_lookups_stay_index_scans_on_large_tables(large, name):
    """With 50,000 runs and segments analyzed, the planner (sequential scans allowed) still reads the index."""
    call, index = LARGE_LOOKUPS[name]
    [(statement, parameters)] = captured(large, lambda: call(large))
    with large.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).all()
        conn.rollback()
    plan = "\n".join(r[0] for r in rows)
    assert full_scans("postgresql", plan) == [] and index in plan, plan


@pytest.mark.parametrize("name", LARGE_LOOKUPS)
def test_lookups_get_a_generic_plan(large, name):
    """A statement run many times on one session (psycopg prepares it after 5 executions) is planned once: from the
    sixth execution PostgreSQL keeps a generic plan, when it costs no more than the custom ones (a LIMIT sent as a
    parameter would not: planned for an unknown number of rows, it looks dearer than a plan for LIMIT 1). The
    generic plan is an index scan too."""
    call, index = LARGE_LOOKUPS[name]
    [(statement, parameters)] = captured(large, lambda: call(large))
    text, values = numbered(statement, parameters)
    with large.engine.connect() as conn:
        driver = conn.connection.driver_connection
        with driver.transaction():
            driver.execute(f"PREPARE lookup AS {text}")
            execute = "EXECUTE lookup" + (f"({', '.join(['%s'] * len(values))})" if values else "")
            with driver.cursor() as cur:
                import psycopg

                cur = psycopg.ClientCursor(driver)  # EXECUTE takes its arguments as literals
                for _ in range(8):
                    cur.execute(execute, values)
                    cur.fetchall()
                [(generic, custom)] = cur.execute(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'lookup'").fetchall()
                cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                plan = "\n".join(r[0] for r in cur.execute("EXPLAIN " + execute, values).fetchall())
            driver.execute("DEALLOCATE lookup")
    assert generic >= 3 and custom <= 5, (generic, custom, text)
    assert full_scans("postgresql", plan) == [] and index in plan, plan


@pytest.fixture(scope="module")
def many_partitions(_pg_databases):
    """A PostgreSQL catalog of 100,000 partitions (issue 28's scale) and no history, analyzed: what a commit's
    plan depends on."""
    url = _pg_databases.take()
    try:
        with Catalog.open(url) as catalog:
            with catalog.write() as conn:
                bulk_load(conn, 100_000, 0, 0)
            yield catalog
    finally:
        _pg_databases.cluster.execute(f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def _raise_plan(catalog, heads) -> str:
    from sqlalchemy import text

    from tiered.catalog.arrays import statement

    check = statement("postgresql", blocks._RAISE, blocks.HEADS)
    with catalog.engine.connect() as conn:
        rows = conn.execute(text("EXPLAIN " + check.text), {"broker_id": 1, **blocks.HEADS.params("postgresql", heads)}).all()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


def _locks_in_the_order_given(plan: str) -> bool:
    """The raise's plan is a nested loop whose outer side is the heads given (in (topic, partition) order: the scan
    of their arrays' unnest, aliased h) and whose inner side probes the partitions' primary key: each row is locked
    as its head comes, in the catalog's lock order."""
    lines = [line.strip() for line in plan.splitlines()]
    loop = next(i for i, line in enumerate(lines) if "Nested Loop" in line)
    outer = next(line for line in lines[loop + 1:] if line.startswith("->"))
    return "Function Scan on h " in outer + " " and "Index Scan using pk_partitions on partitions" in plan


def test_a_wide_commit_probes_each_partition_by_key_among_100k(many_partitions):
    """commit_block's check and raise (one UPDATE) for a block of 1,600 partitions among 100,000: a nested loop over
    the heads in the order given, each a primary key probe, with sequential scans allowed; nothing reads every
    partition, and the rows are locked in (topic, partition) order."""
    heads = [("bulk", p, 1, 1, 1, 1, 1) for p in range(0, 100_000, 62)][:1600]
    plan = _raise_plan(many_partitions, heads)
    assert full_scans("postgresql", plan) == [], plan
    assert plan.count("Index Scan using pk_partitions on partitions") == 1 and _locks_in_the_order_given(plan), plan


def test_a_wide_commit_locks_in_the_order_given_on_a_small_catalog(cat, filled):
    """On a catalog of a few partitions too, where a scan of the table would be cheap, the raise stays a nested loop
    driven by the heads given: the lock order does not depend on the planner's view of the table's size."""
    if cat.backend != "postgresql":
        pytest.skip("SQLite's write transaction holds the whole database")
    heads = [(t, p, 1, 1, 1, 1, 1) for t in "ab" for p in range(2)]
    plan = _raise_plan(cat, heads)
    assert _locks_in_the_order_given(plan), plan


def _plan_of(cat, call) -> str:
    [(statement, parameters)] = captured(cat, lambda: call(cat))
    with cat.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).all()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


def test_a_look_reads_only_the_partitions_changed_among_100k(many_partitions):
    """changed_since, with 100,000 analyzed partitions each of another change version (sequential scans allowed): the
    rows changed since a recent version are a range of ix_partitions_change_version, not a read of every partition."""
    from tiered.catalog import cluster

    plan = _plan_of(many_partitions, lambda c: cluster.changed_since(c, 99_900))
    assert full_scans("postgresql", plan) == [], plan
    assert "ix_partitions_change_version" in plan, plan
    assert len(cluster.changed_since(many_partitions, 99_900)) == 100


def test_the_retention_selection_stays_range_scans_among_100k_partitions(many_partitions):
    """With 100,000 analyzed partitions (sequential scans allowed), the partitions over a byte limit are a range of
    ix_partitions_remote_bytes: nothing reads every partition. (This catalog has no segments, and a planner rightly
    reads an empty table whole: the age part is checked on a long history below.)"""
    limits = [segments.RetentionLimits(("bulk",), None, 1 << 30)]
    plan = _plan_of(many_partitions, lambda c: segments.partitions_due_for_retention(c, limits, now=T0))
    assert full_scans("postgresql", plan) == [], plan
    assert "ix_partitions_remote_bytes" in plan, plan
    plan = _plan_of(many_partitions, lambda c: segments.partitions_due_for_retention(
        c, limits, now=T0, after=("bulk", 50_000)))
    assert full_scans("postgresql", plan) == [], plan


def test_the_retention_selection_stays_a_range_scan_on_large_history(large):
    """With 50,000 analyzed readable segments, none past the cutoff: a range of ix_segments_expiry, not a scan."""
    limits = [segments.RetentionLimits(("bulk",), timedelta(days=7), None)]
    plan = _plan_of(large, lambda c: segments.partitions_due_for_retention(c, limits, now=T0))  # all frozen later
    assert full_scans("postgresql", plan) == [] and "ix_segments_expiry" in plan, plan
