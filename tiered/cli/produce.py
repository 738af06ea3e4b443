"""`tiered produce`: messages from arguments, or one per line from a file or stdin (as tank-cli produce).

Lines are grouped into bundles of up to `-s` messages (default 500) and up to 1 MiB, from what has been read when a
bundle can go out, so a file goes in full bundles while a line typed at a terminal goes at once. Up to `--in-flight`
produce requests are outstanding at once (default 64): on a durable topic each waits for its block's
commit (the block window, 250 ms by default), so requests in flight, not sent one after another, set the rate.

A produce that fails ambiguously (the broker answered 0x02/0x03, or nothing came within `--timeout`) may still be
committed: the command says so, with the first seq to check before retrying, instead of inviting a duplicate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO

from tiered.cli.common import (CommandError, Progress, UsageError, add_broker_argument, add_deprecated_flag, connect,
                               plural, run)
from tiered.client import Client, NotConfirmed, TankError, UnknownTopic
from tiered.protocol.bundle import Message
from tiered.topic_rules import MAX_PARTITIONS

DEFAULT_BUNDLE_MESSAGES = 500
MAX_BUNDLE_BYTES = 1 << 20
DEFAULT_IN_FLIGHT = 64
DEFAULT_TIMEOUT_S = 30.0
READ_AHEAD_LINES = 4 * DEFAULT_BUNDLE_MESSAGES * DEFAULT_IN_FLIGHT
MESSAGE_OVERHEAD_BYTES = 16  # a message's flags, timestamp and length in a bundle, counted against MAX_BUNDLE_BYTES


def register(sub) -> None:
    p = sub.add_parser("produce", help="produce messages to a partition", description=__doc__.split("\n\n")[0])
    add_broker_argument(p)
    p.add_argument("-t", "--topic", required=True, metavar="TOPIC[/PARTITION]", help="topic, and partition (default 0)")
    p.add_argument("--partition", type=int, default=None, help="partition (instead of TOPIC/PARTITION)")
    add_deprecated_flag(p, "-p", "partition", type=int, instead="-t TOPIC/PARTITION or --partition",
                        why="-p is the data directory in every other command")
    p.add_argument("-s", "--bundle-size", type=int, default=DEFAULT_BUNDLE_MESSAGES, metavar="N",
                   help=f"at most N messages per bundle (default {DEFAULT_BUNDLE_MESSAGES})")
    p.add_argument("-f", "--file", help="one message per line from this file, or - for stdin")
    p.add_argument("-K", "--key", help="key for every message")
    p.add_argument("-S", "--seq", type=int, help="explicit first seq (ProduceWithSeqnum, sparse bundles)")
    p.add_argument("--in-flight", type=int, default=DEFAULT_IN_FLIGHT, metavar="N",
                   help=f"produce requests outstanding at once (default {DEFAULT_IN_FLIGHT})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"how long to wait for each acknowledgement (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("messages", nargs="*")
    p.set_defaults(func=lambda a: run(produce(a), "produce"))


def topic_partition(args: argparse.Namespace) -> tuple[str, int]:
    """TOPIC[/PARTITION] and -p as (topic, partition). Raises UsageError naming what is allowed."""
    topic, slash, part = args.topic.partition("/")
    if args.partition is not None:
        if slash:
            raise UsageError(f"-t {args.topic} names a partition already: give --partition or TOPIC/PARTITION, "
                             "not both")
        partition = args.partition
    elif not slash:
        partition = 0
    elif part.isascii() and part.isdigit():
        partition = int(part)
    else:
        raise UsageError(f"bad partition {part!r} in -t {args.topic}: want TOPIC/PARTITION with a number "
                         f"0..{MAX_PARTITIONS - 1}")
    if not 0 <= partition < MAX_PARTITIONS:
        raise UsageError(f"partition {partition} does not exist: partitions are numbered 0..{MAX_PARTITIONS - 1}")
    return topic, partition


def check_partition(ranges: list, topic: str, partition: int) -> None:
    """`ranges`: the topic's DiscoverPartitions answer, one per partition."""
    if partition >= len(ranges):
        raise CommandError(f"unknown partition {topic}/{partition}: {topic} has partitions 0..{len(ranges) - 1}")


class LineReader:
    """Lines from a stream, read by a thread so that waiting for input never blocks the event loop; at most
    READ_AHEAD_LINES are read ahead of the sender. `get_batch` returns what is there (at least one line)."""

    def __init__(self, stream: BinaryIO, loop: asyncio.AbstractEventLoop):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.room = threading.Semaphore(READ_AHEAD_LINES)
        self.ended = False
        self._loop = loop
        threading.Thread(target=self._read, args=(stream,), daemon=True, name="produce-reader").start()

    def _read(self, stream: BinaryIO) -> None:
        try:
            with stream:
                for line in stream:
                    self.room.acquire()
                    self._loop.call_soon_threadsafe(self.queue.put_nowait, line)
        except Exception as exc:  # delivered to the sender, which reports it in one line
            self._loop.call_soon_threadsafe(self.queue.put_nowait, exc)
        self._loop.call_soon_threadsafe(self.queue.put_nowait, None)

    async def get_batch(self, max_messages: int, max_bytes: int) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        while not self.ended and len(out) < max_messages and size < max_bytes:
            if out and self.queue.empty():
                break
            item = await self.queue.get()
            if item is None:
                self.ended = True
            elif isinstance(item, Exception):
                raise CommandError(f"cannot read {item}") from None
            else:
                self.room.release()
                line = item.rstrip(b"\r\n")
                out.append(line)
                size += len(line) + MESSAGE_OVERHEAD_BYTES
        return out


@dataclass
class Outcome:
    confirmed: int = 0  # messages acknowledged
    unconfirmed: int = 0  # messages whose outcome is unknown
    refused: int = 0  # messages the broker refused outright
    first_unconfirmed: int | None = None  # how many messages were sent before the first unknown one
    error: TankError | None = None


class Sender:
    """Produce requests to the partition's leader, up to `in_flight` outstanding, their answers taken in order (one
    partition's appends and acknowledgements are in request order). Progress counts confirmed input bytes when
    `by_bytes` (a file of known size: the bar has an ETA), else confirmed messages."""

    def __init__(self, client: Client, topic: str, partition: int, args: argparse.Namespace, progress: Progress,
                 by_bytes: bool = False):
        self.client, self.topic, self.partition = client, topic, partition
        self.in_flight, self.timeout_s, self.seq = args.in_flight, args.timeout, args.seq
        self.key = args.key.encode() if args.key else None
        self.progress = progress
        self.by_bytes = by_bytes
        # (request, its messages, the messages sent before it, its input bytes)
        self.pending: deque[tuple[asyncio.Task, int, int, int]] = deque()
        self.sent = 0
        self.bundles = 0
        self.outcome = Outcome()

    async def send(self, values: list[bytes]) -> bool:
        """Sends one bundle; False once a request failed (nothing more is sent)."""
        while len(self.pending) >= self.in_flight:
            await self._settle_oldest()
        if self.outcome.error is not None:
            return False
        now_ms = int(time.time() * 1000)
        if self.seq is None:
            messages = [Message(v, self.key, now_ms) for v in values]
            call = self.client.produce(self.topic, self.partition, messages, timeout_s=self.timeout_s)
        else:
            first = self.seq + self.sent
            messages = [Message(v, self.key, now_ms, first + i) for i, v in enumerate(values)]
            call = self.client.produce_with_seqnum(self.topic, self.partition, messages, timeout_s=self.timeout_s)
        input_bytes = sum(len(v) + 1 for v in values)  # each line and its newline
        self.pending.append((asyncio.ensure_future(call), len(values), self.sent, input_bytes))
        self.sent += len(values)
        self.bundles += 1
        return True

    async def finish(self) -> Outcome:
        while self.pending:
            await self._settle_oldest()
        return self.outcome

    async def _settle_oldest(self) -> None:
        task, count, before, input_bytes = self.pending.popleft()
        outcome = self.outcome
        try:
            await task
        except NotConfirmed as exc:  # also the client's ConnectionLost: sent, then the connection went
            self._unconfirmed(exc, count, before)
        except (ConnectionError, OSError) as exc:  # no broker could be reached: nothing was sent
            outcome.refused += count
            outcome.error = outcome.error or TankError(str(exc) or type(exc).__name__)
        except TankError as exc:
            outcome.refused += count
            outcome.error = outcome.error or exc
        else:
            outcome.confirmed += count
            self.progress.add(input_bytes if self.by_bytes else count)

    def _unconfirmed(self, error: NotConfirmed, count: int, before: int) -> None:
        outcome = self.outcome
        outcome.unconfirmed += count
        if outcome.first_unconfirmed is None:
            outcome.first_unconfirmed = before
        outcome.error = outcome.error or error


def _source(args: argparse.Namespace) -> tuple[BinaryIO | None, int | None]:
    """The input stream and, for a regular file, its size."""
    if not args.file:
        return None, None
    if args.file == "-":
        return sys.stdin.buffer, None
    try:
        stream = open(args.file, "rb")
    except OSError as exc:
        raise CommandError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    info = os.fstat(stream.fileno())
    return stream, info.st_size if stat.S_ISREG(info.st_mode) else None


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, value, low in (("-s/--bundle-size", args.bundle_size, 1), ("--in-flight", args.in_flight, 1)):
        if value < low:
            raise UsageError(f"{flag} must be at least {low}, not {value}")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    if args.seq is not None and args.seq < 1:
        raise UsageError(f"-S/--seq must be at least 1, not {args.seq}")
    if not args.file and not args.messages:
        raise UsageError("nothing to produce: give messages as arguments or -f FILE (- for stdin)")


async def produce(args: argparse.Namespace) -> int:
    topic, partition = topic_partition(args)
    _check_numbers(args)
    stream, size = _source(args)
    started = time.monotonic()
    async with await connect(args) as client:
        try:
            ranges = await client.discover_partitions(topic)
        except UnknownTopic:
            raise CommandError(f"unknown topic {topic!r} (`tiered topic create {topic} <partitions>` creates it)")
        check_partition(ranges, topic, partition)
        hwmark = ranges[partition].hwmark
        by_bytes = size is not None and not args.messages
        progress = Progress(f"{topic}/{partition}", size if by_bytes else None, unit="B" if by_bytes else "msg")
        sender = Sender(client, topic, partition, args, progress, by_bytes)
        try:
            for start in range(0, len(args.messages), args.bundle_size):
                await sender.send([m.encode() for m in args.messages[start : start + args.bundle_size]])
            if stream is not None:
                reader = LineReader(stream, asyncio.get_running_loop())
                while not reader.ended and sender.outcome.error is None:
                    values = await reader.get_batch(args.bundle_size, MAX_BUNDLE_BYTES)
                    if values and not await sender.send(values):
                        break
            outcome = await sender.finish()
        finally:
            progress.finish()
    if outcome.error is not None:
        raise CommandError(_failure(topic, partition, args, outcome, hwmark))
    print(f"produced {plural(outcome.confirmed, 'message')} to {topic}/{partition} in "
          f"{plural(sender.bundles, 'bundle')} ({time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 0


def _failure(topic: str, partition: int, args: argparse.Namespace, outcome: Outcome, hwmark: int) -> str:
    """One line: what happened, what may be committed, and where to look before retrying."""
    done = f"{plural(outcome.confirmed, 'message')} confirmed"
    error = outcome.error
    if not isinstance(error, NotConfirmed):
        return f"{error}; {done}, {plural(outcome.refused + outcome.unconfirmed, 'message')} not written"
    before = outcome.first_unconfirmed or 0
    if args.seq is not None:
        first, where = args.seq + before, f"seq {args.seq + before}"
    else:  # exact when no one else produced to the partition meanwhile
        first = hwmark + 1 + before
        where = f"from seq {first} (the partition's high-water mark was {hwmark} when this produce started)"
    return (f"{topic}/{partition}: {plural(outcome.unconfirmed, 'message')} not confirmed: {error.reason}; they may "
            f"still be committed: check {where} with `tiered consume -t {topic}/{partition} -d {first}` before "
            f"retrying ({done}, {plural(outcome.refused, 'message')} refused)")
