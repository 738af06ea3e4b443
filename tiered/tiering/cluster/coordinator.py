"""Several brokers as one service, from one broker's side: its lease, and which partitions it leads.

Two loops, under the tier's supervisor:
- the lease: renewed every third of `cluster.lease_ms`, by the catalog's clock (tiered.catalog.cluster). A broker
  that has not renewed for 0.8 of the lease stops acknowledging at once (`ack_deadline`, compared with every produce
  request's clock read): by the time the others see its lease expire and take its partitions, it answers nothing
  more. Its late commits are refused by the epoch check anyway, so a paused or cut-off leader can never acknowledge
  a message the new leader does not have. A renewal refused because another process took the broker id over ends
  its leadership for good.
- the tick (every TICK_S; FOLLOW_S after a look that found changes, LED_S after one whose claims were led): reads
  the members and the change counter, and when the counter moved, only the partitions changed since the last look
  (their change versions: a look costs what changed, not what exists; every assignment is read at start and every
  FULL_LOOK_S), and
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
import functools
import logging
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiered import metrics as m
from tiered.catalog import cluster as catalog_cluster
from tiered.catalog.topics import TopicRow
from tiered.clock import SYSTEM_CLOCK, Clock, wait_for_event
from tiered.metrics import Metrics
from tiered.tier_interface import AckDeadline, Leader, NewLocalTopic, PartitionPlan, TierSink
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.cluster.cluster_decision import (
    CLAIM_BATCH, Assignments, ClusterView, Decision, Follow, Pace, ack_deadline, affected, claim_batches,
    decide_changes, handover_queues, leader_of, lease_fresh, membership, next_look_in, ready_targets, spread,
)
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.cluster")

TICK_S = 0.25  # how often an idle broker looks at the catalog (one small statement) when no notices tell it of changes
IDLE_TICK_S = 1.0  # and when they do (tiered.tiering.cluster.notices): a look for what no notice names (a lost one,
# a change versioned by the row trigger: `tiered cluster rebalance`, retention's first available seq)
EXPIRY_MARGIN_S = 0.05  # a look comes this long after a live member's lease expires (cluster_decision.next_look_in)
FOLLOW_S = 0.05  # how soon it looks again after a look that found changes: a handover's or a failover's moves come
# in bursts, and a new leader that sees them at once claims at once
LED_S = 0.01  # and after a look whose claims were led: a stopping broker gives up its next chunk once they land
BETWEEN_S = 0.5  # between claim batches, at most this often a look at what changed (each costs the claims a little)
# Every partition's assignment read again, the safety net for a change no version names. Every writer's change is
# versioned (by its transaction or by the row triggers, whoever writes), and a counter that goes back (an emptied
# or restored catalog) brings a full look at once, so what is left is a row whose version was set back by hand: an
# hour is soon enough for that. It costs 0.5-1 s of CPU at 100,000 partitions (reading, then deciding over every
# row): every 300 s, as it was, that was 0.002-0.003 cores of an idle broker, and a 30 s measurement that met one
# read 0.02-0.03 cores more.
FULL_LOOK_S = 3600.0
CLAIM_POLL_S = 0.05  # how often a handover or a topic creation looks whether the new leaders have claimed
CLAIM_WAIT_S = 5.0  # and for how long at most
HANDOVER_CHUNK = 512  # partitions a stopping broker hands to one new leader at a time (cluster_decision)
HANDOVER_AHEAD = 1  # chunks given up to one new leader whose claims have not all landed, at most (ready_targets)
PACE_POLL_S = 0.01  # how often a stopping broker looks whether its chunks were claimed
PACE_WAIT_S = 2.0  # a chunk not claimed in this time is waited for no longer (a new leader gone or stuck)
PACE_RESERVE_S = 5.0  # of the shutdown's budget, kept for what follows the handover: past it, no more pacing
PACE = Pace(LED_S, FOLLOW_S, TICK_S, IDLE_TICK_S, EXPIRY_MARGIN_S)


class Leadership(Protocol):
    """What the coordinator asks of the tier it serves."""

    def leading(self) -> dict[TopicPartition, int]:
        """The partitions led here, with their epochs."""

    async def claim(self, topic: str, expected: dict[int, int]) -> list[PartitionPlan]:
        """Claims the partitions whose epoch is still the one given; plans the ones won."""

    async def give_up(self, keys: Sequence[TopicPartition], deadline: float) -> None:
        """Stops leading: the open block and the blocks in flight are committed (until `deadline`), then forgotten."""

    def lost(self, tp: TopicPartition) -> None:
        """Another broker claimed the partition: forget it without committing anything more."""


@dataclass(frozen=True, slots=True)
class Endpoints:
    advertised: str  # host:port, an IPv4 address: TANK's redirects carry addr4
    http: str
    plain: str = ""  # host:port for plaintext clients ("": none besides `advertised`; tiered.server.leaders)


class Coordinator:
    def __init__(self, catalog: AsyncCatalog, sink: TierSink, leadership: Leadership, *, broker_id: int,
                 lease_ms: int, metrics: Metrics, clock: Clock = SYSTEM_CLOCK, claim_batch: int = CLAIM_BATCH,
                 handover_chunk: int = HANDOVER_CHUNK, handover_ahead: int = HANDOVER_AHEAD):
        self.catalog = catalog
        self.sink = sink
        self.leadership = leadership
        self.broker_id = broker_id
        self.lease_ms = lease_ms
        self.metrics = metrics
        self.clock = clock
        self.claim_batch = claim_batch
        self.handover_chunk = handover_chunk
        self.handover_ahead = handover_ahead
        self.incarnation = secrets.token_hex(8)
        self.endpoints: Endpoints | None = None
        self._renewed_at: float | None = None  # monotonic time of the last renewal that kept the lease unbroken
        # The lease lapsed (a pause, a cut-off catalog) and was renewed since: whether another broker took a
        # partition meanwhile is only known after the next tick has read the epochs. Until then: no acks.
        self._lapsed = False
        self._evicted = False  # another process took this broker id: never lead again
        # Until when this broker may acknowledge (the produce path reads it per request): what the three fields
        # above say, made current by `_lease_changed` after each of their changes, its one writer.
        self.ack_deadline = AckDeadline()
        self.live: set[int] = set()
        self.addresses: dict[int, str] = {}
        self.plain_addresses: dict[int, str] = {}  # broker id -> where plaintext clients reach it ("": none known)
        # What the last look was decided from: the change counter, the membership (live brokers, their addresses)
        # and whether this one could claim. While none moved, nothing a decision depends on did, and a tick reads
        # one small statement (tiered.catalog.cluster.look); when the counter moved, it reads the partitions changed
        # since `_version` only (tiered.catalog.cluster.changed_since) into `_assignments`.
        self._version: int | None = None  # None: the next look reads every assignment
        self._members: dict[int, tuple[bool, str, str]] = {}
        self._serving = False
        self._again = False  # the last decision claimed or handed over: decide again at the next tick
        self._led = False  # the last tick led partitions it claimed (the next look comes at LED_S)
        self._looked: int | None = None  # the counter up to which `_assignments` holds every change (in a tick)
        self._assignments = Assignments()  # every partition's assignment as last read (one owner: the tick)
        self._full_look_at = float("-inf")  # monotonic time of the next full look (the safety net)
        # What the server was last told of each partition followed (one owner: every follow goes through
        # `_follow`): a full look re-tells only what changed. A partition led here is not in it.
        self._followed: dict[TopicPartition, Follow] = {}
        self._bounds_asked: dict[TopicPartition, float] = {}  # monotonic time a read last asked for a follower's
        # The catalog's change notices (tiered.tiering.cluster.notices): while they come (`_told`), an idle broker
        # looks every IDLE_TICK_S, or when one wakes it (`_wake`), or just after a live member's lease expires
        # (`_expiry_at`: monotonic times, from the last look's members).
        self._told = False
        self._wake = asyncio.Event()
        self._expiry_at: list[float] = []
        # One tick at a time (the loop's, a topic creation's): a tick reads the epochs, then compares them with what
        # is led here; a claim by another tick in between would look like a partition lost.
        self._ticking = asyncio.Lock()

    # -- the lease --------------------------------------------------------------------------------------------

    async def join(self, endpoints: Endpoints) -> None:
        """Registers this process (SingleBrokerCatalog on SQLite while another broker is live)."""
        self.endpoints = endpoints
        started = self.clock.monotonic()
        await self.catalog.write(catalog_cluster.register, self.broker_id, self.incarnation, endpoints.advertised,
                                 endpoints.http, self.lease_ms, advertised_plain=endpoints.plain)
        self._renewed_at = started
        self._lease_changed()

    def _lease_fresh(self, now: float) -> bool:
        return lease_fresh(self._renewed_at, self.lease_ms, now)

    def _lease_changed(self) -> None:
        """The ack deadline made current after a change of the renewal time, the lapse or the eviction."""
        self.ack_deadline.until = ack_deadline(self._renewed_at, self.lease_ms, lapsed=self._lapsed,
                                               evicted=self._evicted)

    def holds_lease(self) -> bool:
        """Whether this broker may acknowledge now: its lease was renewed in time, and never lapsed unverified."""
        return self.ack_deadline.allows(self.clock.monotonic())

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
            self._lease_changed()
            log.error("broker id %d was taken over by another process: this one stops leading", self.broker_id)
            for tp in list(self.leadership.leading()):
                self.leadership.lost(tp)
                self._no_leader(tp)
            # It could only answer "no leader" from now on (the new leader has its id): it stops, and its clients
            # find the new process through the other brokers' redirects.
            self.sink.evicted(f"broker id {self.broker_id} was taken over by another process")
            return
        if not self._lease_fresh(started):
            self._lapsed = True
            log.warning("the lease was not renewed in time: no acknowledgements until the partitions are checked")
            self._wake.set()  # the next look checks them: at once, not at the next idle tick
        self._renewed_at = started
        self._lease_changed()

    async def leave(self, deadline: float) -> None:
        """A graceful stop (the loops are stopped first): hands every partition led here to the other live
        brokers, then ends the lease."""
        if self._evicted or self.endpoints is None:
            return
        await self._refresh_members()
        others = self.live - {self.broker_id}
        leading = self.leadership.leading()
        if others and leading:
            load = {b: n for b, n in (await self.catalog.read(catalog_cluster.leaderships)).items() if b in others}
            targets = spread(sorted(leading), others, load)
            await self._hand_over_paced(
                handover_queues({key: (targets[key], leading[key]) for key in leading}, self.handover_chunk), deadline)
        if not self._evicted:
            # No acknowledgement from here on: the lease is ended, and the others may take what is still led here.
            self._renewed_at = None
            self._lease_changed()
            await self.catalog.write(catalog_cluster.leave, self.broker_id, self.incarnation)

    async def _hand_over_paced(self, queues: Mapping[int, Sequence[dict[TopicPartition, tuple[int, int]]]],
                               deadline: float) -> None:
        """Chunk after chunk per new leader (`queues`, cluster_decision.handover_queues), each new leader's next
        given up and assigned only while fewer than `handover_ahead` chunks given up to it wait for their claims
        (`ready_targets`), which the claims' rows tell (polled every PACE_POLL_S: one small statement, and the rows
        changed since the last poll when the counter moved); the chunks of the new leaders ready at once are given up
        and assigned together. A partition stops taking produce only when its own chunk is given up, and is taken by
        its new leader as soon as that one has claimed its chunk before: its gap is one chunk's handover and claims,
        not the queue of every chunk given up faster than the new leaders claim (which at 34,000 partitions was
        seconds), nor the pace of the slower new leader. The lease is renewed while this lasts (its loop is
        stopped): a handover that outlasted 0.8 of a lease stopped every partition not handed over yet from
        acknowledging."""
        waiting: dict[TopicPartition, int] = {}  # assigned, not claimed yet: the epoch the claim must move past
        chunk_of: dict[TopicPartition, tuple[int, int]] = {}  # -> (new leader, its chunk)
        unclaimed: dict[tuple[int, int], tuple[float, int]] = {}  # (new leader, chunk) -> (when given up, not claimed)
        given = dict.fromkeys(queues, 0)  # chunks given up so far, per new leader
        seen: int | None = None

        async def poll() -> None:
            nonlocal seen
            seen, claimed = await self._poll_claims(waiting, seen)
            for key in claimed:
                chunk = chunk_of.pop(key)
                at, left = unclaimed[chunk]
                if left > 1:
                    unclaimed[chunk] = (at, left - 1)
                else:
                    del unclaimed[chunk]
            await self._renew_if_due()

        pace_until = deadline - PACE_RESERVE_S  # then the rest at once: each still handed over, not left to a lease
        while not self._evicted:
            pending = [t for t, chunks in queues.items() if given[t] < len(chunks)]
            if not pending:
                break
            now = self.clock.monotonic()
            ready = pending if now >= pace_until else ready_targets(
                {t: [at for (owner, _), (at, _) in unclaimed.items() if owner == t] for t in pending}, pending, now,
                self.handover_ahead, PACE_WAIT_S)
            if not ready:
                await self.clock.sleep(PACE_POLL_S)
                await poll()
                continue
            moves: dict[TopicPartition, tuple[int, int]] = {}
            for t in ready:
                moves.update(queues[t][given[t]])
            moved = await self._hand_over(moves, deadline)
            at = self.clock.monotonic()
            for t in ready:
                chunk = (t, given[t])
                given[t] += 1
                mine = [key for key in queues[t][chunk[1]] if key in moved]
                if mine:
                    chunk_of.update(dict.fromkeys(mine, chunk))
                    unclaimed[chunk] = (at, len(mine))
            waiting.update(moved)
            await poll()
        while waiting and not self._evicted and self.clock.monotonic() < deadline:
            await self.clock.sleep(PACE_POLL_S)
            await poll()

    async def _renew_if_due(self) -> None:
        """Renews the lease when its loop would have (while that loop is stopped: a handover at shutdown). A renewal
        that fails is tried again at the next call; a broker id taken over ends the handover (`_evicted`)."""
        if self._renewed_at is not None and self.clock.monotonic() - self._renewed_at < self.lease_ms / 3000.0:
            return
        try:
            await self.renew()
        except Exception as exc:
            log.warning("lease renewal during the handover failed (%s): trying again", exc)

    # -- the tick ---------------------------------------------------------------------------------------------

    def noticed(self) -> None:
        """A change notice came (tiered.tiering.cluster.notices): look now."""
        self._wake.set()

    def listening(self, live: bool) -> None:
        """Whether change notices come: they decide how often an idle broker looks (cluster_decision.next_look_in)."""
        self._told = live

    async def tick_loop(self) -> None:
        while True:
            self._wake.clear()  # a notice from here on (during the look too) brings the next look at once
            moved = await self.tick()
            now = self.clock.monotonic()
            delay = next_look_in(PACE, led=self._led, moved=moved, told=self._told,
                                 expiries=[at - now for at in self._expiry_at])
            if self._told:
                await wait_for_event(self.clock, self._wake, delay)
            else:
                await self.clock.sleep(delay)

    async def _refresh_members(self) -> None:
        self._take_members(await self.catalog.read(catalog_cluster.members))

    def _take_members(self, members: Sequence[catalog_cluster.Member]) -> None:
        self.live = {mb.broker_id for mb in members if mb.live}
        self.addresses = {mb.broker_id: mb.advertised for mb in members}
        self.plain_addresses = {mb.broker_id: mb.advertised_plain for mb in members}
        if self._lease_fresh(self.clock.monotonic()) and not self._evicted:
            self.live.add(self.broker_id)

    def _leader(self, broker_id: int | None) -> Leader | None:
        return leader_of(self.view(()), broker_id)

    async def tick(self) -> bool:
        """One look at the members and what changed: claim, hand over, follow (module docstring). True if anything
        had changed."""
        async with self._ticking:
            return await self._tick()

    def view(self, assignments) -> ClusterView:
        return ClusterView(self.broker_id, frozenset(self.live), dict(self.addresses), assignments, self.lease_ms,
                           self._renewed_at, self._evicted, dict(self.plain_addresses))

    async def _tick(self) -> bool:
        """One look; True if it found anything changed (the next look then comes sooner: changes come in bursts)."""
        started = self.clock.monotonic()
        self._led = False
        look = await self.catalog.read(catalog_cluster.look)
        self._expiry_at = [started + s for s in look.expiries(self.broker_id)]
        self._take_members(look.members)
        view = self.view(())
        members = membership(view)
        serving = not self._evicted and self._lease_fresh(self.clock.monotonic())
        version = self._version
        full = (version is None or look.changes is None or look.changes < version
                or started >= self._full_look_at)
        if not full and look.changes == version and members == self._members and serving == self._serving \
                and not self._again:
            # No partition, epoch, assignment, handover, topic or member moved since the last look (every such
            # change takes a version above the counter seen): its decision stands. That is also what a lapsed lease
            # needs to see to acknowledge again: no epoch moved while it was lapsed.
            self._checked(started)
            return False
        self._version = None  # until this look is carried out (a failure in between looks at everything next time)
        self._looked = look.changes  # what the assignments kept hold up to (raised by a look between claim batches)
        changed: set[TopicPartition] = set()
        # The topics and the assignments from one snapshot, and every topic made known (created on the disk) before
        # anything is decided: each partition a decision names is one the server has. Read apart, a topic created
        # between the two reads had assignments but no local partitions yet; a follow of one was dropped by the
        # server yet remembered in `_followed` as told, so it was never told again and answered "no leader" for good.
        if full:
            # At start, after the counter went back (an emptied catalog), and every FULL_LOOK_S as a safety net: a
            # change no version names (a writer outside tiered.catalog, a restore) is found within that time.
            topics, rows = await self.catalog.read(catalog_cluster.full_look)
        else:
            # The counter was read first (look), so every change of a version up to it is among these rows.
            topics, rows = await self.catalog.read(catalog_cluster.changed_look, version)
        changed |= await self._take_topics(topics)
        if full:
            changed |= await asyncio.to_thread(self._assignments.replace, rows)
            keys: Collection[TopicPartition] = list(self._assignments.rows)
            self._full_look_at = started + FULL_LOOK_S
        else:
            changed |= self._assignments.apply(rows)
            keys = affected(self._assignments, changed, self._members, members)
        leading = self.leadership.leading()
        if full:
            for key in leading:
                self._followed.pop(key, None)
        decide_ = functools.partial(decide_changes, self.view(()), self._assignments, keys, leading,
                                    self.clock.monotonic())
        # Pure, and linear in what changed: on a worker thread when that is much (a full look, a failover), so that
        # the event loop (produces and their acks) is not held up while it is decided.
        decision = await asyncio.to_thread(decide_) if full or len(keys) > 2_000 else decide_()
        await self._apply(decision, started)
        self._version, self._members, self._serving = look.changes, members, serving
        # A claim or a handover changes the catalog, and so the counter: the next look reads it. One that changed
        # nothing (a topic this broker cannot serve) is decided again at the next tick.
        self._again = bool(decision.claims or decision.handovers or decision.renew_first)
        return bool(changed) or self._again

    def _checked(self, started: float) -> None:
        """The epochs were read (or known unchanged) after the look that began at `started`."""
        if self._lapsed and self._renewed_at is not None and self._renewed_at <= started:
            self._lapsed = False  # the epochs read after the renewal showed what is still led here
            self._lease_changed()
            log.info("lease renewed and partitions checked: acknowledging again")

    def _follow(self, f: Follow) -> None:
        """Tells the server, unless it was told exactly this last time."""
        if self._followed.get(f.key) != f:
            self._followed[f.key] = f
            self.sink.follow(f.key, f.leader, f.committed, f.first_available)

    def _no_leader(self, tp: TopicPartition) -> None:
        self._followed.pop(tp, None)
        self.sink.follow(tp, None, None)

    async def refresh_follower(self, tp: TopicPartition) -> bool:
        """A read on a follower went past the bounds it knows: the partition's row is read now (at most once per
        tick per partition), and the server told its leader and committed bounds. True if it was told (the read
        looks again). This is how a follower's high-water mark stays current without every broker polling every
        partition's bounds: the change counter does not move on commits."""
        now = self.clock.monotonic()
        if now - self._bounds_asked.get(tp, float("-inf")) < TICK_S:
            return False
        self._bounds_asked[tp] = now
        a = await self.catalog.read(catalog_cluster.assignment, tp.topic, tp.partition)
        if a is None or tp in self.leadership.leading():
            return False
        leader = self._leader(a.leader_broker) if a.leader_broker in self.live else None
        self._follow(Follow(tp, leader, a.hwmark_seq, a.first_available_seq))
        return True

    async def _apply(self, decision: Decision, started: float) -> None:
        """Carries one decision out; `started`: when the look it was decided from began."""
        for f in decision.lost:
            log.warning("%s was claimed by broker %s: no longer led here", f.key,
                        f.leader.broker_id if f.leader else "(not live)")
            self.leadership.lost(f.key)
            self._follow(f)
        for f in decision.follows:
            self._follow(f)
        if decision.renew_first:
            # A row naming this broker id that this process does not lead is either assigned here and not claimed
            # yet, or was claimed by another process that took this broker id over (a new volume, a rescheduled
            # pod): the lease says which. Taking it back would fence the process that now owns the id.
            await self.renew()
            if self._evicted:
                return
        # The look read every epoch after `started`, and the losses are applied: what is led here is checked now,
        # before the claims, so that a lapsed lease acknowledges again without waiting for a long failover's claims.
        self._checked(started)
        await self._claim_all(claim_batches(decision.claims, self.claim_batch))
        if decision.handovers:
            deadline = self.clock.monotonic() + CLAIM_WAIT_S
            await self.await_claims(await self._hand_over(dict(decision.handovers), deadline), deadline)

    async def _claim_all(self, batches: Sequence[tuple[str, Mapping[int, int]]]) -> None:
        """One bounded batch per claim transaction, each taking produce as soon as it is claimed; a renewal that falls
        due meanwhile runs between batches (the renewal loop), not after all of them. Pipelined: the next batch is
        claimed in the catalog (on its write thread) while this one is carried out on the disk and led, so that a
        failover's claims cost the larger of the two, not their sum. A batch's claim is always awaited, even when
        leading the one before failed: a claim the catalog made is led or, if not, found at the next look
        (assigned here, not led: claimed again)."""
        claiming: asyncio.Task | None = None
        pending: tuple[str, Mapping[int, int], list[PartitionPlan]] | None = None
        try:
            looked = self.clock.monotonic()
            for topic, expected in batches:
                claiming = asyncio.ensure_future(self.leadership.claim(topic, dict(expected)))
                await asyncio.sleep(0)  # the claim reads the disk's epochs and goes to the write thread first
                if pending is not None:
                    await self._lead(*pending)
                if self.clock.monotonic() - looked >= BETWEEN_S:
                    looked = self.clock.monotonic()
                    await self._follow_changes()
                pending = (topic, expected, await claiming)
                claiming = None
            if pending is not None:
                await self._lead(*pending)
        finally:
            if claiming is not None:
                await asyncio.gather(claiming, return_exceptions=True)

    async def _take_topics(self, topics: Sequence[TopicRow]) -> set[TopicPartition]:
        """The catalog's topics, as read with the assignments: made known to the server (created on its disk) before
        anything is decided about their partitions; the partitions of topics gone are forgotten (returned)."""
        await self.sink.topics_known([NewLocalTopic(t.name, t.partitions, t.config_text) for t in topics])
        return self._assignments.drop_topics(t.name for t in topics)

    async def _follow_changes(self) -> None:
        """Between a long decision's claim batches (a failover's 17,000 orphans): the partitions changed since the
        tick's look (the other brokers' claims, mostly) are read and followed, and those lost are dropped, so that
        clients asking here are redirected to where the others already lead instead of waiting for the next tick.
        Claims and handovers are left to the next tick."""
        look = await self.catalog.read(catalog_cluster.look)
        since = self._looked
        if look.changes is None or since is None or look.changes <= since:
            return
        topics, rows = await self.catalog.read(catalog_cluster.changed_look, since)  # one snapshot, as in tick
        changed = await self._take_topics(topics)
        self._looked = look.changes
        changed |= self._assignments.apply(rows)
        decision = decide_changes(self.view(()), self._assignments, changed, self.leadership.leading(),
                                  self.clock.monotonic(), claims_too=False)
        for f in decision.lost:
            self.leadership.lost(f.key)
            self._follow(f)
        for f in decision.follows:
            self._follow(f)

    async def _lead(self, topic: str, expected: Mapping[int, int], plans: list[PartitionPlan]) -> None:
        if not plans:
            return
        lost = len(expected) - len(plans)
        log.info("leading %d partitions of %s%s", len(plans), topic,
                 f" ({lost} claimed by another broker first)" if lost else "")
        self.metrics.inc(m.TAKEOVERS, len(plans))
        self._led = True
        for partition in expected:  # led here now: what the server was told of it as a follower no longer holds
            self._followed.pop(TopicPartition(topic, partition), None)
        await self.sink.lead(plans)

    async def _hand_over(self, moves: dict[TopicPartition, tuple[int, int]],
                         deadline: float) -> dict[TopicPartition, int]:
        """Clean handovers: produces to these partitions are answered "no leader" (retry) from now on; what is held
        is committed; each partition is assigned to its new leader, who claims it as soon as its look sees it. Returns
        the partitions assigned, with the epoch their claims must move past (`await_claims`)."""
        for tp in moves:
            self._no_leader(tp)
        await self.leadership.give_up(sorted(moves), deadline)
        # Every move in one transaction: the new leaders see them all at their next look, and a partition of the last
        # topic waits for its own new leader, not for the topics before it.
        done = await self.catalog.write(
            catalog_cluster.assign_moves, {key: target for key, (target, _) in moves.items()},
            expected={key: (self.broker_id, epoch) for key, (_, epoch) in moves.items()})
        self.metrics.inc(m.HANDOVERS, len(done))
        log.info("handed %d partitions over", len(done))
        return {TopicPartition(*key): moves[key][1] for key in done}

    async def await_claims(self, epochs: Mapping[TopicPartition, int], deadline: float,
                           seen: int | None = None) -> bool:
        """Waits (polling, until `deadline` at most) until each partition's epoch has moved past the one given,
        following each one to its new leader as soon as it has: a handover or a creation then redirects clients
        straight to where they will be served. True if every one was claimed in time (`_poll_claims`)."""
        waiting = dict(epochs)
        while waiting:
            seen, _ = await self._poll_claims(waiting, seen)
            if not waiting or self.clock.monotonic() >= deadline:
                break
            await self.clock.sleep(CLAIM_POLL_S)
        return not waiting

    async def _poll_claims(self, waiting: dict[TopicPartition, int],
                           seen: int | None) -> tuple[int | None, list[TopicPartition]]:
        """One look at the claims waited for: reads the change counter (one small statement); when it moved since
        `seen`, the partitions changed since then (tiered.catalog.cluster.changed_since: what the new leaders
        claimed meanwhile, so a poll costs what changed, not what is still waited for); the first poll (or one after
        the counter went back) reads the partitions waited for. Those claimed leave `waiting` and are followed to
        their new leader. Returns the counter read and the partitions claimed."""
        look = await self.catalog.read(catalog_cluster.look)
        if look.changes is None or seen is None or look.changes < seen:
            moved = await self.catalog.read(catalog_cluster.claimed_since, waiting)
        elif look.changes != seen:
            moved = [a for a in await self.catalog.read(catalog_cluster.changed_since, seen)
                     if a.leader_epoch > waiting.get(TopicPartition(a.topic, a.partition), a.leader_epoch)]
        else:
            moved = []
        leading = self.leadership.leading() if moved else {}  # once per poll: every partition led here
        claimed = []
        for a in moved:
            key = TopicPartition(a.topic, a.partition)
            del waiting[key]
            claimed.append(key)
            if key not in leading:
                self._follow(Follow(key, self._leader(a.leader_broker), a.hwmark_seq, a.first_available_seq))
        return look.changes, claimed

    async def place_new_topic(self, partitions: int) -> dict[int, int]:
        """Which live broker leads each partition of a new topic: the fewest leaderships first."""
        await self._refresh_members()
        load = {b: n for b, n in (await self.catalog.read(catalog_cluster.leaderships)).items() if b in self.live}
        placed = spread([TopicPartition("", p) for p in range(partitions)], self.live, load)
        return {p: broker for (_, p), broker in placed.items()}

    def status(self) -> dict:
        return {"broker_id": self.broker_id, "holds_lease": self.holds_lease(), "live": sorted(self.live),
                "advertised": self.endpoints.advertised if self.endpoints else ""}
