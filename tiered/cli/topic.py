"""`tiered topic create|list|describe`: topics through the broker's own requests, as tank-cli does."""

from __future__ import annotations

import sys

from tiered.cli.common import UsageError, add_broker_argument, connect, plural, run
from tiered.protocol.codes import CreateTopicStatus


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

    d = groups.add_parser("describe", help="partitions of a topic with their seq ranges")
    add_broker_argument(d)
    d.add_argument("name")
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
    return 0
