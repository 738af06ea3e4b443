"""`tiered topic create|list|describe`: topics through the broker's own requests, as tank-cli does."""

from __future__ import annotations

import asyncio
import os
import sys

from tiered.cli.common import UsageError, add_broker_argument, connect, plural, run
from tiered.protocol.codes import CreateTopicStatus
from tiered.storage.topic_config import parse_config_text


def register(sub) -> None:
    p = sub.add_parser("topic", help="create, list and describe topics")
    groups = p.add_subparsers(dest="topic_command", metavar="ACTION")
    groups.required = True

    c = groups.add_parser("create", help="create a topic")
    add_broker_argument(c)
    c.add_argument("name")
    c.add_argument("partitions", type=int, help="number of partitions, 1..65535")
    c.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="topic config, repeatable or comma separated (e.g. -o log.segment.bytes=64m); keys are "
                        "TANK's (log.segment.bytes, log.retention.*, ...) and ours (produce.ack, remote.*)")
    c.set_defaults(func=lambda a: run(create(a), "topic create"))

    ls = groups.add_parser("list", help="list topics")
    add_broker_argument(ls)
    ls.set_defaults(func=lambda a: run(list_topics(a), "topic list"))

    d = groups.add_parser("describe", help="partitions of a topic with their seq ranges, and what an ack means")
    add_broker_argument(d)
    d.add_argument("name")
    d.add_argument("--catalog", dest="catalog_url", metavar="URL",
                   help="the brokers' catalog (also TIERED_CATALOG_URL), to show the topic's config and acks")
    d.set_defaults(func=lambda a: run(describe(a), "topic describe"))


def parse_options(options: list[str]) -> str:
    lines = []
    for option in options:
        for item in option.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"bad option {item!r}: want KEY=VALUE, e.g. -o log.segment.bytes=64m")
            lines.append(f"{key.strip()}={value.strip()}\n")
    return "".join(lines)


async def create(args) -> int:
    config_text = parse_options(args.option)
    async with await connect(args) as client:
        status = await client.create_topic(args.name, args.partitions, config_text)
    if status == CreateTopicStatus.EXISTS:
        print(f"tiered topic create: topic {args.name} already exists", file=sys.stderr)
        return 1
    print(f"created topic {args.name} with {plural(args.partitions, 'partition')}")
    return 0


async def list_topics(args) -> int:
    async with await connect(args) as client:
        topics = await client.discover_topics()
    for t in sorted(topics, key=lambda t: t.name):
        print(f"{t.name}\t{t.partitions}")
    return 0


async def describe(args) -> int:
    async with await connect(args) as client:
        ranges = await client.discover_partitions(args.name)
    print("partition\tfirst_available\thwmark")
    for i, r in enumerate(ranges):
        print(f"{i}\t{r.first_available}\t{r.hwmark}")
    url = args.catalog_url or os.environ.get("TIERED_CATALOG_URL")
    if url:
        config_text = await asyncio.to_thread(_config_text, url, args.name)
        if config_text is not None:
            print(f"config\t{', '.join(line for line in config_text.splitlines() if line.strip()) or '-'}")
            print(f"acks\t{ack_meaning(config_text)}")
    return 0


def _config_text(url: str, name: str) -> str | None:
    from tiered.catalog import Catalog
    from tiered.catalog.topics import get_topic

    with Catalog.open(url) as catalog:
        row = get_topic(catalog, name)
    return row.config_text if row is not None else None


def ack_meaning(config_text: str) -> str:
    """What an acknowledgement of this topic's produces promises (docs/cluster.md, "When a broker dies")."""
    values, _ = parse_config_text(config_text)
    ack = values.get("produce.ack")
    if ack == "local":
        return ("produce.ack=local: acknowledged once appended on the leader's disk; a leader that dies loses what "
                "it had not uploaded yet (at most its last block window of this topic)")
    origin = "" if ack else " (the default, unless the brokers' topic_defaults say otherwise)"
    return (f"produce.ack=durable{origin}: acknowledged once in the bucket and the catalog; survives the loss of "
            f"any broker")
