"""Topics: creation (with their partitions rows), listing, configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, exc, insert, select, update

from tiered.catalog.arrays import RowSource, statement
from tiered.catalog.changes import take_version
from tiered.catalog.engine import Catalog, utcnow
from tiered.catalog.errors import TopicExists, UnknownTopic
from tiered.catalog.models import TopicModel

MAX_PARTITIONS = 65535  # partition ids are u16 on TANK's wire


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    partitions: int
    config_text: str
    created_at: datetime


_COLUMNS = (TopicModel.name, TopicModel.partitions, TopicModel.config_text, TopicModel.created_at)
# A new topic's partitions rows, in one statement however many (tiered.catalog.arrays): 4,096 rows as 4,096 sets
# of parameters cost a tenth of a second on PostgreSQL.
NEW_PARTITIONS = RowSource("n", (("partition", "integer"), ("leader_broker", "integer")))
_INSERT_PARTITIONS = """INSERT INTO partitions (topic, "partition", leader_broker, change_version)
SELECT :topic, n."partition", n.leader_broker, :version FROM {n}
"""


def create_topic(
    cat: Catalog, name: str, partitions: int, config_text: str = "", *, now: datetime | None = None,
    leaders: Mapping[int, int] | None = None,
) -> TopicRow:
    """Creates the topic and its partitions rows (0..partitions-1) in one transaction, each assigned to the broker
    `leaders` names (none: to whoever claims it first). Raises TopicExists."""
    if not name:
        raise ValueError("a topic needs a name")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be 1..{MAX_PARTITIONS}, not {partitions}")
    row = TopicRow(name, partitions, config_text, utcnow(now))
    try:
        with cat.write() as conn:
            conn.execute(
                insert(TopicModel).values(
                    name=name, partitions=partitions, config_text=config_text, created_at=row.created_at
                )
            )
            assigned = leaders or {}
            # One change version for every row (tiered.catalog.changes): the brokers' looks read them as changed.
            conn.execute(statement(conn.dialect.name, _INSERT_PARTITIONS, NEW_PARTITIONS),
                         {"topic": name, "version": take_version(conn), **NEW_PARTITIONS.params([(p, assigned.get(p)) for p in range(partitions)])})
    except exc.IntegrityError as error:
        # The only unique key a new topic can collide on is its name.
        raise TopicExists(name) from error
    return row


def list_topics(cat: Catalog) -> list[TopicRow]:
    with cat.read() as conn:
        return topic_rows(conn)


def topic_rows(conn: Connection) -> list[TopicRow]:
    """Every topic, in name order, in the caller's transaction (tiered.catalog.cluster.full_look: in one snapshot
    with the assignments)."""
    return [TopicRow(*r) for r in conn.execute(select(*_COLUMNS).order_by(TopicModel.name))]


def get_topic(cat: Catalog, name: str) -> TopicRow | None:
    with cat.read() as conn:
        r = conn.execute(select(*_COLUMNS).where(TopicModel.name == name)).first()
    return TopicRow(*r) if r else None


def update_topic_config(cat: Catalog, name: str, config_text: str) -> None:
    """Replaces the topic's configuration text. Raises UnknownTopic."""
    with cat.write() as conn:
        done = conn.execute(update(TopicModel).where(TopicModel.name == name).values(config_text=config_text))
        if done.rowcount == 0:
            raise UnknownTopic(name)
