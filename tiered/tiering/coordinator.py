"""Several brokers as one service, from one broker's side: its lease, and which partitions it leads.

Two loops, under the tier's supervisor:
- the lease: renewed every third of `cluster.lease_ms`, by the catalog's clock (tiered.catalog.cluster). A broker
  that has not renewed for 0.8 of the lease stops acknowledging at once (`holds_lease` is asked on every produce):
  by the time the others see its lease expire and take its partitions, it answers nothing more. Its late commits
  are refused by the epoch check anyway, so a paused or cut-off leader can never acknowledge a message the new
  leader does not have. A renewal refused because another process took the broker id over ends its leadership for
  good.
- the tick (every TICK_S): reads the members and the partitions' assignments, and
    claims (compare-and-set on the epoch) the partitions assigned to it, and its even share of the orphans, those
    whose leader is gone (the live brokers with the fewest leaderships first, computed alike by every broker);
    hands over the partitions `tiered cluster rebalance` asked it to give away (stop taking produces, commit what is
    held, assign the partition: the new leader claims it at its next tick);
    notices the partitions another broker claimed from it (fenced) and tells the server who leads the others, with
    their committed bounds, so any broker serves history and redirects the tail to the leader.
A broker that returns does not take partitions back: only orphans and explicit assignments are claimed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiered import metrics as m
from tiered.catalog import cluster as catalog_cluster
from tiered.catalog import topics as catalog_topics
from tiered.clock import SYSTEM_CLOCK, Clock
from tiered.metrics import Metrics
from tiered.tier_interface import Leader, NewLocalTopic, PartitionPlan, TierSink
from tiered.tiering.catalog_access import AsyncCatalog

log = logging.getLogger("tiered.cluster")

TICK_S = 0.25  # a handover's new leader claims at its next tick: this is most of a clean move's stall
LEASE_SAFETY = 0.8  # acknowledge only while the last renewal is younger than this share of the lease
CLAIM_POLL_S = 0.05  # how often a handover or a topic creation looks whether the new leaders have claimed
CLAIM_WAIT_S = 5.0  # and for how long at most


class Leadership(Protocol):
    """What the coordinator asks of the tier it serves."""

    def leading(self) -> dict[tuple[str, int], int]:
        """The partitions led here, with their epochs."""

    async def claim(self, topic: str, expected: dict[int, int]) -> list[PartitionPlan]:
        """Claims the partitions whose epoch is still the one given; plans the ones won."""

    async def give_up(self, keys: Sequence[tuple[str, int]], deadline: float) -> None:
        """Stops leading: the open block and the blocks in flight are committed (until `deadline`), then forgotten."""

    def lost(self, topic: str, partition: int) -> None:
        """Another broker claimed the partition: forget it without committing anything more."""


@dataclass(frozen=True, slots=True)
class Endpoints:
    advertised: str  # host:port, an IPv4 address: TANK's redirects carry addr4
    http: str


class Coordinator:
    def __init__(self, catalog: AsyncCatalog, sink: TierSink, leadership: Leadership, *, broker_id: int,
                 lease_ms: int, metrics: Metrics, clock: Clock = SYSTEM_CLOCK):
        self.catalog = catalog
        self.sink = sink
        self.leadership = leadership
        self.broker_id = broker_id
        self.lease_ms = lease_ms
        self.metrics = metrics
        self.clock = clock
        self.incarnation = secrets.token_hex(8)
        self.endpoints: Endpoints | None = None
        self._renewed_at: float | None = None  # monotonic time of the last renewal that kept the lease unbroken
        # The lease lapsed (a pause, a cut-off catalog) and was renewed since: whether another broker took a
        # partition meanwhile is only known after the next tick has read the epochs. Until then: no acks.
        self._lapsed = False
        self._evicted = False  # another process took this broker id: never lead again
        self.live: set[int] = set()
        self.addresses: dict[int, str] = {}
        # One tick at a time (the loop's, a topic creation's): a tick reads the epochs, then compares them with what
        # is led here; a claim by another tick in between would look like a partition lost.
        self._ticking = asyncio.Lock()

    # -- the lease --------------------------------------------------------------------------------------------

    async def join(self, endpoints: Endpoints) -> None:
        """Registers this process (SingleBrokerCatalog on SQLite while another broker is live)."""
        self.endpoints = endpoints
        started = self.clock.monotonic()
        await self.catalog.write(catalog_cluster.register, self.broker_id, self.incarnation, endpoints.advertised,
                                 endpoints.http, self.lease_ms)
        self._renewed_at = started

    def _lease_fresh(self, now: float) -> bool:
        return self._renewed_at is not None and now - self._renewed_at < LEASE_SAFETY * self.lease_ms / 1000.0

    def holds_lease(self) -> bool:
        """Whether this broker may acknowledge: its lease was renewed in time, and never lapsed unverified."""
        return not self._evicted and not self._lapsed and self._lease_fresh(self.clock.monotonic())

    async def renew_loop(self) -> None:
        while not self._evicted:
            await self.clock.sleep(self.lease_ms / 3000.0)
            await self.renew()

    async def renew(self) -> None:
        started = self.clock.monotonic()
        try:
            kept = await self.catalog.write(catalog_cluster.renew, self.broker_id, self.incarnation, self.lease_ms,
                                            deadline_s=self.lease_ms / 3000.0)
        except Exception:
            self.metrics.inc(m.LEASE_RENEWAL_FAILURES)
            raise
        self.metrics.observe(m.LEASE_RENEWAL_SECONDS, self.clock.monotonic() - started)
        if not kept:
            self._evicted = True
            log.error("broker id %d was taken over by another process: this one stops leading", self.broker_id)
            for topic, partition in list(self.leadership.leading()):
                self.leadership.lost(topic, partition)
                self.sink.follow(topic, partition, None, None)
            # It could only answer "no leader" from now on (the new leader has its id): it stops, and its clients
            # find the new process through the other brokers' redirects.
            self.sink.evicted(f"broker id {self.broker_id} was taken over by another process")
            return
        if not self._lease_fresh(started):
            self._lapsed = True
            log.warning("the lease was not renewed in time: no acknowledgements until the partitions are checked")
        self._renewed_at = started

    async def leave(self, deadline: float) -> None:
        """A graceful stop (the loops are stopped first): hands every partition led here to the other live
        brokers, then ends the lease."""
        if self._evicted or self.endpoints is None:
            return
        await self._refresh_members()
        others = self.live - {self.broker_id}
        leading = self.leadership.leading()
        if others and leading:
            load = Counter(a.leader_broker for a in await self.catalog.read(catalog_cluster.assignments)
                           if a.leader_broker in others)
            targets = catalog_cluster.spread(sorted(leading), others, load)
            await self._hand_over({key: (targets[key], leading[key]) for key in leading}, deadline)
        await self.catalog.write(catalog_cluster.leave, self.broker_id, self.incarnation)

    # -- the tick ---------------------------------------------------------------------------------------------

    async def tick_loop(self) -> None:
        while True:
            await self.tick()
            await self.clock.sleep(TICK_S)

    async def _refresh_members(self) -> None:
        members = await self.catalog.read(catalog_cluster.members)
        self.live = {mb.broker_id for mb in members if mb.live}
        self.addresses = {mb.broker_id: mb.advertised for mb in members}
        if self._lease_fresh(self.clock.monotonic()) and not self._evicted:
            self.live.add(self.broker_id)

    def _leader(self, broker_id: int | None) -> Leader | None:
        """Where to redirect to: a live broker other than this one (this one, not leading yet: no leader yet)."""
        if broker_id is None or broker_id == self.broker_id or broker_id not in self.live \
                or not self.addresses.get(broker_id):
            return None
        return Leader(broker_id, self.addresses[broker_id])

    async def tick(self) -> None:
        """One look at the members and the assignments: claim, hand over, follow (module docstring)."""
        async with self._ticking:
            await self._tick()

    async def _tick(self) -> None:
        started = self.clock.monotonic()
        await self._refresh_members()
        topics = await self.catalog.read(catalog_topics.list_topics)
        await self.sink.topics_known([NewLocalTopic(t.name, t.partitions, t.config_text) for t in topics])
        assignments = await self.catalog.read(catalog_cluster.assignments)
        leading = self.leadership.leading()
        me = self.broker_id
        serving = not self._evicted and self._lease_fresh(self.clock.monotonic())
        load = Counter(a.leader_broker for a in assignments if a.leader_broker in self.live)
        claims: dict[str, dict[int, int]] = {}
        assigned_here = False  # a claim of a partition whose row names this broker id
        orphans: list[tuple[str, int]] = []
        epochs: dict[tuple[str, int], int] = {}
        handovers: dict[tuple[str, int], tuple[int, int]] = {}
        for a in assignments:
            key = (a.topic, a.partition)
            epochs[key] = a.leader_epoch
            if key in leading:
                if a.leader_epoch > leading[key]:
                    log.warning("%s/%d was claimed by broker %s (epoch %d): no longer led here", a.topic,
                                a.partition, a.leader_broker, a.leader_epoch)
                    self.leadership.lost(*key)
                    self.sink.follow(a.topic, a.partition, self._leader(a.leader_broker), a.hwmark_seq,
                                     a.first_available_seq)
                elif a.handover_to is not None and a.handover_to != me and a.handover_to in self.live:
                    handovers[key] = (a.handover_to, a.leader_epoch)
                continue
            if a.leader_broker == me or a.leader_broker is None or a.leader_broker not in self.live:
                # Assigned here but not claimed yet, or orphaned: nobody leads it this moment (0xfd, not a
                # redirect that could bounce between two brokers that each think the other leads).
                self.sink.follow(a.topic, a.partition, None, a.hwmark_seq, a.first_available_seq)
                if a.leader_broker == me:
                    if serving:
                        claims.setdefault(a.topic, {})[a.partition] = a.leader_epoch
                        assigned_here = True
                else:
                    orphans.append(key)
            else:
                self.sink.follow(a.topic, a.partition, self._leader(a.leader_broker), a.hwmark_seq,
                                 a.first_available_seq)
        if serving:
            for key, broker in catalog_cluster.spread(orphans, self.live, load).items():
                if broker == me:
                    claims.setdefault(key[0], {})[key[1]] = epochs[key]
        if assigned_here:
            # A row naming this broker id that this process does not lead is either assigned here and not claimed
            # yet, or was claimed by another process that took this broker id over (a new volume, a rescheduled
            # pod): the lease says which. Taking it back would fence the process that now owns the id.
            await self.renew()
            if self._evicted:
                return
        for topic, expected in sorted(claims.items()):
            await self._claim(topic, expected)
        if self._lapsed and self._renewed_at is not None and self._renewed_at <= started:
            self._lapsed = False  # the epochs read after the renewal showed what is still led here
            log.info("lease renewed and partitions checked: acknowledging again")
        if handovers:
            await self._hand_over(handovers, self.clock.monotonic() + CLAIM_WAIT_S)

    async def _claim(self, topic: str, expected: Mapping[int, int]) -> None:
        plans = await self.leadership.claim(topic, dict(expected))
        if not plans:
            return
        lost = len(expected) - len(plans)
        log.info("leading %d partitions of %s%s", len(plans), topic,
                 f" ({lost} claimed by another broker first)" if lost else "")
        self.metrics.inc(m.TAKEOVERS, len(plans))
        await self.sink.lead(plans)

    async def _hand_over(self, moves: dict[tuple[str, int], tuple[int, int]], deadline: float) -> None:
        """Clean handovers: produces to these partitions are answered "no leader" (retry) from now on; what is held
        is committed; each partition is assigned to its new leader, who claims it at its next tick; once it has,
        clients are redirected there."""
        for topic, partition in moves:
            self.sink.follow(topic, partition, None, None)
        await self.leadership.give_up(sorted(moves), deadline)
        by_topic: dict[str, dict[int, tuple[int, int]]] = {}
        for (topic, partition), move in moves.items():
            by_topic.setdefault(topic, {})[partition] = move
        for topic, moving in sorted(by_topic.items()):
            done = await self.catalog.write(
                catalog_cluster.assign, topic, {p: target for p, (target, _) in moving.items()},
                expected={p: (self.broker_id, epoch) for p, (_, epoch) in moving.items()})
            self.metrics.inc(m.HANDOVERS, len(done))
            log.info("handed %s partitions %s over", topic, {p: moving[p][0] for p in done})
            await self.await_claims(topic, {p: moving[p][1] for p in done}, deadline)

    async def await_claims(self, topic: str, epochs: Mapping[int, int], deadline: float) -> None:
        """Waits (polling, until `deadline` at most) until each partition's epoch has moved past the one given,
        following each one to its new leader as soon as it has: a handover or a creation then redirects clients
        straight to where they will be served."""
        waiting = dict(epochs)
        while waiting:
            assignments = await self.catalog.read(catalog_cluster.assignments, topic)
            leading = self.leadership.leading()  # once per look, not per partition: it is every partition led here
            for a in assignments:
                if a.partition in waiting and a.leader_epoch > waiting[a.partition]:
                    del waiting[a.partition]
                    if (a.topic, a.partition) not in leading:
                        self.sink.follow(a.topic, a.partition, self._leader(a.leader_broker), a.hwmark_seq,
                                         a.first_available_seq)
            if not waiting or self.clock.monotonic() >= deadline:
                break
            await self.clock.sleep(CLAIM_POLL_S)

    async def place_new_topic(self, partitions: int) -> dict[int, int]:
        """Which live broker leads each partition of a new topic: the fewest leaderships first."""
        await self._refresh_members()
        assignments = await self.catalog.read(catalog_cluster.assignments)
        load = Counter(a.leader_broker for a in assignments if a.leader_broker in self.live)
        placed = catalog_cluster.spread([("", p) for p in range(partitions)], self.live, load)
        return {p: broker for (_, p), broker in placed.items()}

    def status(self) -> dict:
        return {"broker_id": self.broker_id, "holds_lease": self.holds_lease(), "live": sorted(self.live),
                "advertised": self.endpoints.advertised if self.endpoints else ""}
