"""`tiered replay`: a topic's history, read from the bucket (not through a broker), to Parquet or into a topic.

    tiered replay events --parquet ./events-parquet                      every partition, everything, to Parquet
    tiered replay events -P 0,3 --starting-timestamp 2025-06-01T00:00 --ending-timestamp 2025-06-02T00:00 \\
        --parquet s3://analytics/events/2025-06-01
    tiered replay events --to-broker 10.0.0.7:11011 --to-topic events --keep-seqs   a copy, seqs kept
    tiered replay users --latest-per-key --parquet ./users-snapshot       the latest value of every key

With --latest-per-key the output is the snapshot of the range instead of every message: per partition, each key's
latest message unless it is a tombstone (an empty value), and every keyless message, in seq order
(docs/compaction.md). The splits are read twice: all to learn each key's latest seq, then those holding anything
kept to write it.

The catalog and store URLs come from the settings, as for `tiered serve` (--catalog, --store, TIERED_*, --config,
else the data dir's defaults); S3 credentials and endpoint from the AWS environment. One process reads the splits
in (partition, seq) order with pyarrow (tiered.spark.replay): no Spark or Java needed; for cluster-scale replays use
the `tiered` Spark data source, which reads the same splits in parallel. Needs pyarrow (`pip install tiered[spark]`).
A progress bar (messages, rate) is drawn on stderr when it is a terminal; the summary line is printed on success,
one error line otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from tiered.cli.catalogs import locate, open_existing
from tiered.cli.common import (
    CommandError,
    Progress,
    add_broker_argument,
    add_deprecated_flag,
    brokers,
    client_tls,
    connect_to,
    fail,
    plural,
)
from tiered.client import TankError
from tiered.config import SettingsError, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay", help="export a topic's history from the bucket to Parquet, or produce it into a topic",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("topic", help="the topic to replay")
    p.add_argument("--partitions", help="comma-separated partitions (default: all)")
    add_deprecated_flag(p, "-P", "partitions", instead="--partitions", why="-P is the HTTP endpoint of serve")
    p.add_argument("--starting-seq", help="first seq, inclusive")
    p.add_argument("--ending-seq", help="last seq, inclusive (default: the high-water mark)")
    p.add_argument("--starting-timestamp", help="messages at or after this time (ms since the epoch, or ISO-8601)")
    p.add_argument("--ending-timestamp", help="messages before this time (exclusive)")
    p.add_argument("--max-split-bytes", help="most bytes of one split, one Parquet file (default 128MiB)")
    p.add_argument("--latest-per-key", action="store_true",
                   help="only the latest message of each key (tombstoned keys left out) and every keyless message")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--parquet", metavar="DEST",
                        help="write Parquet files to a local directory or s3://bucket/prefix")
    target.add_argument("--to-topic", help="produce into this topic (same partition numbers)")
    add_broker_argument(p, ("--to-broker",), "for --to-topic, the broker")
    p.add_argument("--keep-seqs", action="store_true", help="keep each message's seq (ProduceWithSeqnum)")
    p.add_argument("--bundle-size", type=int, default=500, help="messages per produced bundle (default 500)")
    p.add_argument("--catalog", dest="catalog_url", metavar="URL", help="catalog URL (default: from the settings)")
    p.add_argument("--store", dest="store_url", metavar="URL", help="object store URL (default: from the settings)")
    p.add_argument("--s3-path-style", dest="s3_path_style", action="store_const", const=True,
                   help="path-style S3 addressing (MinIO, moto)")
    p.add_argument("--config", help="TOML config file (also TIERED_CONFIG)")
    p.add_argument("-p", "--data-dir", dest="data_dir", help="data directory (holds the default catalog and store)")
    p.set_defaults(func=cmd_replay)


def read_options(args: argparse.Namespace):
    """The replay's ReadOptions, from the flags and the settings. Raises OptionError or SettingsError."""
    from tiered.spark.options import ReadOptions

    settings = load_settings({k: getattr(args, k) for k in ("catalog_url", "store_url", "s3_path_style", "config",
                                                              "data_dir")})
    values = {
        "catalog": settings.effective_catalog_url,
        "store": settings.effective_store_url,
        "topic": args.topic,
        "partitions": args.partitions,
        "startingSeq": args.starting_seq,
        "endingSeq": args.ending_seq,
        "startingTimestamp": args.starting_timestamp,
        "endingTimestamp": args.ending_timestamp,
        "maxSplitBytes": args.max_split_bytes,
        "s3PathStyle": "true" if settings.s3_path_style else None,
    }
    return ReadOptions.parse({k: v for k, v in values.items() if v is not None})


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        from sqlalchemy.exc import SQLAlchemyError

        from tiered.catalog import CatalogError
        from tiered.spark import replay
        from tiered.spark.listing import UnknownTopicError
        from tiered.spark.options import OptionError
        from tiered.tiering.objects.store import ObjectNotFound, StoreError
    except ModuleNotFoundError as exc:
        return fail("replay", f"the Python package {exc.name} is missing: replay needs the spark extra of tiered "
                              "(pip install 'tiered[spark]')")
    if args.keep_seqs and not args.to_topic:
        return fail("replay", "--keep-seqs goes with --to-topic", status=2)
    failures = (OptionError, SettingsError, UnknownTopicError, CatalogError, StoreError, ObjectNotFound,
                replay.ReplayError, TankError, CommandError, ConnectionError, OSError, asyncio.TimeoutError,
                ValueError)
    progress = Progress(args.topic)
    try:
        # The catalog must exist before Spark opens it: a missing SQLite file would be created empty.
        open_existing(locate({k: getattr(args, k) for k in ("catalog_url", "config", "data_dir")})).close()
        options = read_options(args)
        if args.parquet:
            stats = replay.export_parquet(options, args.parquet, latest_per_key=args.latest_per_key,
                                          on_messages=progress.add)
            where = f"{plural(stats.files, 'Parquet file')} in {args.parquet}"
        else:
            stats = asyncio.run(_produce(args, options, progress, replay))
            kept = " (seqs kept)" if args.keep_seqs else ""
            where = f"{args.to_topic} at {brokers(args.to_broker, '--to-broker')}{kept}"
    except SQLAlchemyError as exc:  # e.g. a catalog that was never migrated: "no such table: topics"
        return fail("replay", f"the catalog cannot be read: {getattr(exc, 'orig', None) or exc} (is it the "
                              "brokers' catalog? --catalog, TIERED_CATALOG_URL or -p name it)")
    except failures as exc:
        return fail("replay", exc)
    finally:
        progress.finish()
    what = " (latest per key)" if args.latest_per_key else ""
    print(f"replayed {plural(stats.messages, 'message')}{what} of {args.topic} ({plural(stats.splits, 'split')}) "
          f"to {where}", file=sys.stderr)
    return 0


async def _produce(args, options, progress: Progress, replay):
    client = await connect_to(brokers(args.to_broker, "--to-broker"), client_tls(args))
    async with client:
        return await replay.produce_replay(
            options, client, args.to_topic, keep_seqs=args.keep_seqs, latest_per_key=args.latest_per_key,
            bundle_messages=args.bundle_size, on_messages=progress.add,
        )  # fmt: skip
