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

import logging
import secrets
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiered import metrics as m
from tiered.catalog import cluster as catalog_cluster
from tiered.catalog import topics as catalog_topics
from tiered.clock import SYSTEM_CLOCK, Clock
from tiered.metrics import Metrics
from tiered.tier_interface import Leader, PartitionPlan, TierSink
from tiered.tiering.catalog_access import AsyncCatalog

log = logging.getLogger("tiered.cluster")

TICK_S = 0.5
LEASE_SAFETY = 0.8  # acknowledge only while the last renewal is younger than this share of the lease


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


def advertised_endpoint(configured: str, bound_host: str, bound_port: int) -> str:
    """`--advertise` as given (a host name is resolved to its IPv4 address), else the listener's own address; an
    any-address listener advertises this host's address."""
    text = configured.strip()
    if text:
        host, _, port = text.rpartition(":")
        return f"{socket.gethostbyname(host or '127.0.0.1')}:{int(port or bound_port)}"
    host = bound_host
    if host in ("", "0.0.0.0", "::"):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    return f"{host}:{bound_port}"


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
        self._renewed_at: float | None = None  # monotonic time of the last successful renewal
        self._evicted = False  # another process took this broker id: never lead again
        self.live: set[int] = set()
        self.addresses: dict[int, str] = {}

    # -- the lease --------------------------------------------------------------------------------------------

    async def join(self, endpoints: Endpoints) -> None:
        """Registers this process (SingleBrokerCatalog on SQLite while another broker is live)."""
        self.endpoints = endpoints
        started = self.clock.monotonic()
        await self.catalog.write(catalog_cluster.register, self.broker_id, self.incarnation, endpoints.advertised,
                                 endpoints.http, self.lease_ms)
        self._renewed_at = started

    def holds_lease(self) -> bool:
        if self._evicted or self._renewed_at is None:
            return False
        return self.clock.monotonic() - self._renewed_at < LEASE_SAFETY * self.lease_ms / 1000.0

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
        if kept:
            self._renewed_at = started
            return
        self._evicted = True
        log.error("broker id %d was taken over by another process: this one stops leading", self.broker_id)
        for topic, partition in list(self.leadership.leading()):
            self.leadership.lost(topic, partition)
            self.sink.follow(topic, partition, None, None)

    async def leave(self, deadline: float) -> None:
        """A graceful stop: hands every partition led here to the other live brokers, then ends the lease."""
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
        if self.holds_lease():
            self.live.add(self.broker_id)

    def _leader(self, broker_id: int | None) -> Leader | None:
        if broker_id is None or broker_id not in self.live or not self.addresses.get(broker_id):
            return None
        return Leader(broker_id, self.addresses[broker_id])

    async def tick(self) -> None:
        await self._refresh_members()
        known = {t.name: t for t in await self.catalog.read(catalog_topics.list_topics)}
        await self.sink.topics_known(known.values())
        assignments = await self.catalog.read(catalog_cluster.assignments)
        leading = self.leadership.leading()
        me = self.broker_id
        serving = self.holds_lease()
        load = Counter(a.leader_broker for a in assignments if a.leader_broker in self.live)
        claims: dict[str, dict[int, int]] = {}
        orphans: list[tuple[str, int]] = []
        epochs: dict[tuple[str, int], int] = {}
        handovers: dict[tuple[str, int], tuple[int, int]] = {}
        for a in assignments:
            key = (a.topic, a.partition)
            epochs[key] = a.leader_epoch
            if key in leading:
                if a.leader_epoch != leading[key]:
                    log.warning("%s/%d was claimed by broker %s (epoch %d): no longer led here", a.topic,
                                a.partition, a.leader_broker, a.leader_epoch)
                    self.leadership.lost(*key)
                    self.sink.follow(a.topic, a.partition, self._leader(a.leader_broker), a.hwmark_seq)
                elif a.handover_to is not None and a.handover_to != me and a.handover_to in self.live:
                    handovers[key] = (a.handover_to, a.leader_epoch)
                continue
            if serving and a.leader_broker == me:
                claims.setdefault(a.topic, {})[a.partition] = a.leader_epoch
            elif a.leader_broker is None or a.leader_broker not in self.live:
                orphans.append(key)
                self.sink.follow(a.topic, a.partition, None, a.hwmark_seq)
            else:
                self.sink.follow(a.topic, a.partition, self._leader(a.leader_broker), a.hwmark_seq)
        if serving:
            for key, broker in catalog_cluster.spread(orphans, self.live, load).items():
                if broker == me:
                    claims.setdefault(key[0], {})[key[1]] = epochs[key]
        for topic, expected in sorted(claims.items()):
            plans = await self.leadership.claim(topic, expected)
            if plans:
                lost = len(expected) - len(plans)
                log.info("leading %d partitions of %s%s", len(plans), topic,
                         f" ({lost} claimed by another broker first)" if lost else "")
                self.metrics.inc(m.TAKEOVERS, len(plans))
                await self.sink.lead(plans)
        if handovers:
            await self._hand_over(handovers, self.clock.monotonic() + 10.0)

    async def _hand_over(self, moves: dict[tuple[str, int], tuple[int, int]], deadline: float) -> None:
        """Clean handovers: produces to these partitions are redirected to their new leader from now on; what is
        held is committed; then each partition is assigned to its new leader, who claims it at its next tick."""
        for (topic, partition), (target, _epoch) in moves.items():
            self.sink.follow(topic, partition, self._leader(target), None)
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

    def status(self) -> dict:
        return {"broker_id": self.broker_id, "holds_lease": self.holds_lease(), "live": sorted(self.live),
                "advertised": self.endpoints.advertised if self.endpoints else ""}


AssignFn = Callable[[str, int], Awaitable[None]]
