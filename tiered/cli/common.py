"""What the client-side commands share: the broker endpoint flag, running a coroutine, progress lines."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from tiered.client import Client, TankError
from tiered.config import DEFAULT_PORT, SettingsError, parse_endpoint


def add_broker_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-b", "--broker", default=f"127.0.0.1:{DEFAULT_PORT}",
                        help="broker endpoint [addr:]port (default 127.0.0.1:11011)")


async def connect(args) -> Client:
    host, port = parse_endpoint(args.broker, DEFAULT_PORT)
    if host == "0.0.0.0":
        host = "127.0.0.1"
    return await Client.connect(host, port)


def run(coro) -> int:
    """Runs a command coroutine; known failures print one line on stderr and exit 1."""
    try:
        return asyncio.run(coro) or 0
    except (TankError, SettingsError, ConnectionError, OSError, asyncio.TimeoutError) as exc:
        print(f"tiered: {exc or type(exc).__name__}", file=sys.stderr)
        return 1


class Progress:
    """A progress line on stderr, redrawn at most every `interval_s`, only when stderr is a terminal."""

    def __init__(self, what: str, total: int | None = None, interval_s: float = 0.5, stream=None):
        self.what = what
        self.total = total
        self.done = 0
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self._last = 0.0
        self.enabled = self.stream.isatty()

    def add(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval_s:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self.started, 1e-9)
        total = f"/{self.total}" if self.total else ""
        self.stream.write(f"\r{self.what}: {self.done}{total} ({rate:,.0f}/s)   ")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
