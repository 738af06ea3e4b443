"""The cluster decision (tiered.tiering.cluster.cluster_decision.decide): pure, as a table of cases, and its placements."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.catalog.cluster import Assignment
from tiered.tier_interface import Leader
from tiered.tiering.cluster.cluster_decision import (
    Assignments, ClusterView, Follow, Pace, ack_deadline, affected, claim_batches, decide, decide_changes,
    handover_chunks, handover_queues, lease_deadline, lease_fresh, may_hand_over_next, membership, next_look_in,
    plan_rebalance, ready_targets, spread,
)
from tiered.topic_partition import TopicPartition

ME, B, C = 1, 2, 3
ADDRESSES = {ME: "10.0.0.1:11011", B: "10.0.0.2:11011", C: "10.0.0.3:11011"}
LEASE_MS = 10_000
NOW = 100.0
FRESH = NOW - 1.0  # renewed 1 s ago: fresh (0.8 of the lease is 8 s)
STALE = NOW - 9.0  # renewed 9 s ago: no longer fresh


def a(p, leader, epoch, *, topic="t", hw=10, first=1, handover=None) -> Assignment:
    return Assignment(topic, p, leader, epoch, hw, first, handover)


def view(assignments, *, live=(ME, B, C), renewed_at=FRESH, evicted=False) -> ClusterView:
    return ClusterView(ME, frozenset(live), ADDRESSES, tuple(assignments), LEASE_MS, renewed_at, evicted)


def to(broker) -> Leader:
    return Leader(broker, ADDRESSES[broker])


# name: (assignments, leading here {key: epoch}, view options,
#        expected (claims, lost {key: leader}, handovers, follows {key: leader}, renew_first))
CASES = {
    "steady: led here, the rest followed to their leaders": (
        [a(0, ME, 3), a(1, B, 2), a(2, C, 5)], {("t", 0): 3}, {},
        ({}, {}, {}, {("t", 1): to(B), ("t", 2): to(C)}, False)),
    "new topic: partitions assigned here are claimed at their epoch, after a renewal": (
        [a(0, ME, 0, hw=0, first=0), a(1, B, 0, hw=0, first=0)], {}, {},
        ({"t": {0: 0}}, {}, {}, {("t", 0): None, ("t", 1): to(B)}, True)),
    "expired lease: B's partitions are orphans, spread over ME and C (fewest leaderships first)": (
        [a(0, ME, 1), a(1, B, 1), a(2, B, 1), a(3, C, 1), a(4, B, 1)], {("t", 0): 1}, {"live": (ME, C)},
        ({"t": {1: 1, 4: 1}}, {}, {}, {("t", 1): None, ("t", 2): None, ("t", 3): to(C), ("t", 4): None}, False)),
    "orphans with no assigned leader: the lowest id takes the first": (
        [a(0, None, 0), a(1, None, 0), a(2, None, 0)], {}, {},
        ({"t": {0: 0}}, {}, {}, {("t", 0): None, ("t", 1): None, ("t", 2): None}, False)),
    "broker joined: it takes no partition back, it gets orphans only": (
        [a(0, B, 4), a(1, C, 4)], {}, {},
        ({}, {}, {}, {("t", 0): to(B), ("t", 1): to(C)}, False)),
    "broker left, alone now: every orphan is claimed here": (
        [a(0, B, 4), a(1, C, 4)], {}, {"live": (ME,)},
        ({"t": {0: 4, 1: 4}}, {}, {}, {("t", 0): None, ("t", 1): None}, False)),
    "fenced: the epoch moved past the one led here: lost, and followed to the new leader": (
        [a(0, B, 6, hw=40, first=2), a(1, ME, 2)], {("t", 0): 5, ("t", 1): 2}, {},
        ({}, {("t", 0): to(B)}, {}, {}, False)),
    "lost to a broker whose lease already expired: followed with no leader": (
        [a(0, B, 6)], {("t", 0): 5}, {"live": (ME, C)},
        ({}, {("t", 0): None}, {}, {}, False)),
    "handover in flight: the leader hands over to a live target": (
        [a(0, ME, 3, handover=B), a(1, ME, 3, handover=ME)], {("t", 0): 3, ("t", 1): 3}, {},
        ({}, {}, {("t", 0): (B, 3)}, {}, False)),
    "handover to a broker that is not live: kept": (
        [a(0, ME, 3, handover=C)], {("t", 0): 3}, {"live": (ME, B)},
        ({}, {}, {}, {}, False)),
    "handover landed: assigned here, claimed at the epoch the old leader held": (
        [a(0, ME, 7, handover=ME)], {}, {},
        ({"t": {0: 7}}, {}, {}, {("t", 0): None}, True)),
    "lease not fresh: no claims, neither assigned nor orphans": (
        [a(0, ME, 0), a(1, B, 2)], {}, {"live": (ME, C), "renewed_at": STALE},
        ({}, {}, {}, {("t", 0): None, ("t", 1): None}, False)),
    "evicted: claims nothing": (
        [a(0, ME, 0), a(1, None, 0)], {}, {"evicted": True},
        ({}, {}, {}, {("t", 0): None, ("t", 1): None}, False)),
    "never renewed: claims nothing": (
        [a(0, None, 0)], {}, {"renewed_at": None},
        ({}, {}, {}, {("t", 0): None}, False)),
    "several topics: claims grouped by topic, orphans spread over both": (
        [a(0, None, 0, topic="x"), a(0, None, 0, topic="y"), a(1, None, 0, topic="y")], {}, {"live": (ME, B)},
        ({"x": {0: 0}, "y": {1: 0}}, {}, {},
         {("x", 0): None, ("y", 0): None, ("y", 1): None}, False)),
}


@pytest.mark.parametrize("name", CASES)
def test_decide(name):
    assignments, leading, options, (claims, lost, handovers, follows, renew_first) = CASES[name]
    decision = decide(view(assignments, **options), leading, NOW)
    assert {t: dict(ps) for t, ps in decision.claims.items()} == claims
    assert {f.key: f.leader for f in decision.lost} == lost
    assert dict(decision.handovers) == handovers
    assert {f.key: f.leader for f in decision.follows} == follows
    assert decision.renew_first == renew_first


def test_follows_carry_the_catalogs_bounds():
    decision = decide(view([a(0, B, 6, hw=40, first=2), a(1, C, 1, hw=7, first=3)]), {("t", 0): 5}, NOW)
    assert decision.lost == (Follow(("t", 0), to(B), 40, 2),)
    assert decision.follows == (Follow(("t", 1), to(C), 7, 3),)


def test_every_broker_decides_the_same_orphan_claims():
    """Two brokers looking at the same catalog claim disjoint orphans that cover them all."""
    rows = [a(p, None, 0) for p in range(7)] + [a(7, B, 1), a(8, ME, 1)]
    mine = decide(view(rows, live=(ME, B)), {("t", 8): 1}, NOW).claims.get("t", {})
    theirs = decide(ClusterView(B, frozenset((ME, B)), ADDRESSES, tuple(rows), LEASE_MS, FRESH),
                    {("t", 7): 1}, NOW).claims.get("t", {})
    assert not set(mine) & set(theirs)
    assert set(mine) | set(theirs) == set(range(7))
    assert abs(len(mine) - len(theirs)) <= 1


SPREAD = {
    "even from nothing": ([("t", p) for p in range(4)], (1, 2), {}, {1: 2, 2: 2}),
    "fewest leaderships first": ([("t", p) for p in range(3)], (1, 2), {1: 2}, {1: 1, 2: 2}),
    "ties go to the lowest id": ([("t", 0)], (2, 1), {}, {1: 1}),
    "nobody live": ([("t", 0)], (), {}, {}),
}


@pytest.mark.parametrize("name", SPREAD)
def test_spread(name):
    partitions, live, load, per_broker = SPREAD[name]
    placed = spread(partitions, live, load)
    counts: dict[int, int] = {}
    for broker in placed.values():
        counts[broker] = counts.get(broker, 0) + 1
    assert counts == per_broker
    assert spread(partitions, live, load) == placed  # the same answer every time


def test_plan_rebalance_evens_loads_and_spreads_topics():
    rows = [a(p, 1, 1, topic=t) for t in ("x", "y") for p in range(4)]
    moves = plan_rebalance(rows, (1, 2))
    assert len(moves) == 4 and set(moves.values()) == {2}
    assert sorted(t for t, _ in moves) == ["x", "x", "y", "y"]
    assert plan_rebalance(rows, (1,)) == {}
    even = [a(0, 1, 1), a(1, 2, 1), a(2, 1, 1)]
    assert plan_rebalance(even, (1, 2)) == {}


CLAIM_BATCH_CASES = {
    "nothing": ({}, 3, []),
    "one small topic": ({"t": {1: 4, 0: 2}}, 3, [("t", {0: 2, 1: 4})]),
    "exactly a batch": ({"t": {0: 1, 1: 1, 2: 1}}, 3, [("t", {0: 1, 1: 1, 2: 1})]),
    "a topic split": ({"t": {p: p for p in range(7)}}, 3,
                      [("t", {0: 0, 1: 1, 2: 2}), ("t", {3: 3, 4: 4, 5: 5}), ("t", {6: 6})]),
    "topics in name order, never mixed": ({"b": {0: 1}, "a": {5: 2, 1: 3}}, 3, [("a", {1: 3, 5: 2}), ("b", {0: 1})]),
    "one at a time": ({"t": {2: 1, 0: 1}}, 1, [("t", {0: 1}), ("t", {2: 1})]),
}


@pytest.mark.parametrize("name", CLAIM_BATCH_CASES)
def test_claim_batches(name):
    claims, limit, expected = CLAIM_BATCH_CASES[name]
    batches = claim_batches(claims, limit)
    assert batches == expected
    # Every claim once, with the epoch read, in batches no larger than the limit.
    assert sorted((t, p, e) for t, batch in batches for p, e in batch.items()) == sorted(
        (t, p, e) for t, parts in claims.items() for p, e in parts.items())
    assert all(len(batch) <= limit for _, batch in batches)


def test_claim_batches_refuse_an_empty_batch():
    with pytest.raises(ValueError, match="at least one partition"):
        claim_batches({"t": {0: 1}}, 0)


# -- the incremental decision: equal to the full one over any sequence of changes ---------------------------------

KEYS = [TopicPartition(t, p) for t in ("x", "y") for p in range(4)]
BROKERS = (ME, B, C)

rows_st = st.builds(
    lambda key, leader, epoch, hw, handover: Assignment(key.topic, key.partition, leader, epoch, hw, 1, handover),
    st.sampled_from(KEYS), st.sampled_from((None, ME, B, C)), st.integers(0, 4), st.integers(0, 3),
    st.sampled_from((None, None, ME, B, C)))
members_st = st.tuples(st.frozensets(st.sampled_from(BROKERS)),
                       st.dictionaries(st.sampled_from(BROKERS), st.sampled_from(("10.0.0.9:1", "10.0.0.8:2"))))
step_st = st.one_of(
    st.tuples(st.just("rows"), st.lists(rows_st, max_size=4)),
    st.tuples(st.just("members"), members_st),
    st.tuples(st.just("claim"), st.sampled_from(KEYS)),
    st.tuples(st.just("drop"), st.sampled_from(("x", "y"))),
    st.tuples(st.just("renewed"), st.sampled_from((FRESH, STALE))),
)


def member_view(rows, live, moved, renewed_at) -> ClusterView:
    addresses = {**ADDRESSES, **moved}
    return ClusterView(ME, frozenset(live), addresses, tuple(rows), LEASE_MS, renewed_at, False,
                       {b: "plain:" + addresses[b] for b in moved})


@settings(max_examples=300, deadline=None)
@given(st.lists(rows_st, min_size=1, max_size=10), members_st, st.lists(step_st, max_size=12),
       st.dictionaries(st.sampled_from(KEYS), st.integers(0, 4), max_size=4))
def test_the_decision_over_what_changed_equals_the_decision_over_everything(initial, members, steps, led):
    """Whatever rows change, brokers come and go, partitions are claimed or topics dropped: deciding only about the
    partitions whose answer can have moved (`affected`) gives the claims, losses and handovers the full decision
    gives, and leaves the server told exactly what the full decision tells it."""
    state = Assignments(initial)
    live, moved = members
    renewed_at = FRESH
    view = member_view(state.rows.values(), live, moved, renewed_at)
    leading = {key: epoch for key, epoch in led.items() if key in state.rows}
    told_full: dict = {}
    told_incr: dict = {}

    def carry_out(decision, told):
        for f in (*decision.lost, *decision.follows):
            told[f.key] = f

    first = decide(view, leading, NOW)
    carry_out(first, told_full)
    carry_out(first, told_incr)
    for f in first.lost:
        del leading[f.key]
    for kind, arg in steps:
        before = membership(view)
        changed: set = set()
        if kind == "rows":
            changed = state.apply(arg)
        elif kind == "members":
            live, moved = arg
        elif kind == "claim" and arg in state.rows and arg not in leading:
            a = state.rows[arg]
            changed = state.apply([a._replace(leader_broker=ME, leader_epoch=a.leader_epoch + 1, handover_to=None)])
            leading[arg] = a.leader_epoch + 1
            told_full.pop(arg, None)
            told_incr.pop(arg, None)
        elif kind == "drop":
            changed = state.drop_topics({"x", "y"} - {arg})
            for key in changed:
                leading.pop(key, None)
                told_full.pop(key, None)
                told_incr.pop(key, None)
        elif kind == "renewed":
            renewed_at = arg
        view = member_view(state.rows.values(), live, moved, renewed_at)
        keys = affected(state, changed, before, membership(view))
        full = decide(view, leading, NOW)
        incr = decide_changes(view, state, keys, leading, NOW)
        assert incr.claims == full.claims
        assert incr.handovers == full.handovers
        assert incr.renew_first == full.renew_first
        assert set(incr.lost) == set(full.lost)
        carry_out(full, told_full)
        carry_out(incr, told_incr)
        assert told_incr == told_full
        for f in full.lost:
            del leading[f.key]


def test_assignments_keep_their_indexes_as_rows_change():
    state = Assignments([a(0, ME, 1, handover=B), a(1, B, 1), a(0, None, 0, topic="u")])
    assert state.load({ME, B, C}) == {ME: 1, B: 1, C: 0}
    assert state.handovers == {("t", 0)}
    assert state.apply([a(0, ME, 1, handover=B)]) == set()  # read again unchanged: nothing changed
    assert state.apply([a(0, C, 2), a(2, C, 0)]) == {("t", 0), ("t", 2)}
    assert state.load({ME, B, C}) == {ME: 0, B: 1, C: 2} and state.handovers == set()
    assert state.drop_topics({"t"}) == {("u", 0)} and None not in state.by_broker
    assert state.replace([a(1, B, 1)]) == {("t", 0), ("t", 2)}
    assert list(state.rows) == [("t", 1)] and state.by_broker == {B: {("t", 1)}} and dict(state.topics) == {"t": 1}


def test_handover_chunks_keep_partition_order_and_every_new_leader_busy():
    keys = [TopicPartition(t, p) for t in ("u", "t") for p in range(3)]
    targets = spread(keys, {B, C}, {})
    moves = {key: (targets[key], 4) for key in keys}
    chunks = handover_chunks(moves, 4)
    assert [list(c) for c in chunks] == [sorted(keys)[:4], sorted(keys)[4:]]
    assert {b for b, _ in chunks[0].values()} == {B, C}  # a chunk alternates the new leaders
    assert {k: v for c in chunks for k, v in c.items()} == moves
    assert handover_chunks({}, 4) == []
    with pytest.raises(ValueError):
        handover_chunks(moves, 0)


@pytest.mark.parametrize("unclaimed, ahead, expected", [
    ((), 1, True),  # nothing waits for claims: the first chunk goes
    ((9.5,), 1, False),  # one chunk waits for its claims, one allowed
    ((9.5,), 2, True),  # a second may be given up while the first is claimed
    ((9.0, 9.5), 2, False),
    ((7.5,), 1, True),  # given up 2.5 s ago (patience 2 s): a new leader gone or stuck is waited for no longer
    ((7.5, 9.5), 2, True),
    ((8.0,), 1, True),  # exactly the patience
])
def test_a_stopping_broker_gives_up_its_next_chunk_when_fewer_than_ahead_wait_for_claims(unclaimed, ahead, expected):
    assert may_hand_over_next(unclaimed, 10.0, ahead, 2.0) is expected


def test_handover_queues_give_each_new_leader_its_own_chunks_in_partition_order():
    keys = [TopicPartition(t, p) for t in ("u", "t") for p in range(5)]
    targets = spread(keys, {B, C}, {})
    moves = {key: (targets[key], 4) for key in keys}
    queues = handover_queues(moves, 2)
    assert sorted(queues) == [B, C]
    for target, chunks in queues.items():
        own = sorted(k for k in keys if targets[k] == target)
        assert [list(c) for c in chunks] == [own[i:i + 2] for i in range(0, len(own), 2)]
        assert all(moves[k] == v for c in chunks for k, v in c.items())
    assert handover_queues({}, 2) == {}


@pytest.mark.parametrize("unclaimed, pending, expected", [
    ({}, [C, B], [B, C]),  # nothing given up yet: both, in id order
    ({B: [9.5]}, [B, C], [C]),  # B has not claimed its chunk: C is not held up by it
    ({B: [9.5], C: [9.9]}, [B, C], []),
    ({B: [7.0], C: [9.9]}, [B, C], [B]),  # B's chunk is past the patience
    ({B: [9.5]}, [C], [C]),  # B has nothing left
])
def test_each_new_leader_gets_its_next_chunk_once_it_claimed_its_last(unclaimed, pending, expected):
    assert ready_targets(unclaimed, pending, 10.0, 1, 2.0) == expected


def test_a_decision_without_claims_tells_the_same_losses_and_follows():
    state = Assignments([a(0, None, 0), a(1, B, 3), a(2, ME, 2), a(3, ME, 0)])
    v = view(state.rows.values())
    leading = {TopicPartition("t", 1): 2, TopicPartition("t", 2): 2}
    full = decide_changes(v, state, state.rows.keys(), leading, NOW)
    follows_only = decide_changes(v, state, state.rows.keys(), leading, NOW, claims_too=False)
    assert full.claims and not follows_only.claims and not follows_only.renew_first
    assert (follows_only.lost, follows_only.follows) == (full.lost, full.follows)


PACE = Pace(led_s=0.01, follow_s=0.05, tick_s=0.25, idle_s=1.0, expiry_margin_s=0.05)


@pytest.mark.parametrize("led, moved, told, expiries, expected", [
    (True, True, True, [], 0.01),  # its claims were led: a stopping broker's next chunk comes soon
    (False, True, True, [], 0.05),  # changes come in bursts
    (False, False, False, [9.0], 0.25),  # nobody tells it of changes: it looks every tick
    (False, False, True, [], 1.0),  # told of changes, alone: the idle tick
    (False, False, True, [6.7, 9.9], 1.0),  # the other leases expire after the idle tick
    (False, False, True, [9.9, 0.4], 0.45),  # one expires first: looked at just after it
    (False, False, True, [-0.2], 0.05),  # expired since the look read it as live: at once
    (False, True, True, [0.001], 0.05),  # changes first: a lease's expiry does not delay them
])
def test_the_next_look(led, moved, told, expiries, expected):
    assert next_look_in(PACE, led=led, moved=moved, told=told, expiries=expiries) == pytest.approx(expected)


@pytest.mark.parametrize("renewed_at, lapsed, evicted, until", [
    (FRESH, False, False, FRESH + 8.0),  # 0.8 of a 10 s lease after the renewal's start
    (None, False, False, float("-inf")),  # never renewed, or the lease ended
    (FRESH, True, False, float("-inf")),  # lapsed, not checked since
    (FRESH, False, True, float("-inf")),  # the broker id was taken over
])
def test_the_ack_deadline(renewed_at, lapsed, evicted, until):
    assert ack_deadline(renewed_at, LEASE_MS, lapsed=lapsed, evicted=evicted) == until


def test_a_lease_is_fresh_until_its_deadline_and_not_at_it():
    """lease_fresh (the tick's and the claims' rule) and the ack deadline (the produce path's) are one rule."""
    until = lease_deadline(FRESH, LEASE_MS)
    assert lease_fresh(FRESH, LEASE_MS, until - 1e-9) and not lease_fresh(FRESH, LEASE_MS, until)
    assert not lease_fresh(None, LEASE_MS, NOW) and not lease_fresh(STALE, LEASE_MS, NOW)
