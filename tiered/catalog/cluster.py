"""Several brokers as one service: membership by lease, and who leads which partition (issue: cluster).

Membership: every broker registers with its advertised TANK endpoint and its HTTP endpoint, and renews a lease.
Lease times are the catalog's clock (PostgreSQL's clock_timestamp(), not the broker's), so clock skew between hosts
cannot make a broker look alive, or dead, to the others when it is not. A broker's row carries an `incarnation`
(a random token per process): a second process under the same broker id takes the row over, and the first one's
renewals fail from then on (it fences itself).

Leadership: `partitions.leader_broker` is the broker that should lead; the one that does lead is the one holding the
partition's current epoch (tiered.catalog.partitions.claim_leadership). A partition is assigned by writing
`leader_broker` (topic creation, a handover, a takeover decision) and taken by a claim, compare-and-set on the epoch
the claimer saw, so that two brokers deciding at once cannot both win.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import Connection, func, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite

from tiered.catalog.arrays import RowSource, statement
from tiered.catalog.changes import take_version
from tiered.catalog.engine import Catalog, utcnow
from tiered.catalog.errors import CatalogError
from tiered.catalog.models import BrokerModel, ClusterChangeModel, PartitionModel
from tiered.catalog.partitions import lock_partitions
from tiered.catalog.topics import TopicRow, topic_rows


class SingleBrokerCatalog(CatalogError):
    """A second live broker on a catalog that cannot coordinate several (SQLite)."""


@dataclass(frozen=True, slots=True)
class Member:
    broker_id: int
    advertised: str  # host:port of its TANK listener, as clients should reach it
    http_endpoint: str
    live: bool  # its lease has not expired, by the catalog's clock
    lease_expires_at: datetime | None
    advertised_plain: str = ""  # host:port at which plaintext clients reach it ("": none known, use `advertised`)


class Assignment(NamedTuple):
    """A tuple, so that a look at 100,000 partitions builds its rows in C (`_make`), not through an __init__ each."""

    topic: str
    partition: int
    leader_broker: int | None
    leader_epoch: int
    hwmark_seq: int
    first_available_seq: int
    handover_to: int | None  # asked of the leader by `tiered cluster rebalance`


def _now(cat: Catalog, plus: timedelta = timedelta(0)):
    """The catalog's clock (plus `plus`): PostgreSQL's, the same for every broker; a SQLite catalog is one host's."""
    if cat.backend == "postgresql":
        return func.clock_timestamp() + plus if plus else func.clock_timestamp()
    return literal(utcnow() + plus, BrokerModel.lease_expires_at.type)


def _still_running(process: str) -> bool:
    """Whether the process that holds a lease on a SQLite catalog still runs. A SQLite catalog is one host's file,
    so its brokers are processes of this host: one that was killed left a live lease behind, and is not in the way.
    A process named on another host (the file on a shared disk: unsupported) counts as running."""
    host, _, pid = process.rpartition(":")
    if not pid.isdigit():
        return True
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def register(cat: Catalog, broker_id: int, incarnation: str, advertised: str, http_endpoint: str,
             lease_ms: int, *, now: datetime | None = None, advertised_plain: str = "") -> None:
    """Records this process as broker `broker_id` with a fresh lease; takes over the row of an earlier process with
    the same id (whose renewals fail from now on). On SQLite, refuses (SingleBrokerCatalog) while another broker id
    holds a live lease: several brokers need PostgreSQL."""
    lease = timedelta(milliseconds=lease_ms)
    with cat.write() as conn:
        if cat.backend == "sqlite":
            others = conn.execute(
                select(BrokerModel.broker_id, BrokerModel.process).where(BrokerModel.broker_id != broker_id,
                                                                         BrokerModel.lease_expires_at > _now(cat))
            ).all()
            running = sorted(b for b, process in others if _still_running(process))
            if running:
                raise SingleBrokerCatalog(
                    f"broker(s) {running} already serve this SQLite catalog: a SQLite catalog serves one broker; "
                    f"several brokers need a PostgreSQL catalog (--catalog postgresql+psycopg://...)")
        values = {"address": advertised, "advertised": advertised, "advertised_plain": advertised_plain,
                  "http_endpoint": http_endpoint,
                  "incarnation": incarnation, "started_at": utcnow(now), "heartbeat_at": utcnow(now),
                  "lease_expires_at": _now(cat, lease), "process": f"{socket.gethostname()}:{os.getpid()}"}
        insert = postgresql.insert if cat.backend == "postgresql" else sqlite.insert
        statement = insert(BrokerModel).values(broker_id=broker_id, **values)
        conn.execute(statement.on_conflict_do_update(index_elements=[BrokerModel.broker_id], set_=values))


def renew(cat: Catalog, broker_id: int, incarnation: str, lease_ms: int, *, now: datetime | None = None) -> bool:
    """Extends this process's lease by `lease_ms` from now (the catalog's now). False when another process took the
    broker id over: this one must stop leading at once."""
    with cat.write() as conn:
        done = conn.execute(
            update(BrokerModel)
            .where(BrokerModel.broker_id == broker_id, BrokerModel.incarnation == incarnation)
            .values(lease_expires_at=_now(cat, timedelta(milliseconds=lease_ms)), heartbeat_at=utcnow(now))
        )
    return done.rowcount == 1


def leave(cat: Catalog, broker_id: int, incarnation: str) -> None:
    """Ends this process's lease now (a graceful stop, after its handovers)."""
    with cat.write() as conn:
        conn.execute(
            update(BrokerModel)
            .where(BrokerModel.broker_id == broker_id, BrokerModel.incarnation == incarnation)
            .values(lease_expires_at=_now(cat))
        )


def members(cat: Catalog) -> list[Member]:
    with cat.read() as conn:
        rows = conn.execute(
            select(BrokerModel.broker_id, BrokerModel.advertised, BrokerModel.http_endpoint,
                   (BrokerModel.lease_expires_at > _now(cat)).label("live"), BrokerModel.lease_expires_at,
                   BrokerModel.advertised_plain)
            .order_by(BrokerModel.broker_id)
        ).all()
    return [Member(r.broker_id, r.advertised or "", r.http_endpoint or "", bool(r.live), r.lease_expires_at,
                   r.advertised_plain or "") for r in rows]


@dataclass(frozen=True, slots=True)
class Look:
    """One tick's look at the catalog: the members, and the change counter (migration 0006; None: no row), and the
    catalog's clock when it was read (what the leases are compared with)."""

    members: tuple[Member, ...]
    changes: int | None
    now: datetime | None = None

    def expiries(self, broker_id: int) -> list[float]:
        """Seconds from this look until the lease of each live member other than `broker_id` expires, by the
        catalog's clock: when the next look would find one of them gone."""
        if self.now is None:
            return []
        return [(mb.lease_expires_at - self.now).total_seconds() for mb in self.members
                if mb.live and mb.broker_id != broker_id and mb.lease_expires_at is not None]


def look(cat: Catalog) -> Look:
    """The members and the change counter, in one small statement: what a broker reads every tick. The assignments
    are re-read only when the counter moved or the members changed (tiered.tiering.cluster.coordinator)."""
    changes = select(ClusterChangeModel.version).where(ClusterChangeModel.id == 1).scalar_subquery()
    now = _now(cat)
    with cat.read() as conn:
        rows = conn.execute(
            select(BrokerModel.broker_id, BrokerModel.advertised, BrokerModel.http_endpoint,
                   (BrokerModel.lease_expires_at > now).label("live"), BrokerModel.lease_expires_at,
                   BrokerModel.advertised_plain, changes.label("changes"),
                   now.label("now") if cat.backend == "postgresql" else literal(None).label("now"))
            .order_by(BrokerModel.broker_id)
        ).all()
        if not rows:
            return Look((), conn.execute(select(changes)).scalar())
    # On SQLite the catalog's clock is this host's, and `now` the same value the liveness was compared with.
    taken = rows[0].now if cat.backend == "postgresql" else now.value
    return Look(tuple(Member(r.broker_id, r.advertised or "", r.http_endpoint or "", bool(r.live),
                             r.lease_expires_at, r.advertised_plain or "") for r in rows), rows[0].changes, taken)


def assignment(cat: Catalog, topic: str, partition: int) -> Assignment | None:
    """One partition's assignment and committed bounds (a follower asked for what its read needs)."""
    query = select(PartitionModel.topic, PartitionModel.partition, PartitionModel.leader_broker,
                   PartitionModel.leader_epoch, PartitionModel.hwmark_seq, PartitionModel.first_available_seq,
                   PartitionModel.handover_to).where(PartitionModel.topic == topic,
                                                     PartitionModel.partition == partition)
    with cat.read() as conn:
        row = conn.execute(query).first()
    return Assignment(*row) if row is not None else None


def changed_since(cat: Catalog, version: int) -> list[Assignment]:
    """The assignments of the partitions changed since the counter stood at `version`: a range scan of
    `ix_partitions_change_version`, so a look costs what changed, not how many partitions exist. Read the counter
    first (`look`), then this: every change of a version up to the counter read is here (versions are in commit
    order, tiered.catalog.changes); later ones may be too."""
    with cat.read() as conn:
        return _changed(conn, version)


def _changed(conn: Connection, version: int) -> list[Assignment]:
    query = select(PartitionModel.topic, PartitionModel.partition, PartitionModel.leader_broker,
                   PartitionModel.leader_epoch, PartitionModel.hwmark_seq, PartitionModel.first_available_seq,
                   PartitionModel.handover_to).where(PartitionModel.change_version > version)
    return list(map(Assignment._make, conn.execute(query)))


# claimed_since's rows: each partition waited for, with the epoch it had.
WAITING = RowSource("w", (("topic", "text"), ("partition", "integer"), ("leader_epoch", "bigint")))
_CLAIMED_SINCE = """SELECT p.topic, p."partition", p.leader_broker, p.leader_epoch, p.hwmark_seq, p.first_available_seq,
       p.handover_to
FROM {w} JOIN partitions AS p ON p.topic = w.topic AND p."partition" = w."partition"
WHERE p.leader_epoch > w.leader_epoch
"""


def claimed_since(cat: Catalog, epochs: Mapping[tuple[str, int], int]) -> list[Assignment]:
    """The assignments of the partitions of `epochs` whose epoch has moved past the one given (claimed since), in one
    statement whatever their number: what a handover or a topic creation waits for, without reading the rest."""
    if not epochs:
        return []
    rows = [(topic, partition, epoch) for (topic, partition), epoch in sorted(epochs.items())]
    with cat.read() as conn:
        return [Assignment(*r) for r in conn.execute(statement(conn.dialect.name, _CLAIMED_SINCE, WAITING),
                                                     WAITING.params(rows))]


def leaderships(cat: Catalog) -> dict[int, int]:
    """How many partitions each broker is assigned: one count per broker, whatever the number of partitions (what
    a placement needs, without reading every assignment)."""
    with cat.read() as conn:
        return dict(conn.execute(select(PartitionModel.leader_broker, func.count())
                                 .where(PartitionModel.leader_broker.is_not(None))
                                 .group_by(PartitionModel.leader_broker)).all())


def assignments(cat: Catalog, topic: str | None = None) -> list[Assignment]:
    """Every partition's assigned leader and epoch, with its committed bounds, in (topic, partition) order."""
    with cat.read() as conn:
        return _assignments(conn, topic)


def _assignments(conn: Connection, topic: str | None = None) -> list[Assignment]:
    query = select(PartitionModel.topic, PartitionModel.partition, PartitionModel.leader_broker,
                   PartitionModel.leader_epoch, PartitionModel.hwmark_seq, PartitionModel.first_available_seq,
                   PartitionModel.handover_to)
    if topic is not None:
        query = query.where(PartitionModel.topic == topic)
    return list(map(Assignment._make, conn.execute(query.order_by(PartitionModel.topic, PartitionModel.partition))))


class FullLook(NamedTuple):
    """What a tick reads when the change counter or the members moved: every topic and the partitions' assignments
    (every partition's, or those changed since a version), from one snapshot, so that every assignment's topic is
    among the topics."""

    topics: list[TopicRow]
    assignments: list[Assignment]


def full_look(cat: Catalog) -> FullLook:
    """Every topic and every assignment in one snapshot (two statements). Read apart, a topic created between them
    had assignments whose topic the broker was not told of yet: it decided about partitions its server did not have
    (tiered.tiering.cluster.coordinator)."""
    with cat.snapshot() as conn:
        return FullLook(topic_rows(conn), _assignments(conn))


def changed_look(cat: Catalog, version: int) -> FullLook:
    """Every topic and the assignments changed since `version` (changed_since) in one snapshot, for the reason
    full_look gives: a topic created between two separate reads would have changed rows but no topic yet."""
    with cat.snapshot() as conn:
        return FullLook(topic_rows(conn), _changed(conn, version))


# assign_moves' rows: each partition's new leader and, when `checked` is 1, the leader and epoch it must still have.
ASSIGNED = RowSource("a", (("topic", "text"), ("partition", "integer"), ("leader_broker", "integer"),
                           ("checked", "integer"), ("was_leader", "integer"), ("was_epoch", "bigint")))
_ASSIGN = """UPDATE partitions AS p SET leader_broker = a.leader_broker, change_version = :version
FROM {a} WHERE p.topic = a.topic AND p."partition" = a."partition"
  AND (a.checked = 0 OR (p.leader_epoch = a.was_epoch
                         AND (p.leader_broker = a.was_leader OR (a.was_leader IS NULL AND p.leader_broker IS NULL))))
RETURNING {returned}
"""
# SQLite's RETURNING sees only the updated table, by its name, not its alias.
_RETURNED = {"postgresql": 'p.topic, p."partition"', "sqlite": 'topic, "partition"'}


def assign_moves(cat: Catalog, leaders: Mapping[tuple[str, int], int | None], *,
                 expected: Mapping[tuple[str, int], tuple[int | None, int]] | None = None) -> list[tuple[str, int]]:
    """Writes the partitions' assigned leaders (the epoch is left to the claim that follows), across topics, in one
    transaction of three statements whatever their number: the rows locked in order (as every transaction that
    locks several partitions), one update, one count of the change (tiered.catalog.changes). So the new leaders see
    every move at their next look, not topic after topic. With `expected` {key: (leader, epoch)}, a partition moves
    only while it is still as expected (a handover moves only what its leader still holds). Returns the partitions
    assigned, in order."""
    if not leaders:
        return []
    expected = expected or {}
    rows = [(*key, leader, 1 if key in expected else 0, *(expected[key] if key in expected else (None, 0)))
            for key, leader in sorted(leaders.items())]
    with cat.write() as conn:
        lock_partitions(conn, leaders, missing_ok=True)
        backend = conn.dialect.name
        update = statement(backend, _ASSIGN.replace("{returned}", _RETURNED[backend]), ASSIGNED)
        done = sorted((topic, partition) for topic, partition in
                      conn.execute(update, {"version": take_version(conn), **ASSIGNED.params(rows)}))
    return done


def assign(cat: Catalog, topic: str, leaders: Mapping[int, int | None], *,
           expected: Mapping[int, tuple[int | None, int]] | None = None) -> list[int]:
    """assign_moves for the partitions of one topic, by number."""
    done = assign_moves(cat, {(topic, p): leader for p, leader in leaders.items()},
                        expected={(topic, p): e for p, e in (expected or {}).items()})
    return [p for _, p in done]


def request_handover(cat: Catalog, topic: str, partition: int, to_broker: int) -> bool:
    """Asks the partition's leader to hand it over to `to_broker` (it does so at its next tick, cleanly: it stops
    taking produces, commits what it holds, then assigns the partition). False if the partition does not exist."""
    with cat.write() as conn:
        done = conn.execute(
            update(PartitionModel)
            .where(PartitionModel.topic == topic, PartitionModel.partition == partition)
            .values(handover_to=to_broker)
        )
    return done.rowcount == 1
