"""The coordinator (tiered.tiering.cluster.coordinator) on a manual clock and a real catalog (both backends): its work per
tick follows what changed, not how many partitions exist (issue 28, "idle costs nothing")."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tiered.catalog import Catalog
from tiered.catalog.blocks import commit_block, insert_pending_block
from tiered.catalog.cluster import assignment, register, request_handover
from tiered.catalog.errors import CatalogUnavailable
from tiered.catalog.partitions import claim_partitions
from tiered.catalog.topics import create_topic
from tiered.metrics import Metrics
from tiered.tier_interface import Leader
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.cluster.coordinator import (
    CLAIM_POLL_S, PACE_POLL_S, PACE_RESERVE_S, PACE_WAIT_S, Coordinator, Endpoints,
)
from tiered.topic_partition import TopicPartition
from tests.catalog.rows import run, stamped
from tests.support.clock import ManualClock

ME, OTHER = 1, 2
LEASE_MS = 10_000

async def _until(condition, clock: ManualClock | None = None, step_s: float = 0.0, polls: int = 3000) -> None:
    """Waits for `condition`, moving `clock` on by `step_s` at each of at most `polls` polls (10 ms of real time each,
    for the catalog's threads): a wait that never ends fails the test instead of hanging it."""
    for _ in range(polls):
        if condition():
            return
        if clock is not None:
            clock.advance(step_s)
        await asyncio.sleep(0.01)
    raise AssertionError(f"not true after {polls} polls: {condition}")



class Sink:
    """The server's side, recorded: what it was told."""

    def __init__(self):
        self.follows: list[tuple] = []
        self.led: list = []
        self.topics: list[list[str]] = []

    def follow(self, tp, leader, committed, first_available=None):
        self.follows.append((*tp, leader, committed))

    async def lead(self, plans):
        self.led.extend(plans)

    async def topics_known(self, topics):
        self.topics.append(sorted(t.name for t in topics))

    def evicted(self, reason):
        raise AssertionError(reason)


class Leadership:
    """Claims through the catalog, as TieringService does (without planning the local disk)."""

    def __init__(self, cat: Catalog):
        self.cat = cat
        self.led: dict[tuple[str, int], int] = {}

    def leading(self):
        return dict(self.led)

    async def claim(self, topic, expected):
        won = claim_partitions(self.cat, ME, topic, sorted(expected))
        self.led.update({(topic, p): e for p, e in won.items()})
        return [(topic, p) for p in sorted(won)]

    async def give_up(self, keys, deadline):
        for key in keys:
            self.led.pop(key, None)

    def lost(self, tp):
        self.led.pop(tp, None)


@pytest.fixture
def cat(catalog_url):
    return Catalog.open(catalog_url)  # closed with the AsyncCatalog that serves it


async def joined(access: AsyncCatalog, sink: Sink, cat: Catalog, **options) -> Coordinator:
    """A coordinator of broker ME on a manual clock (`coordinator.clock`), joined as member; `options` are the
    Coordinator's own keywords (claim_batch, handover_chunk, ...)."""
    coordinator = Coordinator(access, sink, Leadership(cat), broker_id=ME, lease_ms=LEASE_MS, metrics=Metrics(),
                              clock=ManualClock(), **options)
    await coordinator.join(Endpoints("127.0.0.1:11011", ""))
    return coordinator


@pytest.fixture
async def coordinator(cat):
    access = AsyncCatalog(cat)
    yield await joined(access, Sink(), cat)
    access.close()


async def test_an_idle_tick_reads_one_statement_and_tells_nothing(cat, coordinator):
    create_topic(cat, "t", 8, leaders={p: ME for p in range(8)})
    await coordinator.tick()
    assert sorted(coordinator.leadership.leading()) == [("t", p) for p in range(8)]
    await coordinator.tick()  # looks once more after its own claims
    coordinator.sink.follows.clear()
    before = cat.statements
    for _ in range(5):
        await coordinator.tick()
    assert cat.statements - before == 5  # one small statement per tick: the members and the change counter
    assert coordinator.sink.follows == [] and coordinator.sink.led == [("t", p) for p in range(8)]


async def test_a_change_is_seen_at_the_next_tick(cat, coordinator):
    create_topic(cat, "t", 2, leaders={0: ME, 1: ME})
    await coordinator.tick()
    await coordinator.tick()
    topics_seen = len(coordinator.sink.topics)
    create_topic(cat, "u", 2, leaders={0: ME, 1: ME})  # by another broker, say
    await coordinator.tick()
    assert coordinator.sink.topics[-1] == ["t", "u"] and len(coordinator.sink.topics) == topics_seen + 1
    assert ("u", 0) in coordinator.leadership.leading() and ("u", 1) in coordinator.leadership.leading()


async def test_a_lapsed_lease_acknowledges_again_once_a_look_after_the_renewal_saw_no_change(cat, coordinator):
    create_topic(cat, "t", 1, leaders={0: ME})
    await coordinator.tick()
    await coordinator.tick()
    assert coordinator.holds_lease()
    coordinator.clock.advance(LEASE_MS / 1000.0 * 0.9)  # paused past 0.8 of the lease
    assert not coordinator.holds_lease()
    await coordinator.renew()
    assert not coordinator.holds_lease()  # renewed, but whether another broker claimed meanwhile is not known yet
    assert coordinator.ack_deadline.until == float("-inf")
    before = cat.statements
    await coordinator.tick()
    assert coordinator.holds_lease()
    assert coordinator.ack_deadline.until == coordinator.clock.monotonic() + SAFETY_S  # renewed at this time
    assert ("t", 0) in coordinator.leadership.leading()
    assert cat.statements - before < 4  # no partition was re-read: the counter had not moved


SAFETY_S = LEASE_MS / 1000.0 * 0.8  # cluster_decision.LEASE_SAFETY of the lease


async def test_the_ack_deadline_is_the_last_renewal_s_and_a_request_at_it_is_not_acknowledged(coordinator):
    """The produce path compares each request's clock read with `ack_deadline.until` (one attribute, no call): the
    last renewal's start plus 0.8 of the lease, moved on by each renewal only; a read before it may acknowledge, one
    at it or past it may not (holds_lease answers by the same comparison)."""
    clock = coordinator.clock
    assert coordinator.ack_deadline.until == clock.monotonic() + SAFETY_S  # joined now
    clock.advance(SAFETY_S / 2)
    assert coordinator.holds_lease()
    await coordinator.renew()  # on time: the deadline moves on
    renewed = clock.monotonic()
    assert coordinator.ack_deadline.until == renewed + SAFETY_S and coordinator.holds_lease()
    clock.advance(SAFETY_S)  # no renewal since (a paused loop, a slow catalog): the deadline is reached
    assert not coordinator.ack_deadline.allows(clock.monotonic()) and not coordinator.holds_lease()
    assert coordinator.ack_deadline.until == renewed + SAFETY_S  # not moved by the clock, only by a renewal


async def test_a_renewal_the_catalog_does_not_answer_leaves_the_deadline_to_pass(cat):
    """The catalog does not answer (its write thread is held: the renewal waits past its deadline and raises
    CatalogUnavailable): the ack deadline stays where the last renewal put it, and from that moment the broker
    acknowledges nothing, however often the renewal is tried."""
    lease_ms = 300  # the renewal's deadline is a third of the lease, in real time: 0.1 s
    access = AsyncCatalog(cat)
    held = threading.Event()
    stuck = None
    try:
        coordinator = Coordinator(access, Sink(), Leadership(cat), broker_id=ME, lease_ms=lease_ms,
                                  metrics=Metrics(), clock=ManualClock())
        await coordinator.join(Endpoints("127.0.0.1:11011", ""))
        clock = coordinator.clock
        until = coordinator.ack_deadline.until
        assert until == clock.monotonic() + 0.8 * lease_ms / 1000.0
        stuck = asyncio.ensure_future(access.write(lambda _: held.wait(10)))  # the write thread answers nothing
        await asyncio.sleep(0.01)
        for _ in range(2):
            clock.advance(lease_ms / 3000.0)
            with pytest.raises(CatalogUnavailable):
                await coordinator.renew()
            assert coordinator.ack_deadline.until == until
        assert coordinator.holds_lease()  # 0.2 of the lease gone: still before the deadline
        clock.advance(until - clock.monotonic() - 1e-6)
        assert coordinator.holds_lease()
        clock.advance(2e-6)
        assert not coordinator.holds_lease() and not coordinator.ack_deadline.allows(clock.monotonic())
    finally:
        held.set()
        if stuck is not None:
            await stuck
        access.close()


async def test_a_broker_id_taken_over_clears_the_deadline_for_good(cat, coordinator):
    """Another process registered this broker id (a new pod on the same volume): the first renewal that finds out
    clears the ack deadline, and nothing moves it again (the renewal loop ends)."""
    told: list[str] = []
    coordinator.sink.evicted = told.append
    register(cat, ME, "another-process", "127.0.0.9:11011", "", LEASE_MS)
    await coordinator.renew()
    assert told and coordinator.ack_deadline.until == float("-inf") and not coordinator.holds_lease()
    await coordinator.renew()  # refused again: still cleared
    assert coordinator.ack_deadline.until == float("-inf")


async def test_leaving_the_service_clears_the_deadline(coordinator):
    assert coordinator.holds_lease()
    await coordinator.leave(coordinator.clock.monotonic() + 5)
    assert coordinator.ack_deadline.until == float("-inf") and not coordinator.holds_lease()


async def test_a_handover_asked_by_rebalance_is_seen(pg_url):
    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    try:
        clock = ManualClock()
        coordinator = Coordinator(access, Sink(), Leadership(cat), broker_id=ME, lease_ms=LEASE_MS,
                                  metrics=Metrics(), clock=clock)
        await coordinator.join(Endpoints("127.0.0.1:11011", ""))
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        create_topic(cat, "t", 2, leaders={0: ME, 1: OTHER})
        claim_partitions(cat, OTHER, "t", [1])
        await coordinator.tick()
        await coordinator.tick()
        assert sorted(coordinator.leadership.leading()) == [("t", 0)]
        assert ("t", 1, Leader(OTHER, "127.0.0.2:11011"), 0) in coordinator.sink.follows
        request_handover(cat, "t", 0, OTHER)
        ticking = asyncio.create_task(coordinator.tick())  # sees it: gives up, assigns, waits for the claim
        await _until(lambda: assignment(cat, "t", 0).leader_broker == OTHER)
        assert coordinator.leadership.leading() == {}
        claim_partitions(cat, OTHER, "t", [0])  # the other broker's next tick
        await _until(ticking.done, clock, CLAIM_POLL_S)
        await ticking
        assert coordinator.sink.follows[-1] == ("t", 0, Leader(OTHER, "127.0.0.2:11011"), 0)
    finally:
        access.close()


async def test_a_follower_learns_its_bounds_when_a_read_needs_them(pg_url):
    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    try:
        sink = Sink()
        coordinator = await joined(access, sink, cat)
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        create_topic(cat, "t", 1, leaders={0: OTHER})
        epoch = claim_partitions(cat, OTHER, "t", [0])[0]
        await coordinator.tick()
        block = insert_pending_block(cat, "blocks/1", OTHER, 100)
        commit_block(cat, block, OTHER, stamped([run("t", 0, 1, 9)], {("t", 0): epoch}), {("t", 0): epoch})
        sink.follows.clear()
        await coordinator.tick()
        assert sink.follows == []  # a commit moves no counter: nobody polls every partition's bounds
        assert await coordinator.refresh_follower(TopicPartition("t", 0))
        assert sink.follows == [("t", 0, Leader(OTHER, "127.0.0.2:11011"), 9)]
        assert not await coordinator.refresh_follower(TopicPartition("t", 0))  # at most once per tick per partition
    finally:
        access.close()


async def test_claim_batches_are_pipelined_the_next_claimed_while_one_is_led(cat):
    """The catalog claims batch k + 1 (on its write thread) while batch k is carried out and led: each batch is
    claimed before the one before it is led, and every batch is led, in order."""
    events: list[tuple[str, tuple]] = []

    class Recorded(Leadership):
        async def claim(self, topic, expected):
            events.append(("claim", tuple(sorted(expected))))
            return await super().claim(topic, expected)

    class RecordedSink(Sink):
        async def lead(self, plans):
            events.append(("lead", tuple(p for _, p in plans)))
            await super().lead(plans)

    access = AsyncCatalog(cat)
    coordinator = Coordinator(access, RecordedSink(), Recorded(cat), broker_id=ME, lease_ms=LEASE_MS,
                              metrics=Metrics(), clock=ManualClock(), claim_batch=2)
    try:
        await coordinator.join(Endpoints("127.0.0.1:11011", ""))
        create_topic(cat, "t", 5, leaders={p: ME for p in range(5)})
        await coordinator.tick()
    finally:
        access.close()
    assert events == [("claim", (0, 1)), ("claim", (2, 3)), ("lead", (0, 1)), ("claim", (4,)), ("lead", (2, 3)),
                      ("lead", (4,))]
    assert sorted(coordinator.leadership.leading()) == [("t", p) for p in range(5)]


async def test_a_look_reads_and_tells_only_the_partitions_that_changed(pg_url):
    """After the first look (every assignment), a change to one partition among 300 costs a read of that one row:
    the server is told about it alone, and the brokers' shares of the rest are kept, not recounted."""
    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    try:
        sink = Sink()
        coordinator = await joined(access, sink, cat)
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        create_topic(cat, "t", 300, leaders={p: OTHER for p in range(300)})
        claim_partitions(cat, OTHER, "t", range(300))
        await coordinator.tick()
        assert len(sink.follows) == 300
        sink.follows.clear()
        claim_partitions(cat, OTHER, "t", [7])  # the other broker claimed it again (a restart, say)
        rows_read = []
        real = access.read

        async def counted(fn, *args, **kwargs):
            result = await real(fn, *args, **kwargs)
            if fn.__name__ in ("changed_look", "full_look"):
                rows_read.append((fn.__name__, len(result.assignments)))
            return result

        access.read = counted
        assert await coordinator.tick()
        assert rows_read == [("changed_look", 1)]
        assert sink.follows == []  # followed to the same leader with the same bounds: nothing to tell
        request_handover(cat, "t", 8, ME)  # asked of the other broker: partition 8 is still followed there
        register(cat, OTHER, "other", "127.0.0.3:11011", "", LEASE_MS)  # it moved: its partitions are told anew
        assert await coordinator.tick()
        assert rows_read[-1] == ("changed_look", 1) and len(sink.follows) == 300
        assert not await coordinator.tick()
        assert coordinator._assignments.load({ME, OTHER}) == {ME: 0, OTHER: 300}
    finally:
        access.close()


async def test_a_change_no_version_names_is_found_by_the_periodic_full_look(pg_url):
    """The safety net: a row changed outside tiered.catalog without a new change version (here: its version set
    back by hand) is not among the changed rows, and is found by the full look FULL_LOOK_S later."""
    from sqlalchemy import text

    from tiered.tiering.cluster.coordinator import FULL_LOOK_S

    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    try:
        sink = Sink()
        clock = ManualClock()
        coordinator = Coordinator(access, sink, Leadership(cat), broker_id=ME, lease_ms=LEASE_MS,
                                  metrics=Metrics(), clock=clock)
        await coordinator.join(Endpoints("127.0.0.1:11011", ""))
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        create_topic(cat, "t", 2, leaders={0: OTHER, 1: OTHER})
        claim_partitions(cat, OTHER, "t", [0, 1])
        await coordinator.tick()
        create_topic(cat, "u", 1, leaders={0: OTHER})  # moves the counter
        with cat.write() as conn:
            conn.execute(text("UPDATE partitions SET leader_broker = NULL, change_version = 1 "
                              "WHERE topic = 't' AND partition = 0"))
        await coordinator.tick()
        assert ("t", 0) not in coordinator.leadership.leading()  # unseen: no version above the one last read
        clock.advance(FULL_LOOK_S)
        await coordinator.renew()
        await coordinator.tick()
        assert ("t", 0) in coordinator.leadership.leading()  # an orphan, claimed once the full look found it
    finally:
        access.close()


async def test_between_claim_batches_the_other_brokers_claims_are_followed(pg_url):
    """A long decision's claims (a failover's orphans) look at the changes between batches: a partition another
    broker claimed meanwhile is followed to it within the same tick, so clients asking here are redirected there."""
    from tiered.catalog.partitions import claim_leadership

    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    clock = ManualClock()

    class Slow(Leadership):
        async def claim(self, topic, expected):
            if not self.led:  # the first batch: meanwhile the other broker claims partition 5
                claim_partitions(cat, OTHER, topic, [5])
            clock.advance(0.5)
            won = claim_leadership(cat, ME, "", topic, {p: None for p in expected}, expected_epochs=expected)
            self.led.update({(topic, p): c.epoch for p, c in won.items()})
            return [(topic, p) for p in sorted(won)]

    try:
        sink = Sink()
        coordinator = Coordinator(access, sink, Slow(cat), broker_id=ME, lease_ms=LEASE_MS, metrics=Metrics(),
                                  clock=clock, claim_batch=2)
        await coordinator.join(Endpoints("127.0.0.1:11011", ""))
        create_topic(cat, "t", 6, leaders={p: ME for p in range(6)})
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        await coordinator.tick()
        assert sorted(coordinator.leadership.leading()) == [("t", p) for p in range(5)]
        assert sink.follows[-1] == ("t", 5, Leader(OTHER, "127.0.0.2:11011"), 0)
    finally:
        access.close()


async def test_a_topic_created_during_a_look_has_its_leaders_told_once_it_exists_here(pg_url):
    """Another broker creates a topic while this one looks at the catalog, after its topics were read and before its
    assignments were: the server cannot be told who leads a partition it does not have yet, and must be told once it
    has it. (The flake of test_a_paused_leader_acknowledges_nothing_after_its_lease: the broker that created the topic
    had remembered its other partition's leader as told, and answered "no leader" for it for good.)"""

    class LocalSink(Sink):
        """As the server: a follow of a partition it does not have is dropped; a topic exists once it was known."""

        def __init__(self):
            super().__init__()
            self.local: set[str] = set()
            self.leaders: dict[tuple[str, int], Leader | None] = {}
            self.during_topics_known = None

        def follow(self, tp, leader, committed, first_available=None):
            super().follow(tp, leader, committed, first_available)
            if tp[0] in self.local:
                self.leaders[tuple(tp)] = leader

        async def topics_known(self, topics):
            await super().topics_known(topics)
            self.local.update(t.name for t in topics)
            if self.during_topics_known is not None:
                self.during_topics_known()

    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    try:
        sink = LocalSink()
        coordinator = await joined(access, sink, cat)
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        create_topic(cat, "t", 1, leaders={0: OTHER})
        await coordinator.tick()

        def another_broker_creates_u():
            sink.during_topics_known = None
            create_topic(cat, "u", 1, leaders={0: OTHER})
            claim_partitions(cat, OTHER, "u", [0])

        sink.during_topics_known = another_broker_creates_u
        claim_partitions(cat, OTHER, "t", [0])  # the counter moves: the next tick looks at everything
        for _ in range(3):
            await coordinator.tick()
        assert "u" in sink.local
        assert sink.leaders[("u", 0)] == Leader(OTHER, "127.0.0.2:11011")
    finally:
        access.close()


async def test_a_stopping_broker_gives_up_each_chunk_once_the_one_before_is_claimed(pg_url):
    """leave() hands over chunk after chunk, the next only once the claims of the one before landed: a partition
    waits for its own chunk's claims, not for a queue of chunks its new leader has not reached. The lease is renewed
    meanwhile (its loop is stopped at shutdown), and a chunk not claimed within the patience is not waited for."""
    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    try:
        coordinator = await joined(access, Sink(), cat, handover_chunk=2, handover_ahead=1)
        clock = coordinator.clock
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        create_topic(cat, "t", 6, leaders={p: ME for p in range(6)})
        await coordinator.tick()
        assert sorted(coordinator.leadership.leading()) == [("t", p) for p in range(6)]

        def assigned_to_other() -> list[int]:
            return [p for p in range(6) if assignment(cat, "t", p).leader_broker == OTHER]

        async def until(condition) -> None:
            await _until(condition, clock, PACE_POLL_S)

        leaving = asyncio.create_task(coordinator.leave(clock.monotonic() + 60))
        await until(lambda: assigned_to_other() == [0, 1])
        for _ in range(5):  # polls: chunk 0 is not claimed, so chunk 1 stays here, still led
            clock.advance(PACE_POLL_S)
            await asyncio.sleep(0.01)
        assert assigned_to_other() == [0, 1]
        assert sorted(coordinator.leadership.leading()) == [("t", p) for p in range(2, 6)]
        claim_partitions(cat, OTHER, "t", [0])
        for _ in range(5):  # half a chunk claimed is not the chunk
            clock.advance(PACE_POLL_S)
            await asyncio.sleep(0.01)
        assert assigned_to_other() == [0, 1]
        renewed = coordinator._renewed_at
        claim_partitions(cat, OTHER, "t", [1])  # the other broker's claims of chunk 0 landed: chunk 1 goes
        await until(lambda: assigned_to_other() == [0, 1, 2, 3])
        assert ("t", 0, Leader(OTHER, "127.0.0.2:11011"), 0) in coordinator.sink.follows  # redirected there
        # Nobody claims chunk 1: after the patience, chunk 2 goes anyway; the lease was renewed while waiting.
        started = clock.monotonic()
        await until(lambda: assigned_to_other() == list(range(6)))
        assert clock.monotonic() - started >= PACE_WAIT_S
        assert coordinator.leadership.leading() == {}
        await until(lambda: coordinator._renewed_at > renewed)  # still waiting for claims, a third of a lease on
        claim_partitions(cat, OTHER, "t", [2, 3, 4, 5])
        await until(leaving.done)
        await leaving
    finally:
        access.close()


async def test_past_the_shutdowns_reserve_the_rest_is_handed_over_at_once(pg_url):
    """The pacing keeps PACE_RESERVE_S of the shutdown's budget for what follows the handover: with less left, every
    chunk is given up and assigned without waiting for the claims of the one before (each still handed over, not
    left to the lease's expiry)."""
    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    try:
        coordinator = await joined(access, Sink(), cat, handover_chunk=2, handover_ahead=1)
        clock = coordinator.clock
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        create_topic(cat, "t", 6, leaders={p: ME for p in range(6)})
        await coordinator.tick()
        leaving = asyncio.create_task(coordinator.leave(clock.monotonic() + PACE_RESERVE_S - 1))
        # The clock does not move: nothing waited for the claims.
        await _until(lambda: [p for p in range(6) if assignment(cat, "t", p).leader_broker == OTHER] == list(range(6)))
        assert coordinator.leadership.leading() == {}
        claim_partitions(cat, OTHER, "t", range(6))
        await _until(leaving.done, clock, PACE_POLL_S)
        await leaving
    finally:
        access.close()


async def test_each_new_leader_is_handed_its_next_chunk_at_its_own_pace(pg_url):
    """Two new leaders: the one that claimed its chunk gets its next one while the other has not claimed its own."""
    third = 3
    cat = Catalog.open(pg_url)
    access = AsyncCatalog(cat)
    try:
        coordinator = await joined(access, Sink(), cat, handover_chunk=2, handover_ahead=1)
        clock = coordinator.clock
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        register(cat, third, "third", "127.0.0.3:11011", "", LEASE_MS)
        create_topic(cat, "t", 8, leaders={p: ME for p in range(8)})
        await coordinator.tick()

        def assigned(broker: int) -> list[int]:
            return [p for p in range(8) if assignment(cat, "t", p).leader_broker == broker]

        async def until(condition) -> None:
            await _until(condition, clock, PACE_POLL_S)

        leaving = asyncio.create_task(coordinator.leave(clock.monotonic() + 60))
        await until(lambda: len(assigned(OTHER)) == 2 and len(assigned(third)) == 2)
        first_other, first_third = assigned(OTHER), assigned(third)
        claim_partitions(cat, OTHER, "t", first_other)
        await until(lambda: len(assigned(OTHER)) == 4)
        assert assigned(third) == first_third  # not claimed yet: nothing more handed to it
        claim_partitions(cat, third, "t", first_third)
        await until(lambda: len(assigned(third)) == 4)
        claim_partitions(cat, OTHER, "t", [p for p in assigned(OTHER) if p not in first_other])
        claim_partitions(cat, third, "t", [p for p in assigned(third) if p not in first_third])
        await until(leaving.done)
        await leaving
        assert coordinator.leadership.leading() == {}
    finally:
        access.close()
