"""`tiered catalog ...`: the catalog as a whole.

    tiered catalog rebuild --catalog URL --store URL [--s3-path-style] [--force] [--read-timestamps]
        reconstruct the catalog from the bucket alone (block footers, segment keys and index objects), with the
        brokers stopped. The catalog is migrated to head first and must hold no topics, blocks or segments;
        --force deletes those rows first. See tiered.tiering.recovery.rebuild for what the bucket cannot tell.

    tiered catalog check [--catalog URL] [-t TOPIC]
        check that every seq from each partition's first available seq to its high-water mark has exactly one
        location (a remote segment or a block run); one line per problem, exit 1 if there is any.

Like `tiered db`, URLs may also come from TIERED_CATALOG_URL / TIERED_STORE_URL or the config file. S3 credentials
and the endpoint come from the AWS environment (AWS_ENDPOINT_URL, ...), as for the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from tiered.cli.catalogs import describe_error, locate, open_existing
from tiered.cli.common import CommandError, Progress, UsageError
from tiered.config import SettingsError, load_settings, mask_url


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("catalog", help="the catalog as a whole", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="catalog_command", metavar="COMMAND", required=True)
    text = "reconstruct the catalog from the object store alone (brokers stopped)"
    rebuild = commands.add_parser("rebuild", help=text, description=text)
    rebuild.add_argument("--catalog", dest="catalog_url", metavar="URL",
                         help="catalog to fill: sqlite:///path or postgresql+psycopg://user@host/db")
    rebuild.add_argument("--store", dest="store_url", metavar="URL",
                         help="object store: s3://bucket/prefix or file:///dir")
    rebuild.add_argument("--s3-path-style", dest="s3_path_style", action="store_const", const=True,
                         help="path-style S3 addressing (MinIO, moto)")
    rebuild.add_argument("--s3-sse", dest="s3_sse", choices=("off", "s3", "kms"),
                         help="server-side encryption of the objects written, as the brokers' s3_sse (default: off)")
    rebuild.add_argument("--s3-sse-kms-key-id", dest="s3_sse_kms_key_id", metavar="KEY",
                         help="with --s3-sse kms: the KMS key id, ARN or alias/NAME")
    rebuild.add_argument("--config", help="TOML config file (also TIERED_CONFIG)")
    rebuild.add_argument("-p", "--data-dir", dest="data_dir",
                         help="data directory (holds the default catalog and store)")
    rebuild.add_argument("--force", action="store_true",
                         help="delete the catalog's topics, blocks and segments first instead of refusing")
    rebuild.add_argument("--read-timestamps", action="store_true",
                         help="read every remote segment whole for its min/max timestamps (else recorded as unknown)")
    rebuild.add_argument("--concurrency", type=int, default=16, help="object GETs in flight (default 16)")
    rebuild.set_defaults(func=cmd_rebuild)
    text = "check that every acknowledged seq has exactly one location in the catalog"
    check = commands.add_parser("check", help=text, description=text)
    check.add_argument("--catalog", dest="catalog_url", metavar="URL",
                       help="catalog to check: sqlite:///path or postgresql+psycopg://user@host/db")
    check.add_argument("--config", help="TOML config file (also TIERED_CONFIG)")
    check.add_argument("-p", "--data-dir", dest="data_dir", help="data directory (holds the default catalog)")
    check.add_argument("-t", "--topic", help="only this topic")
    check.set_defaults(func=cmd_check)


def cmd_rebuild(args: argparse.Namespace) -> int:
    # Imported here, not at the top: every `tiered` command builds this parser.
    from sqlalchemy.exc import SQLAlchemyError

    from tiered.catalog import CatalogError
    from tiered.catalog.migrate import upgrade
    from tiered.tiering.recovery.rebuild import CatalogNotEmpty
    from tiered.tiering.objects.store import StoreError

    failures = (SettingsError, CatalogError, CatalogNotEmpty, SQLAlchemyError, StoreError, ValueError, OSError)
    catalog_url = None
    try:
        settings = load_settings(args)
        catalog_url = settings.effective_catalog_url
        upgrade(catalog_url)
        report = asyncio.run(_rebuild(settings, args))
    except failures as error:
        where = f" {mask_url(catalog_url)}" if catalog_url else ""
        print(f"tiered catalog rebuild:{where}: {error}", file=sys.stderr)
        return 1
    print(f"catalog {mask_url(catalog_url)} rebuilt from {settings.effective_store_url}")
    print(report.summary())
    return 0


async def _rebuild(settings, args: argparse.Namespace):
    from tiered.catalog import Catalog
    from tiered.tiering.recovery.rebuild import rebuild_catalog
    from tiered.tiering.objects.store import open_store, store_options

    store = open_store(settings.effective_store_url, **store_options(settings))
    catalog = await asyncio.to_thread(Catalog.open, settings.effective_catalog_url)
    progress = Progress("objects read", unit="obj")
    try:
        return await rebuild_catalog(store, catalog, progress=progress, force=args.force,
                                     read_timestamps=args.read_timestamps, concurrency=args.concurrency)
    finally:
        progress.finish()
        await store.close()
        await asyncio.to_thread(catalog.close)


def cmd_check(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from tiered.catalog import CatalogError
    from tiered.catalog.check import check_catalog

    location = None
    try:
        location = locate(args)
        with open_existing(location) as catalog:
            report = check_catalog(catalog, args.topic)
    except CommandError as error:
        print(f"tiered catalog check: {error}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    except (CatalogError, SQLAlchemyError, ValueError, OSError) as error:
        where = f" {location.describe()}:" if location else ""
        print(f"tiered catalog check:{where} {describe_error(error)}", file=sys.stderr)
        return 1
    for problem in report.problems:
        print(problem)
    locations = sum(p.locations for p in report.partitions)
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    print(f"{len(report.partitions)} partitions, {locations} locations checked: {verdict}", file=sys.stderr)
    return 0 if report.ok else 1
