"""What one broker does about the cluster, decided from one look at the catalog: pure, no I/O, no clock of its own.

`decide(view, leading, now)` takes what the coordinator read (the members, every partition's assignment) and what
this broker leads, and answers with a `Decision`: which partitions it claims, which it lost, which it hands over,
whom it follows, and whether its lease must be renewed before it claims. The coordinator (tiered.tiering.
coordinator) only reads, calls `decide`, and applies the answer; every case of the cluster's behaviour is a row of
a table in tests/tiering/test_cluster_decision.py.

A look costs what changed, not what exists: the coordinator keeps the rows it read in `Assignments` (with the
partitions per assigned leader and those with a handover asked), applies to it only the rows changed since its
last look, and asks `decide_changes` about the partitions whose answer can have moved; `decide` is
`decide_changes` over every row, and the two agree over any sequence of changes (a property test).

The rules (docs/cluster.md):
- a partition led here whose epoch moved on was claimed by another broker: lost, and followed;
- a partition led here that `tiered cluster rebalance` asked to move to another live broker: handed over;
- a partition assigned to this broker, not led here: claimed, at the epoch read (compare-and-set), but only while
  the lease is held; since the row may also name this broker id because another process took the id over, the
  lease is renewed first (a renewal refused means: evicted, claim nothing);
- an orphan (no assigned leader, or one whose lease expired): claimed by the live broker `spread` picks, the same
  answer on every broker;
- anything else is followed: redirected to its live leader, or "no leader yet" while nobody leads it.

`spread` and `plan_rebalance` are the two placements: a batch of partitions over the live brokers, and the moves
that even the brokers' loads out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tiered.catalog.cluster import Assignment
from tiered.tier_interface import Leader
from tiered.topic_partition import TopicPartition

LEASE_SAFETY = 0.8  # acknowledge (and claim) only while the last renewal is younger than this share of the lease


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One look at the catalog, from broker `me`."""

    me: int
    live: frozenset[int]  # brokers whose lease has not expired (this one included while its own lease is fresh)
    addresses: Mapping[int, str]  # broker id -> advertised TANK endpoint
    assignments: Sequence[Assignment]
    lease_ms: int
    renewed_at: float | None  # monotonic time of the last renewal that kept the lease unbroken (None: never)
    evicted: bool = False  # another process took this broker id over: it never leads again
    plain_addresses: Mapping[int, str] = field(default_factory=dict)  # broker id -> plaintext endpoint ("": none)


@dataclass(frozen=True, slots=True)
class Follow:
    """Tell the server: the partition is led elsewhere (`leader`), or by nobody yet (None), with the catalog's
    committed bounds."""

    key: TopicPartition
    leader: Leader | None
    committed: int
    first_available: int


@dataclass(frozen=True, slots=True)
class Decision:
    lost: tuple[Follow, ...] = ()  # led here, claimed by another broker: forget, then follow
    follows: tuple[Follow, ...] = ()
    claims: Mapping[str, Mapping[int, int]] = field(default_factory=dict)  # topic -> {partition: epoch read}
    handovers: Mapping[TopicPartition, tuple[int, int]] = field(default_factory=dict)  # -> (to broker, epoch)
    renew_first: bool = False  # a claim names this broker id: renew the lease before claiming (evicted: no claims)


def lease_deadline(renewed_at: float | None, lease_ms: int) -> float:
    """The monotonic moment from which a lease renewed at `renewed_at` may no longer be relied on (-inf: no lease,
    never renewed or ended). The rule is stated here only: `lease_fresh` and `ack_deadline` both answer from it."""
    return float("-inf") if renewed_at is None else renewed_at + LEASE_SAFETY * lease_ms / 1000.0


def lease_fresh(renewed_at: float | None, lease_ms: int, now: float) -> bool:
    """Whether a lease renewed at `renewed_at` (monotonic) may still be relied on at `now`."""
    return now < lease_deadline(renewed_at, lease_ms)


def ack_deadline(renewed_at: float | None, lease_ms: int, *, lapsed: bool, evicted: bool) -> float:
    """Until when (monotonic) a broker may acknowledge: its lease's deadline, or -inf while the lease lapsed and was
    not checked since (a partition may have been claimed meanwhile) and once its broker id was taken over."""
    return float("-inf") if lapsed or evicted else lease_deadline(renewed_at, lease_ms)


def leader_of(view: ClusterView, broker_id: int | None) -> Leader | None:
    """Where to redirect to: a live broker other than this one (this one, not leading yet: no leader yet)."""
    if broker_id is None or broker_id == view.me or broker_id not in view.live or not view.addresses.get(broker_id):
        return None
    return Leader(broker_id, view.addresses[broker_id], view.plain_addresses.get(broker_id, ""))


class Assignments:
    """The cluster's assignments as this broker last read them, kept current by the rows each look reads (those
    changed since the last one, tiered.catalog.cluster.changed_since): every row by partition, the partitions by
    assigned leader (so the per-broker counts of the spread and the orphans need no scan of every row), and the
    partitions with a handover asked. Plain data with no I/O; its one owner is the coordinator, and only `apply`,
    `replace` and `drop_topics` change it, each answering which partitions changed."""

    __slots__ = ("rows", "by_broker", "handovers", "topics")

    def __init__(self, rows: Iterable[Assignment] = ()):
        self.rows: dict[TopicPartition, Assignment] = {}
        self.by_broker: dict[int | None, set[TopicPartition]] = {}
        self.handovers: set[TopicPartition] = set()
        self.topics: Counter[str] = Counter()  # rows held per topic
        self.apply(rows)

    def apply(self, rows: Iterable[Assignment]) -> set[TopicPartition]:
        """Takes the rows read (new or changed: a row read again unchanged changes nothing)."""
        changed: set[TopicPartition] = set()
        for a in rows:
            key = TopicPartition(a.topic, a.partition)
            old = self.rows.get(key)
            if old == a:
                continue
            changed.add(key)
            if old is not None:
                self._unindex(key, old)
            else:
                self.topics[key.topic] += 1
            self.rows[key] = a
            self.by_broker.setdefault(a.leader_broker, set()).add(key)
            if a.handover_to is not None:
                self.handovers.add(key)
        return changed

    def replace(self, rows: Iterable[Assignment]) -> set[TopicPartition]:
        """A full look: every row read; a partition not among them is gone."""
        rows = list(rows)
        present = {TopicPartition(a.topic, a.partition) for a in rows}
        return self._remove([key for key in self.rows if key not in present]) | self.apply(rows)

    def drop_topics(self, topics: Iterable[str]) -> set[TopicPartition]:
        """Forgets the partitions of the topics not in `topics` (the catalog's topics now: a deleted topic's rows
        are gone, and no change version names them)."""
        gone = set(self.topics) - set(topics)
        return self._remove([key for key in self.rows if key.topic in gone]) if gone else set()

    def _remove(self, keys: Sequence[TopicPartition]) -> set[TopicPartition]:
        for key in keys:
            self._unindex(key, self.rows.pop(key))
            self.topics[key.topic] -= 1
            if not self.topics[key.topic]:
                del self.topics[key.topic]
        return set(keys)

    def _unindex(self, key: TopicPartition, old: Assignment) -> None:
        held = self.by_broker[old.leader_broker]
        held.discard(key)
        if not held:
            del self.by_broker[old.leader_broker]
        self.handovers.discard(key)

    def load(self, live: Iterable[int]) -> dict[int, int]:
        """How many partitions each live broker is assigned."""
        return {b: len(self.by_broker.get(b, ())) for b in live}


def membership(view: ClusterView) -> dict[int, tuple[bool, str, str]]:
    """What a follow of a broker's partitions depends on, per broker: whether it is live, and its endpoints."""
    return {b: (b in view.live, view.addresses.get(b, ""), view.plain_addresses.get(b, ""))
            for b in set(view.addresses) | set(view.live)}


def affected(state: Assignments, changed: Iterable[TopicPartition], before: Mapping[int, tuple[bool, str, str]],
             after: Mapping[int, tuple[bool, str, str]]) -> set[TopicPartition]:
    """The partitions a look must decide about: those whose row changed, and those assigned to a broker whose
    membership changed (it died, came back, moved its endpoint): their follows and whether they are orphans moved."""
    keys = set(changed)
    for broker in set(before) | set(after):
        if before.get(broker) != after.get(broker):
            keys.update(state.by_broker.get(broker, ()))
    return keys


def decide(view: ClusterView, leading: Mapping[TopicPartition, int], now: float) -> Decision:
    """The claims, losses, handovers and follows of one look over every assignment in the view (module docstring):
    what `decide_changes` answers about every partition."""
    state = Assignments(view.assignments)
    return decide_changes(view, state, state.rows.keys(), leading, now)


def decide_changes(view: ClusterView, state: Assignments, keys: Iterable[TopicPartition],
                   leading: Mapping[TopicPartition, int], now: float, *, claims_too: bool = True) -> Decision:
    """One look's decision, costing what changed: losses and follows of the partitions `keys` names (those whose
    row changed since the last look, and those of the brokers whose membership changed: nothing else's answer can
    have moved); claims and handovers from `state` as a whole (partitions assigned here and not led, this broker's
    share of the orphans, the handovers asked of it), whose sizes are what is in flight, not what exists, so that a
    claim refused or not yet made is asked again at every look. `view.assignments` is not read. Equal, over any
    sequence of changes, to `decide` over every row (tests/tiering/test_cluster_decision.py). Without `claims_too`,
    only the losses and follows (a look between claim batches: the spread of a failover's orphans is not redone)."""
    me = view.me
    live = view.live
    serving = not view.evicted and lease_fresh(view.renewed_at, view.lease_ms, now)
    leaders: dict[int | None, Leader | None] = {}  # leader_of per broker id, built once per broker, not per partition
    lost: list[Follow] = []
    follows: list[Follow] = []
    rows = state.rows
    for key in keys:
        a = rows.get(key)
        if a is None:
            continue  # gone with its topic
        if key in leading:
            if a.leader_epoch > leading[key]:
                lost.append(Follow(key, leader_of(view, a.leader_broker), a.hwmark_seq, a.first_available_seq))
            continue
        broker = a.leader_broker
        if broker == me or broker is None or broker not in live:
            # Assigned here but not claimed yet, or orphaned: nobody leads it this moment (0xfd, not a redirect
            # that could bounce between two brokers that each think the other leads).
            follows.append(Follow(key, None, a.hwmark_seq, a.first_available_seq))
        else:
            if broker not in leaders:
                leaders[broker] = leader_of(view, broker)
            follows.append(Follow(key, leaders[broker], a.hwmark_seq, a.first_available_seq))
    handovers: dict[TopicPartition, tuple[int, int]] = {}
    for key in state.handovers:
        a = rows[key]
        if (key in leading and a.leader_epoch <= leading[key] and a.handover_to != me
                and a.handover_to in live):
            handovers[key] = (a.handover_to, a.leader_epoch)  # type: ignore[assignment]
    claims: dict[str, dict[int, int]] = {}
    renew_first = False
    if serving and claims_too:
        # Set differences (a C loop over the partitions assigned here: a new leader with 50,000 of them looks every
        # 0.01-0.05 s during a handover, and a Python loop over them all was most of each look).
        for key in state.by_broker.get(me, set()).difference(leading):
            claims.setdefault(key.topic, {})[key.partition] = rows[key].leader_epoch
            renew_first = True
        orphans = [key for broker, held in state.by_broker.items() if broker != me and (broker is None or
                                                                                      broker not in live)
                   for key in held.difference(leading)]
        if orphans:
            for key, broker in spread(orphans, live, state.load(live)).items():
                if broker == me:
                    claims.setdefault(key.topic, {})[key.partition] = rows[key].leader_epoch
    return Decision(tuple(lost), tuple(follows), claims, handovers, renew_first)


CLAIM_BATCH = 512  # partitions per claim statement: a failover's first partitions take produce again early


def claim_batches(claims: Mapping[str, Mapping[int, int]],
                  limit: int = CLAIM_BATCH) -> list[tuple[str, dict[int, int]]]:
    """A decision's claims as (topic, {partition: epoch read}) batches of at most `limit` partitions each, topics in
    name order and partitions in order: the coordinator claims one batch per statement and lets what it claimed
    take produce before it claims the next, so that 17,000 orphans of a failover are not one long wait. Raises
    ValueError for a limit below 1."""
    if limit < 1:
        raise ValueError("a claim batch holds at least one partition")
    out: list[tuple[str, dict[int, int]]] = []
    for topic in sorted(claims):
        partitions = sorted(claims[topic].items())
        for start in range(0, len(partitions), limit):
            out.append((topic, dict(partitions[start:start + limit])))
    return out


def handover_chunks(moves: Mapping[TopicPartition, tuple[int, int]],
                    size: int) -> list[dict[TopicPartition, tuple[int, int]]]:
    """A stopping broker's moves {partition: (to broker, epoch)} as chunks of at most `size` partitions, in partition
    order (a `spread` alternates the brokers along that order, so each chunk keeps every new leader busy). Raises
    ValueError for a size below 1."""
    if size < 1:
        raise ValueError("a handover chunk holds at least one partition")
    keys = sorted(moves)
    return [{key: moves[key] for key in keys[start:start + size]} for start in range(0, len(keys), size)]


def handover_queues(moves: Mapping[TopicPartition, tuple[int, int]],
                    size: int) -> dict[int, list[dict[TopicPartition, tuple[int, int]]]]:
    """A stopping broker's moves {partition: (to broker, epoch)} per new leader, each one's as chunks of at most
    `size` partitions in partition order (`handover_chunks`): each new leader is handed its next chunk once it has
    claimed the one before (`ready_targets`), at its own pace, not at the pace of the slowest."""
    by_target: dict[int, dict[TopicPartition, tuple[int, int]]] = {}
    for key in sorted(moves):
        by_target.setdefault(moves[key][0], {})[key] = moves[key]
    return {target: handover_chunks(own, size) for target, own in sorted(by_target.items())}


def ready_targets(unclaimed: Mapping[int, Iterable[float]], pending: Iterable[int], now: float, ahead: int,
                  patience_s: float) -> list[int]:
    """The new leaders (of `pending`, those with chunks left) to hand their next chunk to now: those for which
    `may_hand_over_next` holds over the chunks given up to them and not all claimed yet (`unclaimed`: when each was
    given up), in id order."""
    return [t for t in sorted(pending) if may_hand_over_next(unclaimed.get(t, ()), now, ahead, patience_s)]


def may_hand_over_next(unclaimed: Iterable[float], now: float, ahead: int, patience_s: float) -> bool:
    """Whether a stopping broker gives up its next chunk now. `unclaimed`: when each chunk given up so far whose
    claims have not all landed was given up. At most `ahead` such chunks at a time, so that a partition waits for
    the claims of its own chunk (and of at most `ahead` - 1 before it), not for a queue of chunks its new leader has
    not reached: handed over faster than the new leaders claim, a late chunk's partitions waited for the claims of
    every chunk before them. A chunk not claimed within `patience_s` (a new leader gone or stuck) is waited for no
    longer: its partitions are claimed when they are, or taken over as orphans once that leader's lease expires."""
    return sum(1 for at in unclaimed if now - at < patience_s) < ahead


def spread(partitions: Sequence[TopicPartition], live: Iterable[int],
           load: Mapping[int, int]) -> dict[TopicPartition, int]:
    """Which live broker takes each partition: fewest leaderships first (then the lowest id), one at a time, so a
    batch lands evenly. Every broker computes the same answer from the same view."""
    brokers = sorted(set(live))
    if not brokers:
        return {}
    counts = {b: load.get(b, 0) for b in brokers}
    out: dict[TopicPartition, int] = {}
    for key in sorted(partitions):
        chosen = min(brokers, key=lambda b: (counts[b], b))
        out[key] = chosen
        counts[chosen] += 1
    return out


def plan_rebalance(assignments: Sequence[Assignment], live: Iterable[int]) -> dict[TopicPartition, int]:
    """Which partitions to move, and where, so that every live broker leads as many as the others, give or take
    one: one partition at a time from the broker leading the most to the one leading the fewest (ties: the lowest
    id), each taken from the topic the receiver leads least of, so topics spread too."""
    brokers = sorted(set(live))
    if len(brokers) < 2:
        return {}
    held: dict[int, list[TopicPartition]] = {b: [] for b in brokers}
    for a in assignments:
        if a.leader_broker in held:
            held[a.leader_broker].append(TopicPartition(a.topic, a.partition))
    moves: dict[TopicPartition, int] = {}
    while True:
        most = max(brokers, key=lambda b: (len(held[b]), -b))
        fewest = min(brokers, key=lambda b: (len(held[b]), b))
        if len(held[most]) - len(held[fewest]) <= 1:
            return moves
        topics_of_fewest = Counter(topic for topic, _ in held[fewest])
        key = min(held[most], key=lambda k: (topics_of_fewest[k[0]], k[0], -k[1]))
        held[most].remove(key)
        held[fewest].append(key)
        moves[key] = fewest


@dataclass(frozen=True, slots=True)
class Pace:
    """How soon a broker looks at the catalog again (tiered.tiering.cluster.coordinator's constants)."""

    led_s: float  # after a look whose claims were led: a stopping broker gives up its next chunk once they land
    follow_s: float  # after a look that found changes: they come in bursts
    tick_s: float  # otherwise, when nothing tells it of changes
    idle_s: float  # otherwise, when the catalog's change notices do (tiered.tiering.cluster.notices)
    expiry_margin_s: float  # looked this long after a lease's expiry, so that the look finds it expired


def next_look_in(pace: Pace, *, led: bool, moved: bool, told: bool, expiries: Iterable[float]) -> float:
    """Seconds until the next look. A broker told of every change by notices looks only when one comes, and
    otherwise at `idle_s` or just after the soonest of the other live members' leases expires (`expiries`, seconds
    from the look, by the catalog's clock), whichever is first: a lease ending is not a change anyone notifies,
    and a failover must not wait an idle tick longer."""
    if led:
        return pace.led_s
    if moved:
        return pace.follow_s
    if not told:
        return pace.tick_s
    return min(pace.idle_s, max(0.0, min(expiries, default=pace.idle_s)) + pace.expiry_margin_s)
