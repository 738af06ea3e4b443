"""Upload and commit of closed blocks (docs/architecture.md, data path steps 3 and 4).

For each block, in this order: the intent row (`pending`) in the catalog, so no object can exist that the catalog
does not know; the PUT; then, once every earlier block is committed, one commit transaction that checks the leader
epoch of each of its partitions and that each partition's runs continue the catalog's high-water mark. Uploads of
different blocks overlap; commits never overtake each other, so a partition's committed seqs never have a hole.

Failures: the PUT and the commit are retried with backoff for as long as the broker runs, because a block's records
already sit in the local log and the catalog must not skip them. (Producers are not kept waiting that long: the
produce handler answers at its own deadline that the outcome is not known yet.) A commit refused for a stale epoch
or a broken chain fences that partition (the broker stops serving it; its waiting producers are answered REFUSED,
since those records will never be committed), abandons the object (deleted once the catalog confirms nothing
references it), and rebuilds the block without the fenced partition.

After the acknowledgements, off their path, the committed block is expanded: its runs, which the commit wrote packed
in the block's row, go into block_runs (tiered.catalog.blocks; readers find them either way). A block a crash or a
failure left unexpanded is expanded by the sweep (`expand_stale`) on any broker.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Callable, Iterable

from tiered import metrics as m
from tiered.cancellation import within
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog.errors import Discontinuity, IllegalTransition, StaleEpoch
from tiered.clock import Clock, utc_now
from tiered.metrics import Metrics
from tiered.tier_interface import AckOutcome
from tiered.tiering.objects import keys
from tiered.tiering.blocks.block_builder import ClosedBlock, PendingRun
from tiered.tiering.blocks.block_format import encode_block_pieces
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.blocks.hot_path import HotPathGate
from tiered.tiering.objects.retrying import Retrying
from tiered.tiering.objects.store import ObjectStore
from tiered.tiering.objects.meter import Attribution, Direction
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.tiering")

# A block still unexpanded this long after its commit was left by a broker that stopped or failed between the two:
# the sweep expands it. Longer than an expansion takes under load, so that the sweep rarely races the committer's
# own expansion (harmless when it does: the second finds nothing to do).
EXPANSION_SWEEP_AGE = timedelta(seconds=5)
EXPANSION_SWEEP_INTERVAL_S = 2.0

FencedKey = tuple[str, int, int]  # topic, partition, epoch


class BlockPipeline:
    def __init__(
        self,
        store: ObjectStore,
        catalog: AsyncCatalog,
        broker_id: int,
        *,
        metrics: Metrics,
        on_committed: Callable[[list[PendingRun]], None],
        on_fenced: Callable[[TopicPartition, int, str], None],
        grace,
        clock: Clock,
        max_in_flight: int = 8,
        on_done: Callable[[], None] | None = None,
        hot_path: HotPathGate | None = None,
        expand_in_commit_runs: int = catalog_blocks.EXPAND_IN_COMMIT_RUNS,
    ):
        self.store = store
        self.catalog = catalog
        self.broker_id = broker_id
        self.metrics = metrics
        self.on_committed = on_committed
        self.on_fenced = on_fenced
        self.on_done = on_done  # after each block leaves the pipeline (committed, fenced or failed)
        self.grace = grace
        self.hot_path = hot_path  # told while a block is in flight, so that remote reads give way
        self.max_in_flight = max_in_flight
        # Blocks of up to this many runs are expanded by their commit; wider ones after their acks (the setting
        # block_expand_in_commit_runs; 0: every block on PostgreSQL).
        self.expand_in_commit_runs = expand_in_commit_runs
        self.clock = clock
        self.retry = Retrying(metrics, clock=clock)
        self.fenced: set[FencedKey] = set()
        self._ids = keys.BlockIdClock()
        self._tasks: set[asyncio.Task] = set()
        self._open: dict[asyncio.Task, ClosedBlock] = {}
        self._last_commit: asyncio.Future | None = None
        self._expansions: set[asyncio.Task] = set()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def in_flight_bytes(self) -> int:
        return sum(b.size_bytes for b in self._open.values())

    def oldest_open_ms(self) -> float | None:
        """When the oldest record of any block still uploading or committing arrived."""
        return min((b.opened_ms for b in self._open.values()), default=None)

    def has_room(self) -> bool:
        """Whether admission() would answer True at once."""
        return len(self._tasks) < self.max_in_flight

    async def admission(self, timeout_s: float) -> bool:
        """Waits until fewer than `max_in_flight` blocks are in flight; False if that did not happen in time."""
        deadline = self.clock.monotonic() + timeout_s
        while not self.has_room():
            self._room.clear()
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return False
            try:
                await within(self._room.wait(), left)
            except TimeoutError:
                return False
        return True

    def submit(self, block: ClosedBlock) -> asyncio.Task:
        loop = asyncio.get_running_loop()
        previous = self._last_commit
        committed = loop.create_future()
        self._last_commit = committed
        task = loop.create_task(self._run(block, previous, committed))
        self._tasks.add(task)
        self._open[task] = block
        if self.hot_path is not None:
            self.hot_path.enter()
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        block = self._open.pop(task, None)
        if self.hot_path is not None:
            self.hot_path.leave()
        if not task.cancelled() and task.exception() is not None:
            # Never expected (every failure is retried or handled): answer its producers and say so loudly.
            log.error("block pipeline task failed", exc_info=task.exception())
            self.metrics.inc(m.TASK_RESTARTS)
            if block is not None:
                self._answer(block, (), AckOutcome.NOT_CONFIRMED)
        self._room.set()
        if self.on_done is not None:
            self.on_done()

    async def drain(self, timeout_s: float) -> bool:
        """Waits for every block in flight, then (in what is left of `timeout_s`) for the expansions of the blocks
        committed, so that a graceful stop leaves none to another broker's sweep. True when every block was committed
        (or dropped as fenced) in time; an expansion not finished in time is the sweep's, and changes nothing here."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        pending: set[asyncio.Task] = set()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=max(timeout_s, 0.0))
        if self._expansions and deadline > loop.time():
            await asyncio.wait(set(self._expansions), timeout=deadline - loop.time())
        return not pending

    async def cancel(self) -> None:
        for task in list(self._tasks) + list(self._expansions):
            task.cancel()
        if self._tasks or self._expansions:
            await asyncio.wait(self._tasks | self._expansions)

    async def _run(self, block: ClosedBlock, previous: asyncio.Future | None, committed: asyncio.Future) -> None:
        try:
            await self._upload_and_commit(block, previous)
        finally:
            if not committed.done():
                committed.set_result(None)

    async def _upload_and_commit(self, block: ClosedBlock, previous: asyncio.Future | None) -> None:
        while True:
            runs = [r for r in block.runs if (r.topic, r.partition, r.leader_epoch) not in self.fenced]
            if not runs:
                self._answer(block, (), AckOutcome.REFUSED)
                return
            pieces, rows = encode_block_pieces([(r, r.records) for r in runs], [r.index for r in runs])
            size = sum(len(p) for p in pieces)
            object_key = keys.block_key(self.broker_id, self._ids.next(int(self.clock.now_ms())))
            block_id = await self.retry(
                f"intent row for {object_key}",
                lambda: self.catalog.write(catalog_blocks.insert_pending_block, object_key, self.broker_id, size,
                                           now=utc_now(self.clock)),
                m.CATALOG_ERRORS,
            )
            # The PUT is shared by the topics of the block in proportion to their runs' bytes (tiering/objects/meter.py).
            shares = Attribution.by_bytes((row.topic, row.length_bytes) for row in rows)
            await self.retry(f"PUT {object_key}", lambda: self.store.put(object_key, pieces, attribution=shares),
                             m.PUT_ERRORS)
            self.metrics.inc(m.BLOCKS_UPLOADED)
            self.metrics.inc(m.BLOCK_BYTES_UPLOADED, size)
            if previous is not None:
                await asyncio.shield(previous)  # commits stay in block order
            epochs = {(r.topic, r.partition): r.leader_epoch for r in runs}
            expand = catalog_blocks.expands_in_commit(self.catalog.catalog, len(rows), self.expand_in_commit_runs)
            started = self.clock.monotonic()
            try:
                await self.retry(
                    f"commit of block {block_id}",
                    lambda: self.catalog.write(catalog_blocks.commit_block, block_id, self.broker_id, rows, epochs,
                                               now=utc_now(self.clock), expand=expand),
                    m.COMMIT_ERRORS,
                )
            except (StaleEpoch, Discontinuity) as exc:
                key = TopicPartition(exc.topic, exc.partition)
                if isinstance(exc, Discontinuity):
                    self.metrics.inc(m.DISCONTINUOUS_COMMITS)
                self.fenced.add((exc.topic, exc.partition, epochs[key]))
                self.on_fenced(key, epochs[key], str(exc))
                await self._abandon(block_id, object_key)
                continue  # rebuild the block without the fenced partition
            except IllegalTransition as exc:
                # The intent row was abandoned (the reconciler judged this broker dead): upload the records anew.
                log.warning("block %s can no longer be committed (%s); uploading its records again", object_key, exc)
                continue
            self.metrics.observe(m.COMMIT_SECONDS, self.clock.monotonic() - started)
            for topic, size in shares.shares:  # the topics' run bytes: what their producers sent, committed once
                self.store.meter.transferred(Attribution.topic(topic), Direction.INGESTED, int(size))
            self.on_committed(runs)
            self._answer(block, runs, AckOutcome.REFUSED)
            if not expand:  # else the commit inserted the rows itself
                self._expand_later(block_id)
            return

    def _expand_later(self, block_id: int) -> None:
        """After the acknowledgements: the block's runs into block_runs, in a task of its own on the catalog's read
        pool, beside the write thread, so that neither the acks nor the next block's commit wait for it. A failure
        leaves the block to the sweep; nothing is lost meanwhile (readers find the runs in the block's row)."""
        task = asyncio.get_running_loop().create_task(self._expand(block_id))
        self._expansions.add(task)
        task.add_done_callback(self._expansions.discard)

    async def _expand(self, block_id: int) -> None:
        try:
            await self.catalog.read(catalog_blocks.expand_blocks, [block_id])
        except Exception as exc:  # the sweep expands it later, on this broker or another
            log.warning("block %s was not expanded after its commit (the sweep will): %s", block_id, exc)

    async def expand_stale(self) -> int:
        """The sweep, every EXPANSION_SWEEP_INTERVAL_S under the tier's supervisor on every broker: expands the
        blocks committed more than EXPANSION_SWEEP_AGE ago and still unexpanded (their broker stopped or failed
        between the commit and the expansion). Returns the runs expanded; a failure is the supervisor's to count."""
        before = utc_now(self.clock) - EXPANSION_SWEEP_AGE
        stale = await self.catalog.read(catalog_blocks.unexpanded_blocks, before)
        if not stale:
            return 0
        expanded = await self.catalog.read(catalog_blocks.expand_blocks, stale)
        log.info("expanded %d runs of %d blocks left unexpanded after their commit", expanded, len(stale))
        return expanded

    async def _abandon(self, block_id: int, object_key: str) -> None:
        deletable = await self.retry(
            f"abandon block {block_id}",
            lambda: self.catalog.write(catalog_blocks.abandon_block, block_id, grace=self.grace),
            m.CATALOG_ERRORS,
        )
        log.warning("block %s abandoned after a refused commit (object deleted after the grace period: %s)",
                    object_key, deletable)

    def _answer(self, block: ClosedBlock, committed_runs: Iterable[PendingRun], otherwise: AckOutcome) -> None:
        """Acks of partitions whose runs were committed: COMMITTED; the others: `otherwise`."""
        committed = {(r.topic, r.partition) for r in committed_runs}
        for key, ack in block.acks:
            if not ack.done():
                ack.set_result(AckOutcome.COMMITTED if key in committed else otherwise)
        if committed:
            self.metrics.observe(m.DURABLE_ACK_SECONDS, max(0.0, self.clock.now_ms() - block.opened_ms) / 1000.0)
