"""What the clients of one broker may hold of it, together: memory for requests being received, connections, and the
time a request may take to arrive. Past a limit the connection that asks for more is closed (and said so once, with
a count, never a traceback per connection); every other client is served as before.

- RECEIVE_BUDGET_BYTES: bytes of frames not yet received whole (a big frame's buffer grows as its bytes arrive), and
  of whole frames not yet handled, across all connections. Without it three clients each sending most of a 255 MiB
  frame hold three quarters of a gigabyte.
- max_connections(): open connections; a client past it is closed at accept. Kept below the process's file limit,
  so the listener itself never runs out of descriptors (where asyncio's accept loop would log a traceback per try).
- REQUEST_DEADLINE_S: from a frame's first byte to its last. The idle timer alone would keep a client that trickles
  one byte a second forever.
"""

from __future__ import annotations

import logging
import resource
import time

log = logging.getLogger("tiered.server")

RECEIVE_BUDGET_BYTES = 1 << 30
REQUEST_DEADLINE_S = 120.0
MAX_CONNECTIONS = 10_000
RESERVED_FDS = 256  # descriptors kept for segment files, the catalog, the object store and the HTTP endpoint
REPORT_EVERY_S = 10.0


def max_connections() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft - RESERVED_FDS))


class ReceiveBudget:
    """Bytes held for requests across connections; `reserve` says whether `n` more fit."""

    def __init__(self, limit: int = RECEIVE_BUDGET_BYTES):
        self.limit = limit
        self.used = 0
        self.refused = Throttled("request buffer budget spent ({limit} bytes): closed {count} connection(s) that "
                                 "asked for more")

    def reserve(self, n: int) -> bool:
        if self.used + n > self.limit:
            self.refused.count_one(limit=self.limit)
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used -= n


class Throttled:
    """A warning said at most once per REPORT_EVERY_S, with how many times it happened since it was last said."""

    def __init__(self, text: str, clock=time.monotonic):
        self.text = text
        self.clock = clock
        self.count = 0
        self.total = 0
        self._said_at: float | None = None

    def count_one(self, **values) -> None:
        self.count += 1
        self.total += 1
        now = self.clock()
        if self._said_at is None or now - self._said_at >= REPORT_EVERY_S:
            log.warning(self.text.format(count=self.count, **values))
            self.count = 0
            self._said_at = now


class AcceptErrors:
    """An event loop exception handler that turns asyncio's accept-loop errors (a traceback per failed accept, e.g.
    out of file descriptors) into one warning per REPORT_EVERY_S with a count; everything else goes to the handler
    that was there before."""

    def __init__(self, previous=None):
        self.previous = previous
        self.said = Throttled("accepting connections failed {count} time(s): {error}")

    def __call__(self, loop, context: dict) -> None:
        message = str(context.get("message", ""))
        if message.startswith("socket.accept() out of system resource") or "accept" in message and \
                isinstance(context.get("exception"), OSError):
            self.said.count_one(error=context.get("exception"))
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)
