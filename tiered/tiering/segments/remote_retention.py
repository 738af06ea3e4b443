"""Remote retention: remote segments expire by `remote.retention.secs` and `remote.retention.bytes`
(docs/architecture.md, data path step 7), through DELETE_STARTED -> objects deleted -> DELETE_FINISHED.

Which segments expire (tiered.catalog.segments.segments_for_remote_retention): the oldest readable ones, as a
prefix of the partition's history, while
- `freeze_ts + remote.retention.secs < now`. The age counts from the segment's freeze time (TANK's freezeTS, when
  it rolled), not from its newest message timestamp: timestamps are set by producers and may be 0 or far off,
  while the freeze time is the broker's own clock, the one TANK's `log.retention.secs` uses for local segments;
- or the partition's COPY_FINISHED bytes (objects and indexes) exceed `remote.retention.bytes`.
0 disables a limit, as for every TANK retention key.

One pass, in this order, each step safe to repeat after a crash:
1. Segments left in DELETE_STARTED by an interrupted pass are finished first: objects deleted, DELETE_FINISHED.
2. The partition's first available seq moves past the expired segments (to the seq after the last expired one, or
   the base of the next remote segment when that one answers for the seqs between) BEFORE any of them stops being
   readable, so that a consumer below it gets the boundary fault with a seq that is still served, never a seq
   whose objects are going away. set_first_available never moves it back. The broker running the pass is told the
   new start then (`moved`), so that it refuses the expiring seqs before their objects go, whatever its disk holds.
   The new start is also written to the bucket (tiered.tiering.objects.keys.partition_start_key), for a catalog
   rebuilt from the bucket.
3. Per segment: DELETE_STARTED (it stops being readable and leaves remote_bytes), delete the `.ilog` and `.index`
   objects, DELETE_FINISHED.
4. Block runs below the first available seq (if any: one index probe) are pruned; blocks left without runs become
   `deleting`, and the sweeper (tiered.tiering.recovery.reconciler.sweep_deleted_blocks) deletes their objects after the grace
   period.

A crash between steps leaves a state the next pass completes: first available already moved (it never moves
back), segments still COPY_FINISHED (expired again), or DELETE_STARTED (step 1). Every step is bounded by `limit`.
Catalog calls go through the async catalog (worker threads, deadlines).

Which partitions a pass visits (tiered.tiering.remote_tier.RemoteTier.remote_retention_pass): not every led partition
with a retention, but those `partitions_due` names, page by page: one statement
(tiered.catalog.segments.partitions_due_for_retention) finds, across the led topics, the partitions holding a
readable segment frozen before their topic's cutoff or more remote bytes than their topic's limit, over two indexes
that hold what is past the limit (0011), so a pass with nothing to expire costs a statement, not four per partition.
The pass adds the partitions with an interrupted deletion, those a limit stopped last time (`more`), and, once a
grace period, those holding block runs below their first available seq (a pass interrupted before step 4). The
partitions named are exactly those whose pass expires or prunes something (and a few with a freeze time out of seq
order, where it expires nothing); what a visited partition's pass does is unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tiered.catalog import SegmentState
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog.blocks import DEFAULT_DELETE_GRACE
from tiered.catalog.segments import RetentionLimits, SegmentRow
from tiered.storage.topic_config import TopicConfig
from tiered.tiering.objects import keys
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.objects.store import ObjectStore
from tiered.tiering.objects.meter import Attribution


@dataclass
class RetentionReport:
    topic: str
    partition: int
    deleted: list[SegmentRow] = field(default_factory=list)  # expired by this pass, oldest first
    finished: list[SegmentRow] = field(default_factory=list)  # DELETE_STARTED leftovers of an interrupted pass
    first_available_seq: int = 0  # in force after the pass (0: the partition holds nothing yet)
    runs_pruned: int = 0
    blocks_marked: int = 0  # blocks left without runs, now `deleting`
    more: bool = False  # a limit was reached: call again soon

    @property
    def deleted_bytes(self) -> int:
        return sum(s.total_bytes for s in self.deleted)


async def enforce_remote_retention(
    store: ObjectStore,
    catalog: AsyncCatalog,
    topic: str,
    partition: int,
    config: TopicConfig,
    now: datetime,
    *,
    limit: int = 100,
    run_limit: int = 1000,
    grace: timedelta = DEFAULT_DELETE_GRACE,
    finish_leftovers: bool = True,
    moved: Callable[[int], None] | None = None,
) -> RetentionReport:
    """One bounded retention pass over one partition's remote segments (see the module docstring).

    At most `limit` segments are deleted (leftovers included) and `run_limit` block runs pruned; `more` says a
    limit was reached. `finish_leftovers=False` is for a caller that has just finished this partition's
    interrupted deletions itself (the cleanup of abandoned copies does), so that they are looked for once. `grace` is how long blocks emptied by the prune stay in the bucket. `moved` is
    told the first available seq in force as soon as step 2 wrote it, before any deletion: the broker then answers
    reads below it with the boundary fault instead of reading seqs whose objects are going away. A StoreError or
    CatalogUnavailable propagates; whatever was done so far stays consistent and the next pass continues it.
    """
    if limit < 1 or run_limit < 1:
        raise ValueError("limit and run_limit must be at least 1")
    report = RetentionReport(topic, partition)

    leftovers = (await finish_interrupted_deletions(store, catalog, topic, partition, now, limit=limit)
                 if finish_leftovers else [])
    report.finished.extend(leftovers)
    budget = limit - len(leftovers)

    expired: list[SegmentRow] = []
    if budget > 0:
        expired = await catalog.read(catalog_segments.segments_for_remote_retention, topic, partition, now=now,
            max_age=timedelta(seconds=config.remote_retention_secs) if config.remote_retention_secs else None,
            max_bytes=config.remote_retention_bytes or None, limit=budget,
        )  # fmt: skip
    report.more = len(leftovers) == limit or (budget > 0 and len(expired) == budget)

    if expired:
        first = await _first_kept_seq(catalog, topic, partition, expired[-1])
        report.first_available_seq = await catalog.write(catalog_partitions.set_first_available, topic, partition,
                                                         first)
        if moved is not None:
            moved(report.first_available_seq)
        await store.put(keys.partition_start_key(topic, partition), str(report.first_available_seq).encode(),
                        attribution=Attribution.topic(topic))
        for segment in expired:
            await catalog.write(catalog_segments.segment_delete_started, topic, partition, segment.base_seq, now=now)
            await delete_objects(store, segment)
            await catalog.write(catalog_segments.segment_delete_finished, topic, partition, segment.base_seq, now=now)
            report.deleted.append(segment)
    else:
        report.first_available_seq = await _first_available(catalog, topic, partition)

    if await _runs_below(catalog, topic, partition, report.first_available_seq):
        pruned = await catalog.write(catalog_blocks.prune_runs_below, topic, partition, report.first_available_seq,
                                     limit=run_limit, grace=grace, now=now)
        report.runs_pruned = pruned.runs_deleted
        report.blocks_marked = pruned.blocks_marked
        report.more = report.more or pruned.runs_deleted == run_limit
    return report


def retention_limits(retentions: Iterable[tuple[str, int, int]]) -> list[RetentionLimits]:
    """The remote retention of each topic with one configured ((topic, seconds, bytes), 0 unset: TierState's
    remote_retention_topics), topics of equal limits grouped, for partitions_due_for_retention."""
    groups: dict[tuple[int, int], set[str]] = {}
    for topic, secs, size in retentions:
        if secs or size:
            groups.setdefault((secs, size), set()).add(topic)
    return [RetentionLimits(tuple(sorted(topics)), timedelta(seconds=secs) if secs else None, size or None)
            for (secs, size), topics in sorted(groups.items())]


async def partitions_due(
    catalog: AsyncCatalog, limits: list[RetentionLimits], now: datetime, *, runs_below: bool = False,
    page: int = 500,
) -> AsyncIterator[list[tuple[str, int]]]:
    """The partitions of the topics in `limits` that a retention pass has something to do in, page by page (at
    most `page` each, the next read once the caller is done with one): those with something past a limit
    (tiered.catalog.segments.partitions_due_for_retention, one statement per page, which costs what expires), then,
    with `runs_below`, those holding block runs below their first available seq
    (tiered.catalog.blocks.partitions_with_runs_below_start, a probe per partition: for a pass once in a while).
    A partition may come in both."""
    if not limits:
        return
    after: tuple[str, int] | None = None
    while True:
        due = await catalog.read(catalog_segments.partitions_due_for_retention, limits, now=now, after=after,
                                 limit=page)
        if due:
            yield due
            after = due[-1]
        if len(due) < page:
            break
    if not runs_below:
        return
    topics = sorted({topic for group in limits for topic in group.topics})
    after = None
    while True:
        below = await catalog.read(catalog_blocks.partitions_with_runs_below_start, topics, after=after, limit=page)
        if below:
            yield below
            after = below[-1]
        if len(below) < page:
            break


async def finish_interrupted_deletions(
    store: ObjectStore, catalog: AsyncCatalog, topic: str, partition: int, now: datetime, *, limit: int = 100
) -> list[SegmentRow]:
    """Finishes at most `limit` deletions an interrupted pass left in DELETE_STARTED (of remote retention or of the
    cleanup of abandoned copies, which end the same way): objects deleted, then DELETE_FINISHED."""
    leftovers = await catalog.read(catalog_segments.list_segments, topic, partition,
        states=(SegmentState.DELETE_STARTED,), limit=limit,
    )  # fmt: skip
    for segment in leftovers:
        await delete_objects(store, segment)
        await catalog.write(catalog_segments.segment_delete_finished, topic, partition, segment.base_seq, now=now)
    return leftovers


async def _first_kept_seq(catalog: AsyncCatalog, topic: str, partition: int, last_expired: SegmentRow) -> int:
    """Where the partition's history starts once everything up to `last_expired` is gone: the seq right after it,
    or the base of the next remote segment when that segment answers for the seqs in between (a jump)."""
    after = last_expired.last_seq + 1
    following = await catalog.read(catalog_segments.find_remote_segment, topic, partition, after)
    return following.base_seq if following is not None and following.holds(after) else after


async def _first_available(catalog: AsyncCatalog, topic: str, partition: int) -> int:
    # One primary key probe: a pass over every partition of a topic reading the whole topic each time would cost
    # O(partitions^2) rows.
    state = await catalog.read(catalog_partitions.get_partition_state, topic, partition)
    return state.first_available_seq if state is not None else 0


async def _runs_below(catalog: AsyncCatalog, topic: str, partition: int, seq: int) -> bool:
    """Whether any block run ends below `seq`: one index probe, so that a pass with nothing to prune takes no write
    transaction."""
    if seq <= 1:
        return False
    oldest = await catalog.read(catalog_blocks.find_run, topic, partition, 1)
    return oldest is not None and oldest.last_seq < seq


async def delete_objects(store: ObjectStore, segment: SegmentRow) -> None:
    # delete_many succeeds for keys already gone: a repeated deletion after a crash is harmless.
    await store.delete_many([segment.object_key, segment.index_object_key],
                            attribution=Attribution.topic(segment.topic))
