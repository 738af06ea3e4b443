"""`tiered tier status`: per partition, the local range, the remote range, what is still being uploaded, and the
state of its key compaction (compacted topics).

It asks the broker's HTTP endpoint (`-P`, else $TIERED_HTTP, else 127.0.0.1:9102) for `/v1/tier`, and names the
broker it read; `-b` (a TANK endpoint) is refused, since it does not lead to the HTTP endpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

from tiered.cli.common import BROKER_ENV, UsageError, print_table
from tiered.config import DEFAULT_HTTP_PORT, SettingsError, parse_endpoint

COLUMNS = (
    ("topic", "topic"), ("p", "partition"), ("local", None), ("local bytes", "local_bytes"), ("remote", None),
    ("committed", "committed_seq"), ("hwmark", "hwmark"), ("pending segs", "pending_segments"),
    ("pending bytes", "pending_segment_bytes"), ("compaction", "compaction"),
)


def register(sub) -> None:
    p = sub.add_parser("tier", help="tiered storage state")
    groups = p.add_subparsers(dest="tier_command", metavar="ACTION")
    groups.required = True
    s = groups.add_parser("status", help="local and remote seq ranges and pending uploads, per partition")
    add_http_argument(s)
    s.add_argument("--json", action="store_true", help="print the raw JSON")
    s.set_defaults(func=status)


def _range(first: int, last: int) -> str:
    return f"{first}..{last}" if first else "-"


def compaction_cell(state: dict | None) -> str:
    """`-` for a topic that is not compacted; else the state, the passes and the bytes they rewrote."""
    if state is None:
        return "-"
    cell = f"{state['state']}, {state['passes']} passes"
    if state["bytes_before"]:
        cell += f", {state['bytes_before']}->{state['bytes_after']} bytes"
    if state["failures"]:
        cell += f", {state['failures']} failed"
    return cell


def rows(partitions: list[dict]) -> list[list[str]]:
    out = []
    for p in partitions:
        # A broker without a tier below (a plain TANK broker) reports no remote fields.
        committed = p.get("committed_seq", 0)
        remote_last = max(p.get("highest_copied_seq", 0), committed)
        role = "" if p["role"] == "leader" else f" {p['role'].upper()}"  # led elsewhere, or being opened
        out.append([
            p["topic"], str(p["partition"]), _range(p["local_first"], p["local_last"]), str(p["local_bytes"]),
            _range(p["remote_first"], remote_last), str(committed), str(p["hwmark"]),
            str(p.get("pending_segments", 0)), str(p.get("pending_segment_bytes", 0)) + role,
            compaction_cell(p.get("compaction")),
        ])  # fmt: skip
    return out


def broker_url(endpoint: str, path: str) -> str:
    """The URL of `path` at a broker's `-P` endpoint: an any-address (`:9102`, `0.0.0.0`, `::`) means this host."""
    host, port = parse_endpoint(endpoint, DEFAULT_HTTP_PORT)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"


def status_url(endpoint: str) -> str:
    return broker_url(endpoint, "/v1/tier")


HTTP_ENV = "TIERED_HTTP"
DEFAULT_HTTP = f"127.0.0.1:{DEFAULT_HTTP_PORT}"


def add_http_argument(parser) -> None:
    parser.add_argument("-P", "--http", default=None, metavar="[ADDR:]PORT",
                        help=f"the broker's HTTP endpoint (default: ${HTTP_ENV}, else {DEFAULT_HTTP})")
    # Accepted so that it can be refused with the reason: the TANK port does not lead to the HTTP endpoint.
    parser.add_argument("-b", "--broker", default=None, help=argparse.SUPPRESS)


def http_endpoint(args, command: str, environ=os.environ) -> tuple[str, str]:
    """The broker's HTTP endpoint and what named it. A command that reads the HTTP endpoint refuses to guess it
    when only the TANK endpoint is named (-b or $TIERED_BROKER): it would show another broker's state."""
    if args.http:
        return args.http, "-P/--http"
    if environ.get(HTTP_ENV):
        return environ[HTTP_ENV], HTTP_ENV
    named = "-b/--broker" if args.broker else BROKER_ENV if environ.get(BROKER_ENV) else None
    if named:
        raise UsageError(f"{named} names a broker's TANK port, but {command} reads its HTTP endpoint: name that with "
                         f"-P/--http [ADDR:]PORT or ${HTTP_ENV} (the broker's -P/--http-listen, default :"
                         f"{DEFAULT_HTTP_PORT})")
    return DEFAULT_HTTP, f"the default; set -P/--http or {HTTP_ENV}"


def status(args) -> int:
    try:
        endpoint, source = http_endpoint(args, "tier status")
        url = status_url(endpoint)
    except (SettingsError, UsageError) as exc:
        print(f"tiered tier status: {exc}", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            partitions = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"tiered tier status: cannot read {url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(partitions, indent=2))
        return 0
    print(f"broker {broker_url(endpoint, '')} (from {source})", file=sys.stderr)
    print_table([name for name, _ in COLUMNS], rows(partitions))
    return 0
