"""`tiered consume`: read a partition from a seq, the beginning or the tail (as tank-cli consume).

`-d` drains up to the high-water mark and exits; without it the command follows the tail until interrupted (Ctrl-C,
exit status 130) or until `-l` messages were read, writing each response's messages as they come. Fields are chosen
with `-F seq,key,content,ts` (tab separated, one message per line). Only data goes to stdout.
"""

from __future__ import annotations

import asyncio
import sys

from tiered.cli.common import (Progress, UsageError, add_broker_argument, add_deprecated_flag, connect, run,
                               stdout_closed)
from tiered.cli.produce import topic_partition
from tiered.protocol.codes import UINT64_MAX

FIELDS = ("seq", "key", "content", "ts")


def register(sub) -> None:
    p = sub.add_parser("consume", help="consume messages from a partition", description=__doc__.split("\n\n")[0])
    add_broker_argument(p)
    p.add_argument("-t", "--topic", required=True, metavar="TOPIC[/PARTITION]", help="topic, and partition (default 0)")
    p.add_argument("--partition", type=int, default=None, help="partition (instead of TOPIC/PARTITION)")
    add_deprecated_flag(p, "-p", "partition", type=int, instead="-t TOPIC/PARTITION or --partition",
                        why="-p is the data directory in every other command")
    p.add_argument("-d", "--drain", action="store_true", help="stop at the high-water mark")
    p.add_argument("-n", "--limit", type=int, help="stop after this many messages (default: no limit)")
    add_deprecated_flag(p, "-l", "limit", type=int, instead="-n/--limit", why="-l is the listen address of serve")
    p.add_argument("-E", "--end", type=int, help="stop after this seq")
    p.add_argument("-F", "--fields", default="seq,content",
                   help=f"what to print of each message, tab separated: a comma-separated list of {', '.join(FIELDS)} "
                        "(default seq,content)")
    p.add_argument("--fetch-size", type=int, default=1 << 20, metavar="BYTES",
                   help="bytes asked for per consume request (default 1048576)")
    add_deprecated_flag(p, "-s", "fetch_size", type=int, instead="--fetch-size",
                        why="-s is the bundle size of produce")
    p.add_argument("start", nargs="?", default="beginning", help="beginning|first|end|eof|<seq> (default beginning)")
    p.set_defaults(func=lambda a: run(consume(a), "consume"))


def start_seq(text: str) -> int:
    if text in ("beginning", "first"):
        return 0
    if text in ("end", "eof"):
        return UINT64_MAX
    if text.isascii() and text.isdigit():
        return int(text)
    raise UsageError(f"bad start {text!r}: want beginning, first, end, eof or a seq")


def parse_fields(text: str) -> list[str]:
    fields = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in fields if f not in FIELDS]
    if unknown or not fields:
        raise UsageError(f"unknown fields {', '.join(unknown) or repr(text)}: -F takes a comma-separated list of "
                         f"{', '.join(FIELDS)}")
    return fields


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


# How often a quiet tail checks that someone still reads its output.
READER_CHECK_S = 0.5


async def consume(args) -> int:
    topic, partition = topic_partition(args)
    fields = parse_fields(args.fields)
    seq = start_seq(args.start)
    for flag, value in (("-n/--limit", args.limit), ("-E/--end", args.end), ("--fetch-size", args.fetch_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, not {value}")
    out = sys.stdout.buffer
    progress = Progress(f"{topic}/{partition}", data=sys.stdout)

    def write(batch) -> bool:
        """Writes one batch of messages; False once -E or -l says to stop."""
        for m in batch:
            if args.end is not None and m.seq > args.end:
                return False
            out.write(render(m, fields))
            progress.add()
            if args.limit is not None and progress.done >= args.limit:
                return False
        return True

    try:
        async with await connect(args) as client:
            if args.drain:
                async for m in client.drain(topic, partition, seq, args.end, fetch_bytes=args.fetch_size):
                    if not write((m,)):
                        break
            else:
                async def follow() -> None:
                    async for batch in client.tail_batches(topic, partition, seq, fetch_bytes=args.fetch_size):
                        going = write(batch)
                        out.flush()  # each response's messages are visible at once when following
                        if not going:
                            break

                await until_reader_gone(follow())
    finally:
        progress.finish()
        out.flush()
    return 0


async def until_reader_gone(work, interval_s: float = READER_CHECK_S) -> None:
    """Runs `work`; if stdout's reader goes away first (`| head` while the tail is quiet), stops it and raises
    BrokenPipeError, the normal end of a command whose output nobody reads (`tail -f` does the same)."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait([task], timeout=interval_s)
            if not task.done() and stdout_closed():
                raise BrokenPipeError("stdout's reader went away")
        task.result()
    finally:
        if not task.done():
            task.cancel()
            # Whatever it ends with now (the cancel, or the client closing under it) was already reported by
            # what stopped us: mark it retrieved so asyncio does not print it at exit.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
