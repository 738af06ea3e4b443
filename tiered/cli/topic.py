"""`tiered topic create|list|describe`: topics through the broker's own requests, as tank-cli does.
`tiered topic config`: a topic's configuration in the catalog (and its copy in the bucket), which every broker
applies at its next look at the catalog (docs/cluster.md, "Topic configuration").
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

from tiered.cli.common import CommandError, UsageError, add_broker_argument, connect, plural, run
from tiered.cli.catalogs import CATALOG_ENV, CatalogLocation, describe_error, locate, open_catalog, open_existing
from tiered.cli.tier import add_http_argument, broker_url, http_endpoint
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

    text = "show or change a topic's configuration; every broker applies a change within about a second"
    cfg = groups.add_parser("config", help=text, description=text)
    cfg.add_argument("name")
    cfg.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                     help="set a key, repeatable or comma separated (e.g. -o remote.retention.secs=7d)")
    cfg.add_argument("--unset", action="append", default=[], metavar="KEY",
                     help="remove a key (the brokers' topic_defaults or TANK's default applies again)")
    cfg.add_argument("--catalog", dest="catalog_url", metavar="URL",
                     help="the brokers' catalog (also TIERED_CATALOG_URL or the config file)")
    cfg.add_argument("--store", dest="store_url", metavar="URL",
                     help="the brokers' object store, which keeps a copy of every topic's configuration")
    cfg.add_argument("--s3-path-style", dest="s3_path_style", action="store_const", const=True,
                     help="path-style S3 addressing (MinIO, moto)")
    cfg.add_argument("--s3-sse", dest="s3_sse", choices=("off", "s3", "kms"),
                     help="server-side encryption of the objects written, as the brokers' s3_sse (default: off)")
    cfg.add_argument("--s3-sse-kms-key-id", dest="s3_sse_kms_key_id", metavar="KEY",
                     help="with --s3-sse kms: the KMS key id, ARN or alias/NAME")
    cfg.add_argument("--config", help="TOML config file (also TIERED_CONFIG)")
    cfg.add_argument("-p", "--data-dir", dest="data_dir", help="data directory (holds the default catalog and store)")
    cfg.set_defaults(func=cmd_config)
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
    if args.catalog_url or os.environ.get(CATALOG_ENV):
        config_text = await asyncio.to_thread(_config_text, locate(args), args.name)
        if config_text is not None:
            print(f"config\t{', '.join(line for line in config_text.splitlines() if line.strip()) or '-'}")
            print(f"acks\t{ack_meaning(config_text)}")
    return 0


def _config_text(location: CatalogLocation, name: str) -> str | None:
    from tiered.catalog.topics import get_topic

    with open_existing(location) as catalog:
        row = get_topic(catalog, name)
    return row.config_text if row is not None else None


def ack_meaning(config_text: str) -> str:
    """What an acknowledgement of this topic's produces promises (docs/cluster.md, "When a broker dies")."""
    values, _ = parse_config_text(config_text)
    ack = values.get("produce.ack")
    if ack == "local":
        return ("produce.ack=local: acknowledged once appended on the leader's disk; a leader that dies loses what "
                "it had not uploaded yet (its last block window, or more while the store is down: docs/cluster.md)")
    origin = "" if ack else " (the default, unless the brokers' topic_defaults say otherwise)"
    return (f"produce.ack=durable{origin}: acknowledged once in the bucket and the catalog; survives the loss of "
            f"any broker")


def changed_config(config_text: str, options: list[str], unset: list[str]) -> str:
    """The configuration text after setting `options` (KEY=VALUE) and removing `unset` keys, one `key=value` line
    each, in their first order. Raises UsageError for a key to remove that is not set, ConfigError for a value the
    broker would refuse."""
    from tiered.topic_rules import check_config_text

    values, _ = parse_config_text(config_text)
    values.update(parse_config_text(parse_options(options))[0])
    for key in unset:
        if values.pop(key.strip().lower(), None) is None:
            raise UsageError(f"--unset {key}: the topic's configuration does not set it")
    text = "".join(f"{key}={value}\n" for key, value in values.items())
    check_config_text(text)
    return text


def cmd_config(args) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from tiered.catalog import CatalogError
    from tiered.config import SettingsError, load_settings
    from tiered.storage.topic_config import ConfigError
    from tiered.tiering.objects.store import StoreError

    try:
        settings = load_settings(args)
        outcome = asyncio.run(_config(settings, args))
    except (CatalogError, SQLAlchemyError) as error:
        print(f"tiered topic config: {describe_error(error)}", file=sys.stderr)
        return 1
    except (CommandError, ConfigError, SettingsError, StoreError, ValueError, OSError) as error:
        print(f"tiered topic config: {error}", file=sys.stderr)
        return 1
    print(outcome.text)
    return outcome.status


class _Outcome:
    def __init__(self, text: str, status: int = 0):
        self.text, self.status = text, status


async def _config(settings, args) -> _Outcome:
    from tiered.catalog.topics import get_topic, update_topic_config
    from tiered.tiering.objects.store import open_store, store_options
    from tiered.tiering.objects.topic_objects import put_topic_config

    catalog = await asyncio.to_thread(open_catalog, args)
    try:
        row = await asyncio.to_thread(get_topic, catalog, args.name)
        if row is None:
            raise UsageError(f"unknown topic {args.name!r}")
        if not args.option and not args.unset:
            return _Outcome(_describe_config(args.name, row.config_text))
        text = changed_config(row.config_text, args.option, args.unset)
        await asyncio.to_thread(update_topic_config, catalog, args.name, text)
    finally:
        await asyncio.to_thread(catalog.close)
    shown = _describe_config(args.name, text)
    store = open_store(settings.effective_store_url, **store_options(settings))
    try:
        stored = await put_topic_config(store, args.name, row.partitions, text, row.created_at)
    finally:
        await store.close()
    done = f"{shown}\nevery broker applies it at its next look at the catalog (within about a second)"
    if not stored:
        return _Outcome(f"{done}\nbut its copy in the object store was not written (see the error above): run the "
                        f"command again, or `tiered catalog rebuild` would restore the previous configuration", 1)
    return _Outcome(done)


def _describe_config(name: str, config_text: str) -> str:
    keys = [line.strip() for line in config_text.splitlines() if line.strip()]
    return f"topic {name}: {', '.join(keys) if keys else 'no keys set (the defaults apply)'}\n{ack_meaning(config_text)}"
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
        args.http, source = http_endpoint(args, "topic compact")
    except UsageError as exc:
        print(f"tiered topic compact: {exc}", file=sys.stderr)
        return 2
    try:
        status, answer = _http_json(broker_url(args.http, where), "POST")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"tiered topic compact: cannot reach {args.http} (from {source}): {exc}", file=sys.stderr)
        return 1
    if status != 202 or not isinstance(answer, dict):
        error = answer.get("error") if isinstance(answer, dict) else answer
        print(f"tiered topic compact: {error}", file=sys.stderr)
        return 1
    for p in answer["not_led"]:
        print(f"tiered topic compact: {args.name}/{p['partition']} is led by another broker "
              f"({p['leader'] or 'none yet'}): ask its HTTP endpoint", file=sys.stderr)
    tickets = {p["partition"]: p["ticket"] for p in answer["partitions"]}
    print(f"compaction of {args.name} asked for at broker {broker_url(args.http, '')} (from {source}): "
          f"{plural(len(tickets), 'partition')}", file=sys.stderr)
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
