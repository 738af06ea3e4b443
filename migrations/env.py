"""Alembic environment for the catalog.

Run through tiered.catalog.migrate (`tiered db upgrade`), which passes a connection inside an open write
transaction in `config.attributes["connection"]`, so a whole upgrade commits or rolls back as one. Given only a
`sqlalchemy.url` main option, it opens that catalog itself the same way.
"""

from __future__ import annotations

from alembic import context

from tiered.catalog.engine import Catalog
from tiered.catalog.migrate import lock_migrations
from tiered.catalog.models import Base

config = context.config


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata)
    with context.begin_transaction():
        lock_migrations(connection)  # re-entrant: harmless where tiered.catalog.migrate.upgrade took it first
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("the catalog migrations run online only: use `tiered db upgrade --catalog URL`")
elif (shared := config.attributes.get("connection")) is not None:
    _run(shared)
else:
    url = config.get_main_option("sqlalchemy.url")
    with Catalog.open(url, lock_timeout_ms=None) as catalog, catalog.write() as connection:
        _run(connection)
