"""`tiered topic create|list|describe`: topics through the broker's own requests, as tank-cli does.
`tiered topic compact`: a key compaction asked of a broker's HTTP endpoint (`-P`), whose progress it shows."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

from tiered.cli.common import UsageError, add_broker_argument, connect, plural, run
from tiered.cli.tier import add_http_argument, broker_url
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

    k = groups.add_parser("compact", help="compact a topic's local segments now (log.cleanup.policy=cleanup), "
                                          "showing the progress of each partition")
    k.add_argument("name")
    add_http_argument(k)
    k.add_argument("--partition", type=int, help="only this partition")
    k.add_argument("--no-wait", action="store_true", help="ask for the compaction and return at once")
    k.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="give up waiting after this long (the passes go on; default 3600)")
    k.set_defaults(func=compact)


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


POLL_INTERVAL_S = 0.3


def _http_json(url: str, method: str = "GET") -> tuple[int, object]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _pass_line(name: str, p: dict, which: str = "last") -> str:
    last = p[which] or {}
    head = f"{name}/{p['partition']}:"
    if last.get("error"):
        return f"{head} failed: {last['error']}"
    if last.get("skipped"):
        return f"{head} nothing done: {last['skipped']}"
    line = (f"{head} {plural(last['groups'], 'group')}, {plural(last['segments_before'], 'segment')} -> "
            f"{last['segments_after']}, {last['bytes_before']:,} -> {last['bytes_after']:,} bytes, "
            f"{last['messages_before']:,} -> {last['messages_after']:,} messages, {plural(last['keys'], 'key')}, "
            f"{plural(last['tombstones_kept'], 'tombstone')} kept, {last['tombstones_dropped']:,} dropped, "
            f"{last['seconds']:.1f} s")
    return line + (f" (stopped: {last['stopped']})" if last.get("stopped") else "")


def compact(args) -> int:
    """Asks for a pass over every partition led by the broker at `-P`, then prints each one's progress (stderr)
    and result (stdout) until every pass asked for has ended. Exit 1 when a pass failed or cannot be asked for."""
    where = f"/v1/compact?topic={quote(args.name)}"
    if args.partition is not None:
        where += f"&partition={args.partition}"
    try:
        status, answer = _http_json(broker_url(args.http, where), "POST")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"tiered topic compact: cannot reach {args.http}: {exc}", file=sys.stderr)
        return 1
    if status != 202 or not isinstance(answer, dict):
        error = answer.get("error") if isinstance(answer, dict) else answer
        print(f"tiered topic compact: {error}", file=sys.stderr)
        return 1
    for p in answer["not_led"]:
        print(f"tiered topic compact: {args.name}/{p['partition']} is led by another broker "
              f"({p['leader'] or 'none yet'}): ask its HTTP endpoint", file=sys.stderr)
    tickets = {p["partition"]: p["ticket"] for p in answer["partitions"]}
    print(f"compaction of {args.name} asked for: {plural(len(tickets), 'partition')}", file=sys.stderr)
    if args.no_wait or not tickets:
        return 1 if answer["not_led"] else 0
    return _follow(args, tickets, bool(answer["not_led"]))


def _follow(args, tickets: dict[int, int], failed: bool) -> int:
    deadline = time.monotonic() + args.timeout
    shown: dict[int, object] = {}
    url = broker_url(args.http, "/v1/compaction")
    while tickets:
        try:
            _, partitions = _http_json(url)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            print(f"tiered topic compact: cannot read {url}: {exc}", file=sys.stderr)
            return 1
        for p in partitions:  # type: ignore[union-attr]
            n = p["partition"]
            if p["topic"] != args.name or n not in tickets:
                continue
            if p["finished"] >= tickets[n]:
                print(_pass_line(args.name, p))
                failed = failed or bool((p["last"] or {}).get("error"))
                del tickets[n]
            elif p["current"] is not None and p["current"] != shown.get(n):
                shown[n] = p["current"]
                print(f"{args.name}/{n}: running, {_pass_line(args.name, p, 'current').split(': ', 1)[1]}",
                      file=sys.stderr)
        if tickets and time.monotonic() > deadline:
            print(f"tiered topic compact: still running after {args.timeout:.0f} s: "
                  f"partitions {sorted(tickets)}", file=sys.stderr)
            return 1
        if tickets:
            time.sleep(POLL_INTERVAL_S)
    return 1 if failed else 0
