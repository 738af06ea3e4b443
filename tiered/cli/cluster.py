"""`tiered cluster ...`: several brokers as one service (docs/cluster.md), read from and written to the catalog.

    tiered cluster status [--catalog URL] [-t TOPIC]
        the brokers (advertised endpoint, lease, leaderships) and the leader of every partition.

    tiered cluster rebalance [--catalog URL] [--dry-run]
        evens out the leaderships over the live brokers: each move is asked of the partition's leader, which hands
        it over cleanly at its next look at the catalog (it stops taking produces, commits what it holds, and the
        new leader claims the partition).

Like `tiered catalog`, the URL may also come from TIERED_CATALOG_URL or the config file (inside a broker's pod the
environment names it already).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from datetime import datetime, timezone

from tiered.cli.catalogs import describe_error, open_catalog
from tiered.cli.common import CommandError, print_table
from tiered.config import SettingsError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cluster", help="brokers, leases and partition leaders",
                                   description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    text = "the brokers, their leases and the leader of every partition"
    status = commands.add_parser("status", help=text, description=text)
    _catalog_flags(status)
    status.add_argument("-t", "--topic", help="only this topic's partitions")
    status.set_defaults(func=cmd_status)
    text = "move leaderships so that every live broker leads as many partitions as the others (give or take one)"
    rebalance = commands.add_parser("rebalance", help=text, description=text)
    _catalog_flags(rebalance)
    rebalance.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    rebalance.set_defaults(func=cmd_rebalance)


def _catalog_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog", dest="catalog_url", metavar="URL",
                        help="the brokers' catalog: postgresql+psycopg://user@host/db (or sqlite:///path)")
    parser.add_argument("--config", help="TOML config file (also TIERED_CONFIG)")
    parser.add_argument("-p", "--data-dir", dest="data_dir", help="data directory (holds the default catalog)")


def _open(args: argparse.Namespace):
    return open_catalog(args)


def _failures() -> tuple[type[BaseException], ...]:
    from sqlalchemy.exc import SQLAlchemyError

    from tiered.catalog import CatalogError

    return CommandError, SettingsError, CatalogError, SQLAlchemyError, ValueError, OSError


def cmd_status(args: argparse.Namespace) -> int:
    from tiered.catalog import cluster

    try:
        with _open(args) as catalog:
            members = cluster.members(catalog)
            assignments = cluster.assignments(catalog, args.topic)
    except _failures() as error:
        print(f"tiered cluster status: {describe_error(error)}", file=sys.stderr)
        return 1
    now = datetime.now(timezone.utc)
    leads = Counter(a.leader_broker for a in assignments)
    print_table(["broker", "advertised", "http", "lease", "leads"], [
        [str(m.broker_id), m.advertised or "-", m.http_endpoint or "-",
         _lease(m.live, m.lease_expires_at, now), str(leads.get(m.broker_id, 0))] for m in members])
    live = {m.broker_id for m in members if m.live}
    print()
    print_table(["topic", "partition", "leader", "epoch", "first", "hwmark", "note"], [
        [a.topic, str(a.partition), "-" if a.leader_broker is None else str(a.leader_broker), str(a.leader_epoch),
         str(a.first_available_seq), str(a.hwmark_seq), _note(a, live)] for a in assignments])
    return 0


def _lease(live: bool, expires: datetime | None, now: datetime) -> str:
    if expires is None:
        return "never registered"
    left = (expires - now).total_seconds()
    return f"live, {left:.1f} s left" if live else f"expired {-left:.0f} s ago"


def _note(a, live: set[int]) -> str:
    if a.leader_broker is None:
        return "no leader yet"
    if a.leader_broker not in live:
        return "leader's lease expired: being taken over"
    if a.handover_to is not None:
        return f"handing over to {a.handover_to}"
    return ""


def cmd_rebalance(args: argparse.Namespace) -> int:
    from tiered.catalog import cluster
    from tiered.tiering.cluster.cluster_decision import plan_rebalance

    try:
        with _open(args) as catalog:
            live = [m.broker_id for m in cluster.members(catalog) if m.live]
            moves = plan_rebalance(cluster.assignments(catalog), live)
            if not args.dry_run:
                for (topic, partition), target in sorted(moves.items()):
                    cluster.request_handover(catalog, topic, partition, target)
            url = catalog.url
    except _failures() as error:
        print(f"tiered cluster rebalance: {describe_error(error)}", file=sys.stderr)
        return 1
    for (topic, partition), target in sorted(moves.items()):
        print(f"{topic}/{partition} -> broker {target}")
    verb = "would move" if args.dry_run else "asked the leaders to move"
    print(f"{len(live)} live brokers; {verb} {len(moves)} partitions ({url})", file=sys.stderr)
    return 0
