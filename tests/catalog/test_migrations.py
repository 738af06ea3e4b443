"""Migrations: up from empty on both backends, head matches the models, concurrent upgrades, down and up again."""

from __future__ import annotations

import threading

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from dataclasses import asdict

from sqlalchemy import insert, inspect, update

from tiered.catalog import Catalog, SegmentState, segments
from tiered.catalog.migrate import alembic_config, current, head, migrations_dir, upgrade
from tiered.catalog.models import Base, SegmentModel

from .rows import T0, segment


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path):
    if request.param == "postgresql":
        return request.getfixturevalue("pg_empty_url")
    return f"sqlite:///{tmp_path / 'nested' / 'catalog.db'}"


def schema_differences(url: str) -> list:
    with Catalog.open(url) as cat, cat.read() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def old_topic(cat) -> None:
    """Topic t with one partition, as the code of the early versions wrote it (today's also versions its rows: 0012)."""
    from sqlalchemy import text

    with cat.write() as conn:
        conn.execute(text("INSERT INTO topics (name, partitions, config_text, created_at) "
                          "VALUES ('t', 1, '', CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO partitions (topic, partition) VALUES ('t', 0)"))


def test_upgrade_from_empty_reaches_head(empty_url):
    assert current(empty_url) is None
    assert upgrade(empty_url) == (None, head())
    assert current(empty_url) == head()
    assert upgrade(empty_url) == (head(), head())  # a second run is a no-op


def test_head_builds_exactly_the_models(empty_url):
    upgrade(empty_url)
    assert schema_differences(empty_url) == []
    with Catalog.open(empty_url) as cat, cat.read() as conn:
        indexes = {i["name"]: i for i in inspect(conn).get_indexes("block_runs")}
        assert indexes["ix_block_runs_lookup"]["column_names"] == ["topic", "partition", "last_seq"]
        if cat.backend == "postgresql":
            assert indexes["ix_block_runs_lookup"]["dialect_options"]["postgresql_include"] == [
                "first_seq", "position", "length_bytes", "block_id", "from_seq", "min_ts_ms", "max_ts_ms"]


def test_downgrade_to_empty_and_back(empty_url):
    upgrade(empty_url)
    config = alembic_config()
    with Catalog.open(empty_url) as cat, cat.write() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
    with Catalog.open(empty_url) as cat, cat.read() as conn:
        assert set(inspect(conn).get_table_names()) == {"alembic_version"}
    assert current(empty_url) is None
    assert upgrade(empty_url) == (None, head())


def segment_indexes(url: str) -> dict[str, dict]:
    with Catalog.open(url) as cat, cat.read() as conn:
        return {i["name"]: i for i in inspect(conn).get_indexes("segments")}


def test_0002_indexes_the_segments_mid_deletion_of_a_catalog_in_use(empty_url):
    """A catalog at 0001 holding segments gets the partial index, and lists its DELETE_STARTED rows through it; the
    downgrade drops it and nothing else."""
    assert upgrade(empty_url, "0001") == (None, "0001")
    assert "ix_segments_delete_started" not in segment_indexes(empty_url)
    with Catalog.open(empty_url) as cat:
        old_topic(cat)
        for base, state in ((1, "DELETE_FINISHED"), (11, "DELETE_STARTED"), (21, "COPY_FINISHED")):
            with cat.write() as conn:
                conn.execute(insert(SegmentModel).values(
                    **asdict(segment("t", 0, base, base + 9, 0)), state=state, updated_at=T0))
    assert upgrade(empty_url) == ("0001", head())
    index = segment_indexes(empty_url)["ix_segments_delete_started"]
    assert index["column_names"] == ["topic", "partition", "base_seq"]
    with Catalog.open(empty_url) as cat:
        listed = segments.list_segments(cat, "t", 0, states=(SegmentState.DELETE_STARTED,))
        assert [s.base_seq for s in listed] == [11]
    config = alembic_config()
    with Catalog.open(empty_url) as cat, cat.write() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0001")
    assert current(empty_url) == "0001"
    assert "ix_segments_delete_started" not in segment_indexes(empty_url)
    assert "ix_segments_lookup" in segment_indexes(empty_url)


def test_0003_gives_a_catalog_in_use_its_history_and_coverage(empty_url):
    """A catalog at 0002 with a led partition, a committed run and a remote segment: 0003 records the current epoch
    as the partition's history (disk unknown, starting after the high-water mark) and lets every run and segment
    answer from its first seq; the downgrade takes exactly that away again."""
    from sqlalchemy import text

    assert upgrade(empty_url, "0002") == (None, "0002")
    with Catalog.open(empty_url) as cat, cat.write() as conn:
        conn.execute(text("INSERT INTO topics (name, partitions, config_text, created_at) "
                          "VALUES ('t', 2, '', CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO partitions (topic, partition, leader_broker, leader_epoch, hwmark_seq, "
                          "first_available_seq) VALUES ('t', 0, 3, 7, 40, 1), ('t', 1, NULL, 0, 0, 0)"))
        conn.execute(text("INSERT INTO blocks (object_key, state, broker_id, size_bytes, created_at) "
                          "VALUES ('blk/1', 'committed', 3, 10, CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO block_runs (block_id, position, topic, partition, first_seq, last_seq, "
                          "length_bytes, messages, min_ts_ms, max_ts_ms) VALUES (1, 0, 't', 0, 31, 40, 10, 10, 0, 0)"))
        conn.execute(insert(SegmentModel).values(**asdict(segment("t", 0, 1, 30, 7)), state="COPY_FINISHED",
                                            updated_at=T0))
    assert upgrade(empty_url) == ("0002", head())
    with Catalog.open(empty_url) as cat, cat.read() as conn:
        history = conn.execute(text("SELECT topic, partition, leader_epoch, broker_id, disk_id, start_seq "
                                    "FROM partition_epochs")).all()
        assert [tuple(r) for r in history] == [("t", 0, 7, 3, "", 41)]
        assert conn.execute(text("SELECT from_seq, leader_epoch FROM block_runs")).one() == (31, 0)
        assert conn.execute(text("SELECT from_seq FROM segments")).scalar_one() == 1
    config = alembic_config()
    with Catalog.open(empty_url) as cat, cat.write() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0002")
    with Catalog.open(empty_url) as cat, cat.read() as conn:
        assert "partition_epochs" not in inspect(conn).get_table_names()
        assert "from_seq" not in {c["name"] for c in inspect(conn).get_columns("block_runs")}


def test_concurrent_upgrades_apply_once(pg_empty_url):
    """Brokers starting together (and the Helm hook Job) may all run the migrations: one applies them."""
    results, errors = [], []

    def run():
        try:
            results.append(upgrade(pg_empty_url))
        except Exception as error:  # collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(results, key=str) == sorted([(None, head()), (head(), head()), (head(), head())], key=str)
    assert schema_differences(pg_empty_url) == []


def test_current_does_not_create_a_sqlite_file(tmp_path):
    path = tmp_path / "absent" / "catalog.db"
    assert current(f"sqlite:///{path}") is None
    assert not path.parent.exists()


def test_0005_drops_the_runs_foreign_key_of_a_catalog_in_use(empty_url):
    """A catalog at 0004 holding a committed run keeps it, and loses only the foreign key to blocks (and its
    partitions pages are left half free on PostgreSQL); the downgrade puts the key back."""
    from alembic import command as alembic_command

    from tiered.catalog import blocks, partitions

    assert upgrade(empty_url, "0004") == (None, "0004")
    with Catalog.open(empty_url) as cat:
        old_topic(cat)
        epoch = 1
        with cat.write() as conn:  # the claim as 0004's code wrote it (today's also counts the change: 0006)
            conn.execute(update(partitions.PartitionModel).values(leader_broker=1, leader_epoch=epoch))
        block_id = blocks.insert_pending_block(cat, "blk/1", 1, 10, now=T0)
        with cat.write() as conn:  # the commit as 0004's code wrote it: the run inserted with the key in force
            conn.execute(insert(blocks.BlockRunModel).values(
                block_id=block_id, position=0, topic="t", partition=0, from_seq=1, first_seq=1, last_seq=5,
                length_bytes=10, messages=5, min_ts_ms=0, max_ts_ms=0, leader_epoch=epoch))

    def run_keys(url: str) -> list:
        with Catalog.open(url) as cat, cat.read() as conn:
            return inspect(conn).get_foreign_keys("block_runs")

    assert [k["referred_table"] for k in run_keys(empty_url)] == ["blocks"]
    assert upgrade(empty_url) == ("0004", head())
    assert run_keys(empty_url) == []
    with Catalog.open(empty_url) as cat, cat.read() as conn:
        assert "ix_block_runs_block_id" not in {i["name"] for i in inspect(conn).get_indexes("block_runs")}
    with Catalog.open(empty_url) as cat, cat.read() as conn:
        if cat.backend == "postgresql":  # HOT updates of the row every commit rewrites
            assert inspect(conn).get_table_options("partitions")["postgresql_with"] == {"fillfactor": "50"}
    with Catalog.open(empty_url) as cat:
        assert blocks.find_run(cat, "t", 0, 3).block_id == block_id
    config = alembic_config()
    with Catalog.open(empty_url) as cat, cat.write() as conn:
        config.attributes["connection"] = conn
        alembic_command.downgrade(config, "0004")
    assert [k["referred_table"] for k in run_keys(empty_url)] == ["blocks"]


def test_migrations_ship_as_a_package():
    """`tiered db upgrade` from an installed wheel needs env.py, the template and the revisions inside the
    `migrations` package (pyproject packages `migrations*` with its *.mako)."""
    folder = migrations_dir()
    assert (folder / "__init__.py").exists() and (folder / "versions" / "__init__.py").exists()
    assert (folder / "env.py").exists() and (folder / "script.py.mako").exists()
    assert head() == "0013"


def test_alembic_commands_work_given_only_a_url(tmp_path):
    """A developer running Alembic commands by hand, without `tiered db`, gets the same environment."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "head")
    assert current(url) == head()
    command.downgrade(config, "base")
    assert current(url) is None


def test_0013_keeps_every_location_of_a_catalog_in_use(empty_url):
    """A catalog at 0012 holding committed runs: after 0013 they are still where every reader looks (none of them
    unexpanded), a new commit may leave its runs unexpanded, and the downgrade refuses while one is."""
    from sqlalchemy import text

    from tiered.catalog import blocks
    from tiered.catalog.check import check_catalog
    from tiered.catalog.partitions import claim_partitions

    from .rows import run

    upgrade(empty_url, "0012")
    with Catalog.open(empty_url) as cat:
        old_topic(cat)
        with cat.write() as conn:
            conn.execute(text("INSERT INTO blocks (object_key, state, broker_id, size_bytes, created_at, committed_at)"
                              " VALUES ('blk/1', 'committed', 1, 300, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
            for first in (1, 11):
                conn.execute(text(
                    "INSERT INTO block_runs (block_id, position, topic, partition, from_seq, first_seq, last_seq,"
                    " length_bytes, messages, min_ts_ms, max_ts_ms, leader_epoch)"
                    f" VALUES (1, {first * 10}, 't', 0, {first}, {first}, {first + 9}, 100, 10, 0, 0, 0)"))
            conn.execute(text("UPDATE partitions SET first_available_seq = 1, hwmark_seq = 20"))
    assert upgrade(empty_url) == ("0012", head())
    with Catalog.open(empty_url) as cat:
        assert check_catalog(cat).ok and check_catalog(cat).partitions[0].locations == 2
        assert blocks.find_run(cat, "t", 0, 15).first_seq == 11
        assert blocks.unexpanded_blocks(cat, T0.replace(year=2100)) == []
        epoch = claim_partitions(cat, 1, "t", [0])[0]
        block_id = blocks.insert_pending_block(cat, "blk/2", 1, 100, now=T0)
        blocks.commit_block(cat, block_id, 1, [run("t", 0, 21, 30, epoch=epoch)], {("t", 0): epoch}, now=T0,
                            expand=False)
        assert blocks.find_run(cat, "t", 0, 25).block_id == block_id and check_catalog(cat).ok
    config = alembic_config()
    with pytest.raises(RuntimeError, match="unexpanded"):
        with Catalog.open(empty_url) as cat, cat.write() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0012")
    with Catalog.open(empty_url) as cat:
        assert blocks.expand_blocks(cat, [block_id]) == 1
        with cat.write() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0012")
    assert current(empty_url) == "0012"
    with Catalog.open(empty_url) as cat, cat.read() as conn:  # the code of 0012 reads block_runs alone
        assert conn.execute(text("SELECT count(*) FROM block_runs")).scalar_one() == 3
