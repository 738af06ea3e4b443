"""Cleanup of abandoned copies: remote segments left in COPY_STARTED by a copy that can never finish
(docs/architecture.md, "State machines"), through DELETE_STARTED -> objects deleted -> DELETE_FINISHED.

A copy can never finish when its row was started under a leader epoch older than the partition's (its
segment_copy_finished would be refused: a fenced broker's copy, or a crashed one's that nobody redid). Left alone,
such a row and its objects stay forever: the catalog knows the objects, so the reconciler keeps them, and remote
retention expires readable segments only. The leader of the partition cleans them, in its remote retention pass.
A row is cleaned only when all of these hold (checked again under the partition's lock by
segment_copy_abandoned, except the last):
- this broker leads the partition at its current epoch, and the row's epoch is older;
- the row was last touched more than the grace period ago, so no upload of it is in flight however slow;
- this broker's copier is not about to copy the same base (its queue): that copy takes the row over itself,
  COPY_STARTED -> COPY_STARTED under the current epoch, and then finishes.

Every later copy of the same base still works: while the row is DELETE_STARTED a copy of it is refused and tried
again later (so the objects deleted are never a new copy's, even under the same keys), and once DELETE_FINISHED a
copy takes the row over (segment_copy_started). Nothing readable is touched: COPY_STARTED rows are never read, their
object keys are unique to them, and the first available seq and the block runs do not move.

One pass, each step safe to repeat after a crash: deletions left in DELETE_STARTED are finished first (objects
deleted, DELETE_FINISHED), then each abandoned row found in one page of the partition's segment rows (the cursor
carries over between passes, so a pass costs at most `page` rows however long the history) goes DELETE_STARTED,
its `.ilog` and `.index` objects are deleted, DELETE_FINISHED. Catalog and store calls have the deadlines of
AsyncCatalog and ObjectStore.

Left over: an upload of a fenced broker that retries for longer than the grace period and lands after the cleanup
puts back an object the DELETE_FINISHED row still names, so the reconciler keeps it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable

from tiered.catalog import SegmentState
from tiered.catalog import segments as catalog_segments
from tiered.catalog.blocks import DEFAULT_DELETE_GRACE
from tiered.catalog.segments import SegmentRow
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.segments.remote_retention import delete_objects, finish_interrupted_deletions
from tiered.tiering.objects.store import ObjectStore

log = logging.getLogger("tiered.tiering")


@dataclass
class CleanupReport:
    topic: str
    partition: int
    deleted: list[SegmentRow] = field(default_factory=list)  # abandoned copies whose objects this pass deleted
    finished: list[SegmentRow] = field(default_factory=list)  # DELETE_STARTED leftovers of an interrupted pass
    next_after_base_seq: int = 0  # where the next pass's page starts; 0: from the partition's first segment


async def clean_abandoned_copies(
    store: ObjectStore,
    catalog: AsyncCatalog,
    topic: str,
    partition: int,
    leader_epoch: int,
    now: datetime,
    *,
    will_copy: Callable[[int], bool],
    after_base_seq: int = 0,
    grace: timedelta = DEFAULT_DELETE_GRACE,
    page: int = 200,
    limit: int = 100,
) -> CleanupReport:
    """One bounded cleanup pass over one partition led here at `leader_epoch` (module docstring).

    `will_copy(base)` says whether this broker's copier is about to copy that base. Reads one page of at most
    `page` segment rows after `after_base_seq`; finishes and deletes at most `limit` each. A StaleEpoch (the
    partition moved), StoreError or CatalogUnavailable propagates; what was done stays consistent and the next pass
    (of whichever broker leads) continues it."""
    if page < 1 or limit < 1:
        raise ValueError("page and limit must be at least 1")
    report = CleanupReport(topic, partition)
    report.finished = await finish_interrupted_deletions(store, catalog, topic, partition, now, limit=limit)
    rows = await catalog.read(catalog_segments.list_segments, topic, partition, after_base_seq=after_base_seq,
                              limit=page)
    report.next_after_base_seq = rows[-1].base_seq if len(rows) == page else 0
    older_than = now - grace
    for row in rows:
        if len(report.deleted) == limit:
            report.next_after_base_seq = row.base_seq - 1  # the rest of this page comes next time
            break
        if not (row.state == SegmentState.COPY_STARTED and row.leader_epoch < leader_epoch
                and row.updated_at <= older_than and not will_copy(row.base_seq)):
            continue
        started = await catalog.write(catalog_segments.segment_copy_abandoned, topic, partition, row.base_seq,
                                      leader_epoch, older_than=older_than, now=now)
        if started is None:
            continue  # taken over by a new copy (or finished) since the page was read
        await delete_objects(store, started)
        await catalog.write(catalog_segments.segment_delete_finished, topic, partition, row.base_seq, now=now)
        report.deleted.append(started)
        log.info("deleted abandoned copy of %s/%d segment %d-%d (epoch %d, started %s; partition at epoch %d): "
                 "%s, %s", topic, partition, started.base_seq, started.last_seq, started.leader_epoch,
                 row.updated_at.isoformat(), leader_epoch, started.object_key, started.index_object_key)
    return report
