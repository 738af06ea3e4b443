"""`tiered consume`: read a partition from a seq, the beginning or the tail (as tank-cli consume).

`-d` drains up to the high-water mark and exits; without it the command follows the tail until interrupted or until
`-l` messages were read. Fields are chosen with `-F seq,key,content,ts` (tab separated, one message per line).
"""

from __future__ import annotations

import sys

from tiered.cli.common import Progress, add_broker_argument, connect, run
from tiered.cli.produce import topic_partition
from tiered.protocol.codes import UINT64_MAX

FIELDS = ("seq", "key", "content", "ts")


def register(sub) -> None:
    p = sub.add_parser("consume", help="consume messages from a partition")
    add_broker_argument(p)
    p.add_argument("-t", "--topic", required=True, help="topic[/partition]")
    p.add_argument("-p", "--partition", type=int, default=None)
    p.add_argument("-d", "--drain", action="store_true", help="stop at the high-water mark")
    p.add_argument("-l", "--limit", type=int, help="stop after this many messages")
    p.add_argument("-E", "--end", type=int, help="stop after this seq")
    p.add_argument("-F", "--fields", default="seq,content", help=f"comma separated, of {', '.join(FIELDS)}")
    p.add_argument("-s", "--fetch-size", type=int, default=1 << 20, help="fetch size in bytes")
    p.add_argument("start", nargs="?", default="beginning", help="beginning|first|end|eof|<seq> (default beginning)")
    p.set_defaults(func=lambda a: run(consume(a)))


def start_seq(text: str) -> int:
    if text in ("beginning", "first"):
        return 0
    if text in ("end", "eof"):
        return UINT64_MAX
    if text.isdigit():
        return int(text)
    raise SystemExit(f"tiered consume: bad start {text!r} (beginning, end or a seq)")


def render(message, fields: list[str]) -> bytes:
    parts = []
    for f in fields:
        if f == "seq":
            parts.append(str(message.seq).encode())
        elif f == "key":
            parts.append(message.key or b"")
        elif f == "content":
            parts.append(message.value)
        elif f == "ts":
            parts.append(str(message.ts_ms).encode())
    return b"\t".join(parts) + b"\n"


async def consume(args) -> int:
    topic, partition = topic_partition(args)
    fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    unknown = [f for f in fields if f not in FIELDS]
    if unknown:
        raise SystemExit(f"tiered consume: unknown fields {', '.join(unknown)}")
    out = sys.stdout.buffer
    progress = Progress(f"consumed from {topic}/{partition}")
    seq = start_seq(args.start)
    async with await connect(args) as client:
        if args.drain:
            messages = client.drain(topic, partition, seq, args.end, fetch_bytes=args.fetch_size)
        else:
            messages = client.tail(topic, partition, seq, fetch_bytes=args.fetch_size)
        async for m in messages:
            if args.end is not None and m.seq > args.end:
                break
            out.write(render(m, fields))
            progress.add()
            if args.limit is not None and progress.done >= args.limit:
                break
    out.flush()
    progress.finish()
    return 0
