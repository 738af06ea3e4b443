"""Opening the catalog: URLs, masking, SQLite setup, error translation, the statement counter."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import insert, text
from sqlalchemy.exc import IntegrityError, OperationalError

from tiered.catalog import Catalog, CatalogUnavailable, mask_url
from tiered.catalog.blocks import (EXPAND_IN_COMMIT_RUNS, commit_block, expand_blocks, find_run, insert_pending_block,
                                   runs_for_range)
from tiered.catalog.engine import normalize_url, split_pooled
from tiered.catalog.models import BlockModel
from tiered.catalog.partitions import claim_partitions
from tiered.catalog.segments import find_remote_segment
from tiered.catalog.topics import create_topic, get_topic

from tests.support.ports import free_port

from .rows import T0, run


@pytest.mark.parametrize(
    "given, opened",
    [
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u@h:5433/db", "postgresql+psycopg://u@h:5433/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("sqlite:////var/lib/tiered/catalog.db", "sqlite:////var/lib/tiered/catalog.db"),
    ],
)
def test_urls_open_through_psycopg3(given, opened):
    assert normalize_url(given).render_as_string(hide_password=False) == opened


@pytest.mark.parametrize("url", ["mysql://u@h/db", "postgresql+psycopg2://u@h/db", "oracle://x"])
def test_other_databases_are_refused(url):
    with pytest.raises(ValueError, match="unsupported catalog URL"):
        normalize_url(url)


def test_passwords_are_masked():
    url = "postgresql://tiered:p%40ss@db.internal:5432/tiered"
    assert mask_url(url) == "postgresql://tiered:***@db.internal:5432/tiered"
    cat = Catalog.open(url)  # connects lazily: nothing is reached here
    assert "p%40ss" not in repr(cat) and "p@ss" not in repr(cat) and "***" in repr(cat)
    assert cat.url == "postgresql+psycopg://tiered:***@db.internal:5432/tiered"
    cat.close()


def test_sqlite_is_set_up_for_durability_and_concurrency(tmp_path):
    path = tmp_path / "deep" / "er" / "catalog.db"
    with Catalog.open(f"sqlite:///{path}", lock_timeout_ms=1234) as cat, cat.read() as conn:
        pragma = lambda name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()  # noqa: E731
        assert (pragma("journal_mode"), pragma("foreign_keys"), pragma("busy_timeout")) == ("wal", 1, 1234)
        assert pragma("synchronous") == 2  # FULL
    assert path.exists()


def test_unreachable_postgresql_is_catalog_unavailable(pg_cluster):
    port = free_port()  # a port nothing listens on
    with Catalog.open(f"postgresql://postgres@127.0.0.1:{port}/x") as cat:
        with pytest.raises(CatalogUnavailable):
            get_topic(cat, "t")


def test_a_missing_schema_is_not_transient(tmp_path, pg_empty_url):
    """An unmigrated catalog is a setup error, not something a retry fixes."""
    for url in (f"sqlite:///{tmp_path / 'empty.db'}", pg_empty_url):
        with Catalog.open(url) as cat:
            with pytest.raises(Exception) as caught:
                get_topic(cat, "t")
            assert not isinstance(caught.value, CatalogUnavailable)


def test_constraints_hold_on_both_backends(cat):
    with pytest.raises(IntegrityError), cat.write() as conn:
        conn.execute(insert(BlockModel).values(object_key="k", state="lost", broker_id=1, size_bytes=1, created_at=T0))
    with pytest.raises((IntegrityError, OperationalError)), cat.write() as conn:
        conn.execute(text("INSERT INTO partitions (topic, partition) VALUES ('no-such-topic', 0)"))


# One statement checks and raises the partitions, one marks the block, one inserts its runs; on PostgreSQL a block of
# more than EXPAND_IN_COMMIT_RUNS runs leaves the insert to its expansion (tiered.catalog.blocks).
COMMIT_STATEMENTS = {"postgresql": 3, "sqlite": 3}
WIDE_COMMIT_STATEMENTS = {"postgresql": 2, "sqlite": 3}


def test_statement_counts(cat):
    """What the benchmark reports: statements per block commit stay constant as blocks span more partitions,
    and a fetch lookup is one statement."""
    create_topic(cat, "a", 12)
    create_topic(cat, "b", 12)
    epochs = {("a", p): e for p, e in claim_partitions(cat, 1, "a", range(12)).items()}
    epochs |= {("b", p): e for p, e in claim_partitions(cat, 1, "b", range(12)).items()}

    def cost(call):
        before = cat.statements
        result = call()
        return cat.statements - before, result

    assert cost(lambda: insert_pending_block(cat, "blk/1", 1, 10, now=T0)) == (1, 1)
    assert cost(lambda: commit_block(cat, 1, 1, [run("a", 0, 1, 5)], epochs))[0] == COMMIT_STATEMENTS[cat.backend]
    insert_pending_block(cat, "blk/2", 1, 10, now=T0)
    wide = [run(t, p, 6 if (t, p) == ("a", 0) else 1, 10, 100 * p + (t == "b")) for t in "ab" for p in range(12)]
    assert cost(lambda: commit_block(cat, 2, 1, wide, epochs))[0] == COMMIT_STATEMENTS[cat.backend]
    insert_pending_block(cat, "blk/w", 1, 10, now=T0)
    wider = [run(t, p, 11 + 10 * i, 20 + 10 * i, 10_000 * i + 100 * p + (t == "b"))
             for t in "ab" for p in range(12) for i in range(3)]  # 72 runs, three a partition
    assert len(wider) > EXPAND_IN_COMMIT_RUNS
    assert cost(lambda: commit_block(cat, 3, 1, wider, epochs))[0] == WIDE_COMMIT_STATEMENTS[cat.backend]
    # The expansion after the acknowledgements: the claim, the runs' COPY and the clear; only the claim otherwise.
    assert cost(lambda: expand_blocks(cat, [1, 2, 3]))[0] == (5 if cat.backend == "postgresql" else 3)
    assert cost(lambda: find_run(cat, "b", 7, 3))[0] == 1
    assert cost(lambda: runs_for_range(cat, "a", 0, 1, 10))[0] == 1
    # With a block unexpanded, a lookup the rows do not answer reads them again with the unexpanded blocks, in one
    # snapshot; one they answer stays one statement.
    insert_pending_block(cat, "blk/4", 1, 10, now=T0)
    commit_block(cat, 4, 1, [run("a", 0, 41, 45)], epochs, expand=False)
    assert cost(lambda: runs_for_range(cat, "a", 0, 1, 10))[0] == 3
    assert cost(lambda: find_run(cat, "b", 7, 3))[0] == 1
    assert cost(lambda: find_remote_segment(cat, "a", 0, 1))[0] == 1


@pytest.mark.parametrize("given,pooled", [("postgresql://u@h/db?pooled=true", True), ("postgresql://u@h/db?pooled=0", False),
                                          ("postgresql://u@h/db", False)])
def test_pooled_is_read_from_the_url_and_taken_out_of_it(given, pooled):
    url, said = split_pooled(normalize_url(given))
    assert (said, "pooled" in url.query, url.database) == (pooled, False, "db")


@pytest.mark.parametrize("url,message", [
    ("postgresql://u:secret@h/db?pooled=maybe", "bad pooled='maybe' in catalog URL postgresql+psycopg://u:***@h/db"),
    ("sqlite:///x.db?pooled=true", "pooled= is for PostgreSQL catalog URLs"),
])
def test_a_bad_pooled_parameter_is_one_clear_line(url, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        Catalog.open(url)
    assert "\n" not in str(error.value) and "secret" not in str(error.value)


def test_through_pgbouncer_nothing_outlives_a_transaction(pgbouncer_url, pg_url):
    """Behind a transaction-mode pooler: the timeouts hold in every transaction (reads too), and no statement is
    prepared on the server however often it runs (psycopg prepares after 5 executions unless told not to)."""
    with Catalog.open(pgbouncer_url, lock_timeout_ms=1234) as cat:
        assert cat.pooled
        create_topic(cat, "t", 1)
        for _ in range(8):
            get_topic(cat, "t")
        with cat.read() as conn:
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "1234ms"
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar_one() == "30s"
            assert conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar_one() == 0
        with cat.write() as conn:
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "1234ms"
    with Catalog.open(pg_url) as direct, direct.read() as conn:
        assert not direct.pooled
        # Set as connection options there, for the session.
        assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "10s"
