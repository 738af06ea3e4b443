"""`tiered cost`: what each topic costs in the object store, from what every broker's cost meter counted.

    tiered cost [--catalog URL] [--since WHEN] [--prices FILE] [--json]

The counts come from the catalog (object_usage: each broker adds what it counted once a minute and when it stops),
so brokers that stopped or died still count, and every broker of the service is summed without reaching any of
them; bytes stored come from the catalog's rows of what the bucket holds. The window is whole hours (UTC): from
the hour holding --since, by default the hour the longest-running live broker started.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tiered.cli.catalogs import describe_error, open_catalog
from tiered.cli.common import CommandError, print_table
from tiered.config import SettingsError
from tiered.cost_report import S3_STANDARD_US_EAST_1, BadPrices, PriceTable, TopicCost, cost_report, parse_prices

_RELATIVE = re.compile(r"(\d+)([mhdw])")
_UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}


def register(subparsers: argparse._SubParsersAction) -> None:
    text = "what each topic costs in the object store: requests, bytes and storage, priced"
    parser = subparsers.add_parser("cost", help=text, description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", dest="catalog_url", metavar="URL",
                        help="the brokers' catalog: postgresql+psycopg://user@host/db (or sqlite:///path)")
    parser.add_argument("--config", help="TOML config file (also TIERED_CONFIG)")
    parser.add_argument("-p", "--data-dir", dest="data_dir", help="data directory (holds the default catalog)")
    parser.add_argument("--since", metavar="WHEN",
                        help="start of the window: an ISO time (2026-11-29T08:00Z, 2026-11-29) or an age (90m, "
                             "24h, 7d, 2w); default: when the longest-running live broker started")
    parser.add_argument("--prices", metavar="FILE",
                        help="a price table, JSON or TOML (docs/operations.md); default: S3 Standard, us-east-1")
    parser.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    parser.set_defaults(func=cmd_cost)


def parse_since(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC unless it names its offset) or an age before `now`; ValueError with one line."""
    text = text.strip()
    if match := _RELATIVE.fullmatch(text):
        return now - int(match.group(1)) * _UNITS[match.group(2)]
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since {text!r}: expected an ISO time (2026-11-29T08:00Z) or an age (90m, 24h, 7d, "
                         f"2w)") from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    if when > now:
        raise ValueError(f"--since {text!r} is in the future")
    return when.astimezone(timezone.utc)


def _prices(path: str | None) -> PriceTable:
    if path is None:
        return S3_STANDARD_US_EAST_1
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadPrices(f"cannot read the price table {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_prices(text, path)


def cmd_cost(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from tiered.catalog import CatalogError
    from tiered.catalog import usage as catalog_usage
    from tiered.catalog.usage import hour_of

    now = datetime.now(timezone.utc)
    try:
        prices = _prices(args.prices)
        since = parse_since(args.since, now) if args.since else None
        with open_catalog(args) as catalog:
            if since is None:
                since = catalog_usage.live_since(catalog, now)
            usage = catalog_usage.usage(catalog, since)
            stored = catalog_usage.bytes_stored(catalog)
        rows = cost_report(usage, stored, prices)
    except (BadPrices, ValueError) as error:
        print(f"tiered cost: {error}", file=sys.stderr)
        return 2
    except (CommandError, SettingsError, CatalogError, SQLAlchemyError, OSError) as error:
        print(f"tiered cost: {describe_error(error)}", file=sys.stderr)
        return 1
    start = hour_of(since) if since is not None else None
    if args.json:
        print(json.dumps({"since": start.isoformat() if start else None, "until": now.isoformat(),
                          "prices": prices.name, "topics": [r.as_dict() for r in rows]}, indent=1))
        return 0
    window = f"from {start:%Y-%m-%d %H:00} UTC" if start else "everything recorded"
    print(f"{window} to now ({_hours(start, now)}); prices: {prices.name}")
    print_table(["topic", "GiB ingested", "PUTs", "GETs", "GiB read", "$ requests", "$/GiB ingested", "GiB stored",
                 "$/month stored"], [_cells(r) for r in rows])
    return 0


def _hours(start: datetime | None, now: datetime) -> str:
    if start is None:
        return "since the first count"
    return f"{(now - start).total_seconds() / 3600:.1f} h"


def _cells(r: TopicCost) -> list[str]:
    per_gib = "-" if r.dollars_per_gib_ingested is None else f"{r.dollars_per_gib_ingested:.4f}"
    return [r.topic, f"{r.gib_ingested:.3f}", f"{r.puts:,.1f}", f"{r.gets:,.1f}", f"{r.gib_read:.3f}",
            f"{r.dollars_requests:.4f}", per_gib, f"{r.gib_stored:.3f}", f"{r.dollars_per_month_stored:.4f}"]
