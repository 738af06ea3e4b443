"""The cost meter's rows (object_usage, migration 0009): what brokers counted, and what the bucket holds per topic.

A broker adds what its meter counted since its last flush to its rows of the current hour (`add_usage`); `usage`
sums every broker's rows of a window of whole hours; `bytes_stored` is what the bucket holds now, per topic, as the
catalog knows it. Measures are the meter's operations (request counts), `bytes_written` / `bytes_read` (bytes through the store)
and `bytes_ingested` (records committed in blocks).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from tiered.catalog.blocks import pending_runs
from tiered.catalog.engine import Catalog, utcnow
from tiered.catalog.models import BlockModel, BlockRunModel, BrokerModel, ObjectUsageModel, PartitionModel
from tiered.catalog.states import BlockState

BYTES_WRITTEN = "bytes_written"
BYTES_READ = "bytes_read"
BYTES_INGESTED = "bytes_ingested"  # records committed in blocks: what producers sent, once (a segment copy rewrites it)
CATALOG_WIDE = "(catalog)"  # the meter's topic of catalog-wide work (tiered.tiering.objects.meter.CATALOG_WIDE)
KEEP = timedelta(days=400)  # rows older than this are dropped by the next flush: a year and a month of history


def hour_of(when: datetime) -> datetime:
    return when.replace(minute=0, second=0, microsecond=0)


def add_usage(cat: Catalog, broker_id: int, amounts: Mapping[tuple[str, str], float], *,
              now: datetime | None = None) -> None:
    """Adds `amounts` ((topic, measure) -> amount) to the broker's rows of the current hour, in one transaction, and
    drops rows older than KEEP."""
    hour = hour_of(utcnow(now))
    rows = [{"hour": hour, "broker_id": broker_id, "topic": topic, "measure": measure, "amount": float(amount)}
            for (topic, measure), amount in sorted(amounts.items()) if amount]
    with cat.write() as conn:
        if rows:
            insert = postgresql.insert if cat.backend == "postgresql" else sqlite.insert
            statement = insert(ObjectUsageModel)
            conn.execute(statement.on_conflict_do_update(
                index_elements=[ObjectUsageModel.hour, ObjectUsageModel.broker_id, ObjectUsageModel.topic,
                                ObjectUsageModel.measure],
                set_={"amount": ObjectUsageModel.amount + statement.excluded.amount}), rows)
        conn.execute(delete(ObjectUsageModel).where(ObjectUsageModel.hour < hour - KEEP))


def usage(cat: Catalog, since: datetime | None) -> dict[tuple[str, str], float]:
    """(topic, measure) -> amount summed over every broker, from the hour holding `since` on (None: all of it)."""
    query = select(ObjectUsageModel.topic, ObjectUsageModel.measure, func.sum(ObjectUsageModel.amount))
    if since is not None:
        query = query.where(ObjectUsageModel.hour >= hour_of(since))
    with cat.read() as conn:
        rows = conn.execute(query.group_by(ObjectUsageModel.topic, ObjectUsageModel.measure)).all()
    return {(topic, measure): float(amount) for topic, measure, amount in rows}


def bytes_stored(cat: Catalog) -> dict[str, int]:
    """Bytes in the bucket per topic now: its readable remote segments (object and index) and its committed block
    runs. The rest of the blocks (headers, footers, and blocks waiting to be swept) is CATALOG_WIDE."""
    stored: dict[str, int] = defaultdict(int)
    with cat.snapshot() as conn:  # one snapshot: a run is counted once, expanded or not
        for topic, size in conn.execute(
                select(PartitionModel.topic, func.sum(PartitionModel.remote_bytes)).group_by(PartitionModel.topic)):
            stored[topic] += int(size or 0)
        runs = 0
        for topic, size in conn.execute(
                select(BlockRunModel.topic, func.sum(BlockRunModel.length_bytes)).group_by(BlockRunModel.topic)):
            stored[topic] += int(size or 0)
            runs += int(size or 0)
        for pending in pending_runs(conn):  # the unexpanded blocks' runs (tiered.catalog.blocks): a handful of rows
            stored[pending.run.topic] += pending.run.length_bytes
            runs += pending.run.length_bytes
        blocks = conn.execute(select(func.sum(BlockModel.size_bytes)).where(
            BlockModel.state.in_([BlockState.COMMITTED, BlockState.DELETING]))).scalar()
    if (rest := int(blocks or 0) - runs) > 0:
        stored[CATALOG_WIDE] += rest
    return dict(stored)


def live_since(cat: Catalog, now: datetime | None = None) -> datetime | None:
    """When the longest-running live broker started (None: no broker is live): the default window of `tiered
    cost`, 'since the brokers started'."""
    with cat.read() as conn:
        return conn.execute(select(func.min(BrokerModel.started_at)).where(
            BrokerModel.lease_expires_at > utcnow(now))).scalar()
