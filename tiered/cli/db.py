"""`tiered db ...`: the catalog schema.

    tiered db upgrade [--catalog URL]   apply the migrations up to head (run before brokers start; Helm's hook Job)
    tiered db current [--catalog URL]   print the catalog's revision; exit 0 only if it is at head

The catalog URL comes from the settings (tiered.config: --catalog, TIERED_CATALOG_URL, the config file, else the
SQLite file in the data dir), so `tiered db upgrade -p ./data` prepares what `tiered serve -p ./data` opens.
"""

from __future__ import annotations

import argparse
import sys

from tiered.config import SettingsError, load_settings, mask_url


def _failures() -> tuple[type[Exception], ...]:
    """What a bad URL, an unreachable database or an unknown revision raise: reported in one line, exit 1.
    (Imported here, not at the top: every `tiered` command builds this parser, and alembic takes a while.)"""
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from tiered.catalog import CatalogError

    return SettingsError, CatalogError, SQLAlchemyError, CommandError, ValueError, OSError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("db", help="catalog schema migrations", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="db_command", metavar="COMMAND", required=True)
    for name, handler, text in (
        ("upgrade", cmd_upgrade, "upgrade the catalog schema to the newest revision"),
        ("current", cmd_current, "show the catalog's schema revision (exit 1 unless at head)"),
    ):
        command = commands.add_parser(name, help=text, description=text)
        command.add_argument(
            "--catalog",
            dest="catalog_url",
            metavar="URL",
            help="catalog URL: sqlite:///path or postgresql+psycopg://user@host/db (default: from the settings)",
        )
        command.add_argument("--config", help="TOML config file (also TIERED_CONFIG)")
        command.add_argument("-p", "--data-dir", dest="data_dir", help="data directory (holds the default catalog)")
        command.set_defaults(func=handler)


def _catalog_url(args: argparse.Namespace) -> str:
    return load_settings(args).effective_catalog_url


def _fail(command: str, url: str | None, error: Exception) -> int:
    where = f" {mask_url(url)}:" if url else ""
    text = str(error).strip()
    print(f"tiered db {command}:{where} {text.splitlines()[0] if text else type(error).__name__}", file=sys.stderr)
    return 1


def cmd_upgrade(args: argparse.Namespace) -> int:
    from tiered.catalog.migrate import upgrade

    url = None
    try:
        url = _catalog_url(args)
        before, after = upgrade(url)
    except _failures() as error:
        return _fail("upgrade", url, error)
    if before == after:
        print(f"catalog {mask_url(url)} is already at revision {after} (head)")
    else:
        print(f"catalog {mask_url(url)} upgraded from {before or 'empty'} to revision {after} (head)")
    return 0


def cmd_current(args: argparse.Namespace) -> int:
    from tiered.catalog.engine import sqlite_file
    from tiered.catalog.migrate import current, head

    url = None
    try:
        url = _catalog_url(args)
        missing = sqlite_file(url)
        if missing is not None and not missing.exists():
            print(f"tiered db current: no catalog at {missing} (nothing was created; "
                  "`tiered db upgrade` creates one there if that is where the broker keeps it)", file=sys.stderr)
            return 1
        revision, newest = current(url), head()
    except _failures() as error:
        return _fail("current", url, error)
    if revision == newest:
        print(f"catalog {mask_url(url)} is at revision {revision} (head)")
        return 0
    state = f"at revision {revision}" if revision else "empty (no revision)"
    print(f"catalog {mask_url(url)} is {state}, not at head {newest} (`tiered db upgrade` applies the rest)")
    return 1
