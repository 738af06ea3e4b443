"""Remote reads give way to the hot path (issue 14, isolation).

A replay from the bucket and the durable path share the broker's event loop, its CPU and the store's bandwidth; on
a busy machine a full-speed replay would slow every block's PUT and commit, and with them every durable ack and
every tail consumer's delivery (acks and visibility wait for the commit). So while a block is about to close (within
LEAD_S of its due time, so that the bytes already on their way have drained by then) or is uploading or committing
(`enter` at its close, `leave` once it left the pipeline), remote reads stop taking in GET bodies: a paused range GET
stops reading its socket, the store soon stops sending, and the loop, the CPU and the connection are the hot path's.

A pause lasts until the hot path is quiet or for at most `max_pause_s`; after a pause cut short that way, remote
reads go on for as long as they paused before they pause again, so under a produce load that keeps blocks in flight
all the time they still get at least half of the time. `max_pause_s` 0 turns yielding off.
"""

from __future__ import annotations

from typing import Callable

from tiered.clock import Clock

LEAD_S = 0.025  # remote reads pause this long before a block is due
POLL_S = 0.005  # how often a paused read looks whether the hot path is quiet again


class HotPathGate:
    def __init__(self, max_pause_s: float, *, clock: Clock, due_in_s: Callable[[], float | None] = lambda: None):
        if max_pause_s < 0:
            raise ValueError("max_pause_s must not be negative")
        self.max_pause_s = max_pause_s
        self.busy = 0  # blocks uploading or committing
        # Seconds until the open block is due (None: no block is open): the durable path's, which builds the gate.
        self.due_in_s = due_in_s
        self.paused_s = 0.0  # time remote reads spent paused, summed over reads (for benchmarks)
        self.clock = clock
        self._turn_until = 0.0  # remote reads may go on until then although the hot path is busy

    def enter(self) -> None:
        self.busy += 1

    def leave(self) -> None:
        self.busy = max(0, self.busy - 1)

    def hot(self) -> bool:
        """Whether a block is in flight or about to close."""
        if self.busy:
            return True
        due = self.due_in_s()
        return due is not None and due <= LEAD_S

    async def turn(self) -> None:
        """Returns when a remote read may take in more bytes."""
        if self.max_pause_s == 0 or not self.hot():
            return
        started = self.clock.monotonic()
        if started < self._turn_until:
            return
        deadline = started + self.max_pause_s
        now = started
        while now < deadline and self.hot():
            await self.clock.sleep(min(POLL_S, deadline - now))
            now = self.clock.monotonic()
        self.paused_s += now - started
        if now >= deadline:
            self._turn_until = now + (now - started)
