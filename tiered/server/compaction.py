"""The broker's key compaction: when a partition's local segments are compacted (tiered.storage.compaction), and
what an operator sees of it (metrics, `/v1/compaction`, `tiered topic compact`, `tiered tier status`).

One supervised loop (`Compactor.run`) looks at the compacted partitions (the registry keeps them as configs are
written: `Registry.compacted`) every `interval_s`, and at once when woken (a compaction asked for by hand). A partition is compacted when its topic's `log.cleanup.policy` is `cleanup`, this
broker leads it (a follower's disk is a cache of the leader's history: the leader compacts), and TANK's trigger
says so (`log.cleaner.min.cleanable.ratio`), or when someone asked. Passes run one at a time, in a worker thread:
they read and write files for seconds, while the event loop keeps serving. Each pass has a deadline (`deadline_s`)
and ends between two groups when the deadline passes, the partition stops being led here or the broker stops; the
groups already swapped in stay, and the next pass continues.

Consumers are never handed a file mid-swap: a group's swap runs under the partition log's lock
(PartitionLog.replace_sealed), the lock every read takes to pick its segment and open file; a read already
streaming an input segment keeps its open (unlinked) file, as with retention.

With a tier below, the tier's copy follows (Tier.compact_remote: the bucket's remote segments replaced by compacted
ones) after each local pass, after a compaction asked for by hand, and once after the broker starts, on the event
loop within the same deadline; a failure there is counted and retried with the next pass.

A compaction asked for by hand gets a ticket per partition; the partition's `finished` ticket reaches it once a
pass that began after the request has ended (run or skipped), which is how `tiered topic compact` waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

from tiered import metrics as m
from tiered.cancellation import within
from tiered.clock import SYSTEM_CLOCK, Clock, wait_for_event
from tiered.metrics import Metrics
from tiered.server.registry import Partition, Registry, Role
from tiered.storage.compaction import CompactionReport, compact_partition, compaction_due
from tiered.tier_interface import RemoteCompactionReport, Tier
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.server")

COMPACTION_INTERVAL_S = 30.0  # how often the trigger is evaluated (TANK evaluates it on each roll)
PASS_DEADLINE_S = 600.0  # a pass ends at its next group after this long


@dataclass
class Progress:
    """The latest pass's figures (while it runs: so far)."""

    started_at: float = 0.0  # unix time
    seconds: float = 0.0
    groups: int = 0
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    messages_before: int = 0
    messages_after: int = 0
    keys: int = 0
    tombstones_kept: int = 0
    tombstones_dropped: int = 0
    skipped: str | None = None
    stopped: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, report: CompactionReport, started_at: float) -> Progress:
        return cls(started_at, report.seconds, report.groups, report.segments_before, report.segments_after,
                   report.bytes_before, report.bytes_after, report.messages_before, report.messages_after,
                   report.keys, report.tombstones_kept, report.tombstones_dropped, report.skipped, report.stopped,
                   report.error)


@dataclass
class PartitionCompaction:
    """What an operator sees of one partition's compaction."""

    state: str = "idle"  # idle | queued | running
    passes: int = 0  # passes that ran (not skipped)
    failures: int = 0
    requested: int = 0  # the last ticket handed out for a compaction asked for by hand
    finished: int = 0  # every ticket up to this one is answered
    bytes_before: int = 0  # over every pass since the broker started
    bytes_after: int = 0
    last: Progress | None = None  # the latest pass that ended
    current: Progress | None = None  # the pass running now, so far
    remote_groups: int = 0  # remote compaction: groups of remote segments swapped since the broker started
    remote_bytes_before: int = 0
    remote_bytes_after: int = 0
    remote_failures: int = 0
    remote_last: str | None = None  # what the latest remote pass did, in words

    def view(self) -> dict[str, Any]:
        return asdict(self)


class Compactor:
    def __init__(self, registry: Registry, metrics: Metrics, tier: Tier, *, clock: Clock = SYSTEM_CLOCK,
                 now_s: Callable[[], float] = time.time):
        self.registry = registry
        self.metrics = metrics
        self.tier = tier
        self._remote_synced: set[TopicPartition] = set()  # led partitions whose tier copy had a pass since start
        self.clock = clock
        self.now_s = now_s
        self.interval_s = COMPACTION_INTERVAL_S
        self.deadline_s = PASS_DEADLINE_S
        self.partitions: dict[TopicPartition, PartitionCompaction] = {}
        self._wake = asyncio.Event()
        self._asked: list[TopicPartition] = []  # asked for by hand, oldest first
        self._running: asyncio.Future[CompactionReport] | None = None
        self._stopping = False
        metrics.gauge(m.COMPACTION_RUNNING, lambda: 1 if self._running is not None else 0)
        metrics.gauge(m.COMPACTION_KEYS, lambda: sum(last.keys for last in self._latest_passes()))
        metrics.gauge(m.COMPACTION_TOMBSTONES, lambda: sum(last.tombstones_kept for last in self._latest_passes()))

    def _latest_passes(self) -> Iterator[Progress]:
        """Each partition's latest pass that ran (not skipped)."""
        for state in self.partitions.values():
            if state.last is not None and state.last.skipped is None:
                yield state.last

    # -- what operators ask ------------------------------------------------------------------------------------

    def status(self, part: Partition) -> PartitionCompaction | None:
        """None for a partition whose topic is not compacted."""
        if part.config.log_cleanup_policy != "cleanup":
            return None
        return self.partitions.setdefault(part.tp, PartitionCompaction())

    def ask(self, topic: str, partitions: list[int] | None = None) -> dict[str, Any]:
        """A compaction asked for by hand: every partition of `topic` (or those named) led here gets a ticket.
        Raises KeyError for an unknown topic or partition, ValueError for a topic that is not compacted."""
        t = self.registry.topics.get(topic)
        if t is None:
            raise KeyError(f"no topic {topic}")
        chosen = range(len(t.partitions)) if partitions is None else partitions
        answer: dict[str, Any] = {"topic": topic, "partitions": [], "not_led": []}
        for p in chosen:
            part = self.registry.get(topic, p)
            if part is None:
                raise KeyError(f"topic {topic} has no partition {p}")
            state = self.status(part)
            if state is None:
                policy = part.config.log_cleanup_policy
                raise ValueError(f"topic {topic} is not compacted (log.cleanup.policy={policy})")
            if part.role is not Role.LEADER:
                leader = part.leader.endpoint if part.leader is not None else ""
                answer["not_led"].append({"partition": p, "leader": leader})
                continue
            state.requested += 1
            if part.tp not in self._asked:
                self._asked.append(part.tp)
                if state.state == "idle":
                    state.state = "queued"
            answer["partitions"].append({"partition": p, "ticket": state.requested})
        self._wake.set()
        return answer

    def view(self, topic: str | None = None) -> list[dict[str, Any]]:
        """`/v1/compaction`: every compacted partition (of `topic`), with its state and latest pass."""
        out = []
        for part in self.registry.all_partitions():
            if topic is not None and part.topic != topic:
                continue
            state = self.status(part)
            if state is not None:
                out.append({"topic": part.topic, "partition": part.partition, "role": part.role.value,
                            **state.view()})
        return out

    # -- the loop ----------------------------------------------------------------------------------------------

    def wake(self) -> None:
        """Evaluate the trigger now (instead of at the next interval)."""
        self._wake.set()

    async def run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            for part, force in await self._due():
                if self._stopping:
                    return
                await self.compact(part, force=force)
            await wait_for_event(self.clock, self._wake, self.interval_s)

    async def _due(self) -> list[tuple[Partition, bool]]:
        """The partitions to compact now, those asked for by hand first (forced)."""
        asked = [(part, True) for key in self._asked if (part := self.registry.get(*key)) is not None]
        self._asked.clear()
        chosen = {p.tp for p, _ in asked}
        # Only the compacted partitions (the registry keeps them as configs change): an idle broker's pass costs
        # what is compacted, not how many partitions exist.
        candidates = [p for p in self.registry.compacted() if p.role is Role.LEADER and p.tp not in chosen]
        # Reading the checkpoints touches the disk: off the event loop.
        due = await asyncio.to_thread(lambda: [p for p in candidates if _due_safely(p)
                                               or (p.lower_tier and p.tp not in self._remote_synced)])
        return asked + [(p, False) for p in due]

    async def compact(self, part: Partition, *, force: bool = False) -> CompactionReport | None:
        """One pass over `part` in a worker thread (None: not led here, or the broker is stopping)."""
        state = self.status(part)
        if state is None:
            return None
        asked = state.requested  # the tickets this pass answers
        if part.role is not Role.LEADER or self._stopping:
            self._answer(state, asked, Progress(self.now_s(), skipped="this broker does not lead the partition"
                                                if part.role is not Role.LEADER else "the broker is stopping"))
            return None
        state.state = "running"
        started_at = self.now_s()
        state.current = Progress(started_at)
        deadline = self.clock.monotonic() + self.deadline_s
        loop = asyncio.get_running_loop()

        def progress(report: CompactionReport) -> None:  # in the worker thread: hand the figures to the loop
            snapshot = Progress.of(report, started_at)
            snapshot.seconds = time.monotonic() - started
            loop.call_soon_threadsafe(setattr, state, "current", snapshot)

        def stop_check() -> str | None:
            if self._stopping:
                return "the broker is stopping"
            if part.role is not Role.LEADER:
                return "the partition is no longer led here"
            if self.clock.monotonic() >= deadline:
                return f"the pass's deadline ({self.deadline_s:.0f} s) passed"
            return None

        started = time.monotonic()
        running = self._running = asyncio.ensure_future(asyncio.to_thread(
            compact_partition, part.log, started_at, force=force, on_progress=progress, stop_check=stop_check))
        # Running until the thread ends, not until this caller does: a cancel cannot stop the thread, and `stop`
        # waits for it before the logs close.
        running.add_done_callback(self._ended)
        try:
            report = await asyncio.shield(running)
        except Exception as exc:  # a bug in the pass: counted, shown, and the other partitions go on
            log.exception("compaction of %s/%d failed", part.topic, part.partition)
            self.metrics.inc(m.COMPACTION_FAILURES)
            state.failures += 1
            self._answer(state, asked, Progress(started_at, time.monotonic() - started,
                                                error=f"{type(exc).__name__}: {exc}"))
            return None
        self._record(part, state, report, started_at)
        synced = part.tp in self._remote_synced
        if part.lower_tier and not report.needs_reopen and (report.passes or force or not synced):
            await self._compact_remote(part, state, deadline, force)
        self._answer(state, asked, Progress.of(report, started_at))
        return report

    def _ended(self, running: asyncio.Future[CompactionReport]) -> None:
        if self._running is running:
            self._running = None

    async def _compact_remote(self, part: Partition, state: PartitionCompaction, deadline: float,
                              force: bool) -> None:
        """The tier's copy follows the local pass, within what is left of the pass's deadline."""
        try:
            remote = await within(self.tier.compact_remote(part.tp, part.log, force),
                                  max(1.0, deadline - self.clock.monotonic()))
        except Exception as exc:  # the bucket or the catalog: counted, shown, and tried again with the next pass
            self.metrics.inc(m.REMOTE_COMPACTION_FAILURES)
            state.remote_failures += 1
            state.remote_last = f"failed: {type(exc).__name__}: {exc}"
            log.warning("remote compaction of %s failed: %s; tried again with the next pass", part.tp,
                        state.remote_last)
            return
        self._remote_synced.add(part.tp)
        if remote is not None:
            self._record_remote(state, remote)

    def _record_remote(self, state: PartitionCompaction, remote: RemoteCompactionReport) -> None:
        self.metrics.inc(m.REMOTE_COMPACTION_GROUPS, remote.groups)
        self.metrics.inc(m.REMOTE_COMPACTION_BYTES_BEFORE, remote.bytes_before)
        self.metrics.inc(m.REMOTE_COMPACTION_BYTES_AFTER, remote.bytes_after)
        state.remote_groups += remote.groups
        state.remote_bytes_before += remote.bytes_before
        state.remote_bytes_after += remote.bytes_after
        runs = f" and {remote.runs_before} block runs" if remote.runs_before else ""
        state.remote_last = (f"{remote.groups} groups, {remote.segments_before} remote segments{runs} -> "
                             f"{remote.segments_after}, {remote.bytes_before} -> {remote.bytes_after} bytes"
                             + (f" (stopped: {remote.stopped})" if remote.stopped else ""))

    def _answer(self, state: PartitionCompaction, asked: int, progress: Progress) -> None:
        state.last = progress
        state.current = None
        state.finished = max(state.finished, asked)
        state.state = "queued" if state.requested > state.finished else "idle"

    def _record(self, part: Partition, state: PartitionCompaction, report: CompactionReport,
                started_at: float) -> None:
        metrics = self.metrics
        if report.passes:
            state.passes += 1
            metrics.inc(m.COMPACTION_PASSES)
            metrics.observe(m.COMPACTION_PASS_SECONDS, report.seconds)
        metrics.inc(m.COMPACTION_GROUPS, report.groups)
        metrics.inc(m.COMPACTION_BYTES_BEFORE, report.bytes_before)
        metrics.inc(m.COMPACTION_BYTES_AFTER, report.bytes_after)
        metrics.inc(m.COMPACTION_TOMBSTONES_DROPPED, report.tombstones_dropped)
        state.bytes_before += report.bytes_before
        state.bytes_after += report.bytes_after
        if report.error is not None:
            state.failures += 1
            metrics.inc(m.COMPACTION_FAILURES)
            log.error("compaction of %s/%d: %s", part.topic, part.partition, report.error)
        if report.needs_reopen:
            log.error("compaction of %s/%d: restart the broker to finish an interrupted swap (no pass runs on the "
                      "partition until then)", part.topic, part.partition)
        elif report.passes:
            log.info("compaction of %s/%d: %d groups, %d -> %d bytes, %d keys, %d tombstones kept, in %.1f s%s",
                     part.topic, part.partition, report.groups, report.bytes_before, report.bytes_after,
                     report.keys, report.tombstones_kept, report.seconds,
                     f" (stopped: {report.stopped})" if report.stopped else "")

    async def stop(self, deadline: float) -> None:
        """No new pass starts; a running one ends at its next group, waited for until `deadline` (monotonic), so
        that the partition logs are not closed under it."""
        self._stopping = True
        self._wake.set()
        running = self._running
        if running is not None:
            await asyncio.wait([running], timeout=max(0.0, deadline - self.clock.monotonic()))


def _due_safely(part: Partition) -> bool:
    try:
        return compaction_due(part.log)
    except (OSError, ValueError) as exc:  # a closed log, an unreadable directory: not due, said in the log
        log.warning("compaction trigger of %s/%d not evaluated: %s", part.topic, part.partition, exc)
        return False
