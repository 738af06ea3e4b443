"""The access rules at the listener's edge: each request handler asks `Access.allows` before it acts on a topic.

The decision is `tiered.acl.allowed`; here is what surrounds it: the rules file in force (reloaded when it changes,
a bad file kept out with one log line), the refusal counter `tiered_requests_refused_total{op}` (labelled by
operation only: principals and topics are unbounded, so they go to the log, never into labels) and the refusal log,
at most one line per (principal, operation, topic) and REFUSAL_LINES lines per REFUSAL_WINDOW_S, so that a client
refused in a loop cannot flood it; the refusals left out are counted in the next line.

What a refused request is answered (TANK has no "not allowed"; the nearest codes, docs/protocol.md §8): a produce's
topic `fe` (read-only), a consume's topic `ffff` (unknown topic), CreateTopic `05` (read-only), ReloadConf `0b`
(unknown topic). Status, DiscoverTopics, DiscoverTopology and DiscoverPartitions are not checked: they show topic
names, partition counts and seq bounds, never messages, and every client needs them to find its way.
"""

from __future__ import annotations

import logging
from typing import Protocol

from tiered.acl import Op, RulesFile, allowed
from tiered.clock import Clock
from tiered.metrics import REQUESTS_REFUSED, Metrics

log = logging.getLogger("tiered.server")

REFUSAL_WINDOW_S = 10.0
REFUSAL_LINES = 20  # at most this many refusal lines per window
# Decisions kept for the rules in force, by (principal, operation, topic): a request costs a dict lookup, not a walk
# of the rules (some 10 to 20 µs for 50 rules). Dropped whole when the rules change or when it holds this many.
VERDICTS_KEPT = 4096


class Asker(Protocol):
    """What a check needs of a connection (tiered.server.connection.Connection)."""

    principal: str
    peer: object


class RefusalLog:
    """Which refusals are logged: pure bookkeeping, `now` passed in. `note` answers (log this one, refusals left out
    before it that were not yet reported)."""

    def __init__(self, window_s: float = REFUSAL_WINDOW_S, max_lines: int = REFUSAL_LINES):
        self.window_s = window_s
        self.max_lines = max_lines
        self._window_start: float | None = None
        self._said: set[tuple[str, str, str]] = set()
        self._left_out = 0

    def note(self, key: tuple[str, str, str], now: float) -> tuple[bool, int]:
        left_out = 0
        if self._window_start is None or now - self._window_start >= self.window_s:
            left_out, self._left_out = self._left_out, 0
            self._said.clear()
            self._window_start = now
        if key in self._said or len(self._said) >= self.max_lines:
            self._left_out += 1
            return False, 0
        self._said.add(key)
        return True, left_out


class Access:
    """The one owner of the rules in force for this broker's listeners; `active` is False without a rules file, and
    then every request is allowed without a look."""

    def __init__(self, path: str, metrics: Metrics, clock: Clock):
        self.clock = clock
        # Raises RulesError (one line) when the file does not load: a broker does not start without its rules.
        self.file = RulesFile(path, clock.monotonic()) if path else None
        self.active = self.file is not None
        self.refused = {op: 0 for op in Op}
        self._verdicts: dict[tuple[str, Op, str], bool] = {}
        self._verdicts_for = self.file.rules if self.file is not None else None
        self.refusal_log = RefusalLog()
        metrics.counter_fn(REQUESTS_REFUSED, lambda: {f'op="{op.value}"': float(n) for op, n in self.refused.items()})

    def allows(self, conn: Asker, op: Op, topic: str) -> bool:
        """Whether `conn`'s principal may do `op` on `topic`; a refusal is counted and (rate-limited) logged."""
        if self.file is None:
            return True
        rules = self.file.rules
        if rules is not self._verdicts_for or len(self._verdicts) >= VERDICTS_KEPT:
            self._verdicts.clear()
            self._verdicts_for = rules
        key = (conn.principal, op, topic)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = allowed(rules, *key)
        if verdict:
            return True
        self.refused[op] += 1
        say, left_out = self.refusal_log.note((conn.principal, op.value, topic), self.clock.monotonic())
        if say:
            log.warning("refused %s on topic %r for principal %r from %s (access rules %s)%s", op.value, topic,
                        conn.principal, _peer(conn.peer), self.file.path,
                        f"; {left_out} more refusals were not logged" if left_out else "")
        return False

    async def reload(self) -> None:
        """New rules apply to every request from the next one on, on open connections too."""
        assert self.file is not None
        reloaded, error = self.file.check(self.clock.monotonic())
        if error is not None:
            log.warning("%s; keeping the rules in force", error)
        elif reloaded:
            log.info("access rules reloaded from %s (%d rules)", self.file.path, len(self.file.rules.rules))


def _peer(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
