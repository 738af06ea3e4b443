"""Brokers: who is running, where, and when it was last heard from (what the reconciler reads). Brokers register and
renew their leases through tiered.catalog.cluster, the only writer of these rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from tiered.catalog.engine import Catalog
from tiered.catalog.models import BrokerModel


@dataclass(frozen=True, slots=True)
class BrokerRow:
    broker_id: int
    address: str
    started_at: datetime
    heartbeat_at: datetime


def list_brokers(cat: Catalog) -> list[BrokerRow]:
    columns = (BrokerModel.broker_id, BrokerModel.address, BrokerModel.started_at, BrokerModel.heartbeat_at)
    with cat.read() as conn:
        return [BrokerRow(*r) for r in conn.execute(select(*columns).order_by(BrokerModel.broker_id))]
