"""Schema migrations: Alembic, configured in code so that `tiered db upgrade` needs no alembic.ini and works from
a checkout and from an installed wheel alike (the migrations/ package ships in the wheel)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from tiered.catalog.engine import Catalog, normalize_url

# Concurrent upgrades on PostgreSQL (several brokers starting, the Helm hook Job) queue on this advisory lock, so
# exactly one applies each revision and the others then find the schema at head. On SQLite the write
# transaction (BEGIN IMMEDIATE) already serialises them.
MIGRATION_LOCK_ID = 0x7469657265640001  # "tiered" + 1


def lock_migrations(connection) -> None:
    """Waits for, then holds until the transaction ends, the right to migrate this catalog."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})")


def migrations_dir() -> Path:
    """The folder holding env.py and versions/, found as the `migrations` package wherever it is installed."""
    import migrations

    return Path(migrations.__file__).resolve().parent


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def head() -> str:
    """The newest revision this code knows."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current(url: str) -> str | None:
    """The catalog's revision, or None for an empty database (a missing SQLite file is not created)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or ":memory:").exists():
        return None
    with Catalog.open(url) as catalog, catalog.read() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(url: str, revision: str = "head") -> tuple[str | None, str | None]:
    """Upgrades the catalog at `url` to `revision` in one transaction. Returns (revision before, revision after)."""
    config = alembic_config()
    # No lock timeout: an upgrade waits for another one (and its DDL locks) however long it takes.
    with Catalog.open(url, lock_timeout_ms=None) as catalog, catalog.write() as connection:
        lock_migrations(connection)
        before = MigrationContext.configure(connection).get_current_revision()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        after = MigrationContext.configure(connection).get_current_revision()
    return before, after
