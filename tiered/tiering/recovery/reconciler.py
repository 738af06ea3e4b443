"""Deletion in two phases, and the orphan reconciler (docs/architecture.md, data path step 8).

Three bounded passes, each taking a store, a catalog and a `now` (tests pass a fake clock):

- `sweep_deleted_blocks`: the second phase of a block's deletion. Blocks marked `deleting` (all their runs pruned,
  or abandoned) whose `delete_after` has passed: delete the objects, then the rows. The object goes first, so a
  crash in between leaves a row whose object is gone, which the next sweep deletes again harmlessly; the other
  order could leave an object nobody knows (the reconciler would then find it).
- `abandon_stale_pending`: intent rows (`pending`) whose commit will never happen. A pending block is stale when it
  is older than the grace period AND its broker cannot still commit it: the broker is unknown, has restarted since
  the block was created (a new incarnation re-uploads the records past the catalog's high-water mark in new
  blocks), or has not heartbeated for the grace period. A live broker retries a commit for as long as it runs, so
  its pending block is never taken from under it, however old. Stale blocks become `deleting` (no run references
  them: abandon_block checks), and the sweeper removes their objects after another grace period.
- `reconcile`: one page of the bucket listing. An object with one of our key formats (tiered.tiering.objects.keys) that
  the catalog does not know, as a block or as a remote segment or its index, and that is older than the grace
  period, is an upload whose catalog record never happened (or was lost): it is deleted. A known object, a young
  one (its intent row may be in flight: intent rows are written before the PUT, but the catalog is read after the
  listing) and an object that is not ours are never touched. Inkless leaks such objects forever; we do not.

The grace period must exceed any cache of catalog lookups and any upload in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import brokers as catalog_brokers
from tiered.catalog.blocks import DEFAULT_DELETE_GRACE, BlockRow
from tiered.catalog.errors import UnknownBlock
from tiered.tiering.objects import keys
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.objects.store import ObjectInfo, ObjectStore
from tiered.tiering.objects.meter import CATALOG


@dataclass
class ReconcileReport:
    listed: int  # objects listed on this page
    deleted: list[str] = field(default_factory=list)  # orphan object keys deleted
    next_start_after: str | None = None  # where the next page starts; None: the listing reached the end


def is_our_key(object_key: str) -> bool:
    """Whether the key has one of the formats tiered writes (a block, a remote segment or its index)."""
    return (
        keys.parse_block_key(object_key) is not None
        or keys.parse_segment_key(object_key) is not None
        or keys.parse_segment_index_key(object_key) is not None
    )


async def reconcile(
    store: ObjectStore,
    catalog: AsyncCatalog,
    now: datetime,
    *,
    grace: timedelta = DEFAULT_DELETE_GRACE,
    start_after: str | None = None,
    limit: int = 1000,
) -> ReconcileReport:
    """Lists at most `limit` objects after `start_after` and deletes the orphans among them (module docstring).

    Pass `next_start_after` back to continue; None means the end of the bucket was reached (start over later).
    One LIST page, one catalog query per 500 keys, one DeleteObjects call.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    listed: list[ObjectInfo] = [info async for info in
                                store.list("", start_after=start_after, limit=limit, attribution=CATALOG)]
    report = ReconcileReport(len(listed))
    if len(listed) == limit:
        report.next_start_after = listed[-1].object_key
    old_enough = now - grace
    candidates = [i for i in listed if is_our_key(i.object_key) and i.last_modified < old_enough]
    if not candidates:
        return report
    known = await catalog.read(catalog_blocks.known_object_keys, [i.object_key for i in candidates])
    orphans = [i.object_key for i in candidates if i.object_key not in known]
    if orphans:
        await store.delete_many(orphans, attribution=CATALOG)
        report.deleted = orphans
    return report


async def sweep_deleted_blocks(store: ObjectStore, catalog: AsyncCatalog, now: datetime, limit: int = 500) -> list[BlockRow]:
    """Deletes the objects, then the rows, of at most `limit` blocks `deleting` whose delete_after <= now.
    Returns the blocks swept, oldest delete_after first."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    due = await catalog.read(catalog_blocks.blocks_to_sweep, now, limit)
    if due:
        await store.delete_many([b.object_key for b in due], attribution=CATALOG)
        await catalog.write(catalog_blocks.delete_block_rows, [b.block_id for b in due])
    return due


async def abandon_stale_pending(
    catalog: AsyncCatalog, now: datetime, *, grace: timedelta = DEFAULT_DELETE_GRACE, limit: int = 100
) -> list[BlockRow]:
    """Marks `deleting` at most `limit` pending blocks older than `grace` whose broker cannot commit them any more
    (module docstring). Returns the blocks abandoned; one whose commit landed meanwhile is left as it is."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    stale = await catalog.read(catalog_blocks.pending_blocks_older_than, now - grace, limit)
    if not stale:
        return []
    # The brokers table holds one row per broker id: small, read whole.
    brokers = {b.broker_id: b for b in await catalog.read(catalog_brokers.list_brokers)}
    abandoned: list[BlockRow] = []
    for block in stale:
        broker = brokers.get(block.broker_id)
        may_still_commit = (
            broker is not None and broker.started_at <= block.created_at and broker.heartbeat_at >= now - grace
        )
        if may_still_commit:
            continue
        try:
            marked = await catalog.write(catalog_blocks.abandon_block, block.block_id, grace=grace,
                                             now=now)
        except UnknownBlock:
            continue  # swept or rebuilt meanwhile
        if marked:
            abandoned.append(block)
    return abandoned
