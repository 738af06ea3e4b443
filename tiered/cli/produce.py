"""`tiered produce`: messages from arguments, or one per line from a file or stdin (as tank-cli produce)."""

from __future__ import annotations

import sys
import time

from tiered.cli.common import Progress, add_broker_argument, connect, run
from tiered.protocol.bundle import Message


def register(sub) -> None:
    p = sub.add_parser("produce", help="produce messages to a partition")
    add_broker_argument(p)
    p.add_argument("-t", "--topic", required=True, help="topic[/partition]")
    p.add_argument("-p", "--partition", type=int, default=None)
    p.add_argument("-s", "--bundle-size", type=int, default=1, help="messages per bundle (default 1)")
    p.add_argument("-f", "--file", help="one message per line from this file, or - for stdin")
    p.add_argument("-K", "--key", help="key for every message")
    p.add_argument("-S", "--seq", type=int, help="explicit first seq (ProduceWithSeqnum, sparse bundles)")
    p.add_argument("messages", nargs="*")
    p.set_defaults(func=lambda a: run(produce(a)))


def topic_partition(args) -> tuple[str, int]:
    topic, _, part = args.topic.partition("/")
    partition = args.partition if args.partition is not None else int(part or 0)
    return topic, partition


def _lines(args):
    yield from (m.encode() for m in args.messages)
    if args.file:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
        with stream:
            for line in stream:
                yield line.rstrip(b"\r\n")


async def produce(args) -> int:
    topic, partition = topic_partition(args)
    key = args.key.encode() if args.key else None
    seq = args.seq
    progress = Progress(f"produced to {topic}/{partition}")
    async with await connect(args) as client:
        batch: list[Message] = []

        async def flush() -> None:
            nonlocal seq
            if not batch:
                return
            if seq is not None:
                await client.produce_with_seqnum(topic, partition, batch)
                seq += len(batch)
            else:
                await client.produce(topic, partition, batch)
            progress.add(len(batch))
            batch.clear()

        for value in _lines(args):
            now_ms = int(time.time() * 1000)
            batch.append(Message(value, key, now_ms, seq + len(batch) if seq is not None else 0))
            if len(batch) >= max(1, args.bundle_size):
                await flush()
        await flush()
    progress.finish()
    print(f"produced {progress.done} messages to {topic}/{partition}", file=sys.stderr)
    return 0
