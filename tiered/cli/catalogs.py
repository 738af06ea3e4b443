"""Finding the catalog a client-side command reads, without ever creating one.

Only `tiered serve` and `tiered db upgrade` (and `tiered catalog rebuild`, which fills an empty one) may create a
catalog. Every other command opens the catalog that is already there: a missing SQLite file, an empty database or
one at an older revision is refused with one line that names what was looked at, where that came from and how to
point the command elsewhere; SQLite is never asked to create a file (the engine's connect would).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Mapping

from tiered.cli.common import CommandError, UsageError
from tiered.config import ENV_PREFIX, Settings, SettingsError, load_settings, mask_url

CATALOG_ENV = ENV_PREFIX + "CATALOG_URL"


@dataclass(frozen=True)
class CatalogLocation:
    """The catalog URL a command will open and what named it (for the error that says where it looked)."""

    url: str
    source: str

    def describe(self) -> str:
        return f"{mask_url(self.url)} (from {self.source})"


def locate(args: argparse.Namespace | Mapping, environ: Mapping[str, str] = os.environ) -> CatalogLocation:
    """Where the settings say the catalog is: --catalog, else $TIERED_CATALOG_URL, else the config file, else the
    data directory's own catalog."""
    flags = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    settings = _settings(flags, environ)
    if flags.get("catalog_url"):
        source = "--catalog"
    elif environ.get(CATALOG_ENV):
        source = CATALOG_ENV
    elif settings.catalog_url:
        source = "the config file"
    else:
        source = f"the data directory {settings.data_dir.resolve()} (-p/--data-dir)"
    return CatalogLocation(settings.effective_catalog_url, source)


def _settings(flags: dict, environ: Mapping[str, str]) -> Settings:
    try:
        return load_settings(flags, environ)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None


def open_existing(location: CatalogLocation):
    """The Catalog at `location`, which must exist and be at the newest revision; never creates anything.
    Raises UsageError for a URL that is not one, CommandError for a catalog that is missing, empty or behind."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from alembic.runtime.migration import MigrationContext

    from tiered.catalog import Catalog, CatalogError
    from tiered.catalog.engine import normalize_url, sqlite_file
    from tiered.catalog.migrate import head

    try:
        parsed = normalize_url(location.url)
    except (ArgumentError, ValueError) as exc:
        raise UsageError(f"{location.source} {location.url!r} is not a catalog URL: want sqlite:///PATH or "
                         "postgresql+psycopg://USER@HOST/DB") from None
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_file(parsed)
        if path is None or not path.is_file():
            raise CommandError(
                f"no catalog at {path or parsed.database or ''} (from {location.source}); point --catalog at the "
                "brokers' catalog or -p/--data-dir at a broker's data directory (only `tiered serve` and "
                "`tiered db upgrade` create one)")
    # One engine: the revision is read on the catalog the command then uses.
    catalog = Catalog.open(location.url)
    try:
        with catalog.read() as connection:
            revision = MigrationContext.configure(connection).get_current_revision()
        newest = head()
        if revision is None:
            raise CommandError(f"the catalog {location.describe()} is empty (no tables); point --catalog at the "
                               "brokers' catalog, or run `tiered db upgrade` if this is where they should keep it")
        if revision != newest:
            raise CommandError(f"the catalog {location.describe()} is at revision {revision}, this tiered needs "
                               f"{newest}: run `tiered db upgrade`")
    except (CatalogError, SQLAlchemyError, OSError) as exc:
        catalog.close()
        raise CommandError(f"cannot read the catalog {location.describe()}: {_first_line(exc)}") from None
    except CommandError:
        catalog.close()
        raise
    return catalog


def open_catalog(args: argparse.Namespace | Mapping, environ: Mapping[str, str] = os.environ):
    """open_existing(locate(args)): the catalog a client-side command names."""
    return open_existing(locate(args, environ))


def catalog_errors() -> tuple[type[BaseException], ...]:
    """What a catalog call can raise that a command reports as one line (via describe_error)."""
    from sqlalchemy.exc import SQLAlchemyError

    from tiered.catalog import CatalogError

    return CatalogError, SQLAlchemyError


def describe_error(exc: BaseException) -> str:
    """One line for a catalog failure: SQLAlchemy's message without its SQL, parameters and background link."""
    return _first_line(getattr(exc, "orig", None) or exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
