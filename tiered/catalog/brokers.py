"""Brokers: who is running, where, and when it was last heard from."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite

from tiered.catalog.engine import Catalog, utcnow
from tiered.catalog.errors import UnknownBroker
from tiered.catalog.models import BrokerModel


@dataclass(frozen=True, slots=True)
class BrokerRow:
    broker_id: int
    address: str
    started_at: datetime
    heartbeat_at: datetime


def register_broker(cat: Catalog, broker_id: int, address: str, *, now: datetime | None = None) -> BrokerRow:
    """Records a broker (re)starting at `address`: inserts its row, or replaces address and times."""
    row = BrokerRow(broker_id, address, utcnow(now), utcnow(now))
    dialect_insert = postgresql.insert if cat.backend == "postgresql" else sqlite.insert
    values = {"address": address, "started_at": row.started_at, "heartbeat_at": row.heartbeat_at}
    statement = dialect_insert(BrokerModel).values(broker_id=broker_id, **values)
    with cat.write() as conn:
        conn.execute(statement.on_conflict_do_update(index_elements=[BrokerModel.broker_id], set_=values))
    return row


def heartbeat(cat: Catalog, broker_id: int, *, now: datetime | None = None) -> None:
    """Marks the broker alive at `now`. Raises UnknownBroker if it never registered."""
    with cat.write() as conn:
        done = conn.execute(update(BrokerModel).where(BrokerModel.broker_id == broker_id).values(heartbeat_at=utcnow(now)))
        if done.rowcount == 0:
            raise UnknownBroker(broker_id)


def list_brokers(cat: Catalog) -> list[BrokerRow]:
    columns = (BrokerModel.broker_id, BrokerModel.address, BrokerModel.started_at, BrokerModel.heartbeat_at)
    with cat.read() as conn:
        return [BrokerRow(*r) for r in conn.execute(select(*columns).order_by(BrokerModel.broker_id))]
