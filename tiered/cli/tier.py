"""`tiered tier status`: per partition, the local range, the remote range, and what is still being uploaded.

It asks the broker's HTTP endpoint (`-P`, default 127.0.0.1:9102) for `/v1/tier`.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from tiered.cli.common import print_table
from tiered.config import DEFAULT_HTTP_PORT, SettingsError, parse_endpoint

COLUMNS = (
    ("topic", "topic"), ("p", "partition"), ("local", None), ("local bytes", "local_bytes"), ("remote", None),
    ("committed", "committed"), ("hwmark", "hwmark"), ("pending segs", "pending_segments"),
    ("pending bytes", "pending_segment_bytes"),
)


def register(sub) -> None:
    p = sub.add_parser("tier", help="tiered storage state")
    groups = p.add_subparsers(dest="tier_command", metavar="ACTION")
    groups.required = True
    s = groups.add_parser("status", help="local and remote seq ranges and pending uploads, per partition")
    s.add_argument("-P", "--http", default=f"127.0.0.1:{DEFAULT_HTTP_PORT}", help="the broker's HTTP endpoint")
    s.add_argument("--json", action="store_true", help="print the raw JSON")
    s.set_defaults(func=status)


def _range(first: int, last: int) -> str:
    return f"{first}..{last}" if first else "-"


def rows(partitions: list[dict]) -> list[list[str]]:
    out = []
    for p in partitions:
        remote_last = max(p["remote_segments_last"], p["committed"])
        role = "" if p["role"] == "leader" else f" {p['role'].upper()}"  # led elsewhere, or being opened
        out.append([
            p["topic"], str(p["partition"]), _range(p["local_first"], p["local_last"]), str(p["local_bytes"]),
            _range(p["remote_first"], remote_last), str(p["committed"]), str(p["hwmark"]),
            str(p["pending_segments"]), str(p["pending_segment_bytes"]) + role,
        ])  # fmt: skip
    return out


def status_url(endpoint: str) -> str:
    """The /v1/tier URL of a broker's `-P` endpoint: an any-address (`:9102`, `0.0.0.0`, `::`) means this host."""
    host, port = parse_endpoint(endpoint, DEFAULT_HTTP_PORT)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}/v1/tier" if ":" in host else f"http://{host}:{port}/v1/tier"


def status(args) -> int:
    try:
        url = status_url(args.http)
    except SettingsError as exc:
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
    print_table([name for name, _ in COLUMNS], rows(partitions))
    return 0
