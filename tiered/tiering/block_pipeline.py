"""Upload and commit of closed blocks (DESIGN.md, data path steps 3 and 4).

For each block, in this order: the intent row (`pending`) in the catalog, so no object can exist that the catalog
does not know; the PUT; then, once every earlier block is committed, one commit transaction that checks the leader
epoch of each of its partitions. Uploads of different blocks overlap; commits never overtake each other, so a
partition's committed seqs never have a hole.

Failures: the PUT and the commit are retried with backoff for as long as the broker runs, because a block's records
already sit in the local log and the catalog must not skip them. Producers are not kept waiting that long: after
`ack_timeout_s` their acknowledgements fail (answered 0x02), and the records become visible only if a later retry
commits them (the usual ambiguity of a failed write). A commit refused for a stale epoch fences that partition (the
broker stops serving it), abandons the object (deleted once the catalog confirms nothing references it), and
rebuilds the block without the fenced partitions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable

from tiered.catalog import blocks as catalog_blocks
from tiered.catalog.errors import CatalogUnavailable, IllegalTransition, StaleEpoch
from tiered.tiering import keys
from tiered.tiering.block_builder import ClosedBlock, PartitionKey, PendingRun
from tiered.tiering.block_format import encode_block
from tiered.tiering.catalog_thread import CatalogThread
from tiered.tiering.store import ObjectStore, StoreError

log = logging.getLogger("tiered.tiering")

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0


class Retrying:
    """Retries transient failures with exponential backoff until the call succeeds or the pipeline stops."""

    transient = (StoreError, CatalogUnavailable, OSError, asyncio.TimeoutError)

    def __init__(self, metrics, first_s: float = RETRY_FIRST_S, max_s: float = RETRY_MAX_S):
        self.metrics = metrics
        self.first_s = first_s
        self.max_s = max_s

    async def __call__(self, what: str, make_call: Callable[[], object], error_counter: str):
        delay = self.first_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return await make_call()
            except self.transient as exc:
                self.metrics.inc(error_counter, help=f"failed attempts: {what}")
                level = logging.WARNING if attempt in (1, 10) or attempt % 100 == 0 else logging.DEBUG
                log.log(level, "%s failed (attempt %d, retrying in %.2f s): %s", what, attempt, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_s)


class BlockPipeline:
    def __init__(
        self,
        store: ObjectStore,
        catalog: CatalogThread,
        broker_id: int,
        epochs: dict[PartitionKey, int],
        *,
        metrics,
        on_committed: Callable[[list[PendingRun]], None],
        on_fenced: Callable[[PartitionKey, StaleEpoch], None],
        max_in_flight: int = 8,
        ack_timeout_s: float = 10.0,
        now_ms: Callable[[], float] = lambda: time.time() * 1000,
    ):
        self.store = store
        self.catalog = catalog
        self.broker_id = broker_id
        self.epochs = epochs
        self.metrics = metrics
        self.on_committed = on_committed
        self.on_fenced = on_fenced
        self.max_in_flight = max_in_flight
        self.ack_timeout_s = ack_timeout_s
        self.now_ms = now_ms
        self.retry = Retrying(metrics)
        self.fenced: set[PartitionKey] = set()
        self._ids = keys.BlockIdClock()
        self._tasks: set[asyncio.Task] = set()
        self._open: dict[asyncio.Task, ClosedBlock] = {}
        self._last_commit: asyncio.Future | None = None
        self._room = asyncio.Condition()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def in_flight_bytes(self) -> int:
        return sum(b.size_bytes for b in self._open.values())

    def oldest_open_ms(self) -> float | None:
        """When the oldest record of any block still uploading or committing arrived."""
        return min((b.opened_ms for b in self._open.values()), default=None)

    async def admission(self, timeout_s: float) -> bool:
        """Waits until fewer than `max_in_flight` blocks are in flight; False if that did not happen in time."""
        if len(self._tasks) < self.max_in_flight:
            return True
        async with self._room:
            try:
                await asyncio.wait_for(self._room.wait_for(lambda: len(self._tasks) < self.max_in_flight), timeout_s)
                return True
            except asyncio.TimeoutError:
                return False

    def submit(self, block: ClosedBlock) -> asyncio.Task:
        loop = asyncio.get_running_loop()
        previous = self._last_commit
        committed = loop.create_future()
        self._last_commit = committed
        task = loop.create_task(self._run(block, previous, committed))
        self._tasks.add(task)
        self._open[task] = block
        task.add_done_callback(self._done)
        if block.acks:
            loop.call_later(self.ack_timeout_s, self._expire_acks, block)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._open.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("block pipeline task failed: %r", task.exception())
        asyncio.get_running_loop().create_task(self._notify_room())

    async def _notify_room(self) -> None:
        async with self._room:
            self._room.notify_all()

    def _expire_acks(self, block: ClosedBlock) -> None:
        expired = 0
        for _, ack in block.acks:
            if not ack.done():
                ack.set_result(False)
                expired += 1
        if expired:
            self.metrics.inc("tiered_durable_ack_timeouts_total", expired, help="produce acks answered 0x02 after the ack timeout")
            log.error("block not committed within %.1f s: %d produce requests answered with an I/O error",
                      self.ack_timeout_s, expired)

    async def drain(self, timeout_s: float) -> bool:
        """Waits for every block in flight; True when all are committed (or dropped as fenced) in time."""
        if not self._tasks:
            return True
        done, pending = await asyncio.wait(set(self._tasks), timeout=max(timeout_s, 0.0))
        return not pending

    async def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _run(self, block: ClosedBlock, previous: asyncio.Future | None, committed: asyncio.Future) -> None:
        try:
            await self._upload_and_commit(block, previous)
        finally:
            if not committed.done():
                committed.set_result(None)

    async def _upload_and_commit(self, block: ClosedBlock, previous: asyncio.Future | None) -> None:
        while True:
            runs = [r for r in block.runs if (r.topic, r.partition) not in self.fenced]
            if not runs:
                self._answer(block, ())
                return
            data, infos = encode_block([(r.meta(), b"".join(r.records)) for r in runs])
            object_key = keys.block_key(self.broker_id, self._ids.next(int(self.now_ms())))
            block_id = await self.retry(
                f"intent row for {object_key}",
                lambda: self.catalog.call(catalog_blocks.insert_pending_block, object_key, self.broker_id, len(data)),
                "tiered_catalog_errors_total",
            )
            await self.retry(f"PUT {object_key}", lambda: self.store.put(object_key, data), "tiered_put_errors_total")
            self.metrics.inc("tiered_blocks_uploaded_total", help="blocks uploaded")
            self.metrics.inc("tiered_block_bytes_uploaded_total", len(data), help="block bytes uploaded")
            if previous is not None:
                await asyncio.shield(previous)  # commits stay in block order
            rows = [catalog_blocks.RunRow(i.topic, i.partition, i.first_seq, i.last_seq, i.position, i.length_bytes,
                                          i.messages, i.min_ts_ms, i.max_ts_ms) for i in infos]
            epochs = {(r.topic, r.partition): self.epochs[(r.topic, r.partition)] for r in runs}
            started = time.monotonic()
            try:
                await self.retry(
                    f"commit of block {block_id}",
                    lambda: self.catalog.commit(catalog_blocks.commit_block, block_id, self.broker_id, rows, epochs),
                    "tiered_commit_errors_total",
                )
            except StaleEpoch as exc:
                key = (exc.topic, exc.partition)
                self.fenced.add(key)
                self.on_fenced(key, exc)
                await self._abandon(block_id, object_key)
                continue  # rebuild the block without the fenced partition
            except IllegalTransition as exc:
                # The intent row was abandoned (the reconciler judged this broker dead): upload the records anew.
                log.warning("block %s can no longer be committed (%s); uploading its records again", object_key, exc)
                continue
            self.metrics.observe("tiered_commit_seconds", time.monotonic() - started, help="block commit latency")
            self.on_committed(runs)
            self._answer(block, runs)
            return

    async def _abandon(self, block_id: int, object_key: str) -> None:
        deletable = await self.retry(
            f"abandon block {block_id}",
            lambda: self.catalog.call(catalog_blocks.abandon_block, block_id),
            "tiered_catalog_errors_total",
        )
        log.warning("block %s abandoned after a refused commit (object deleted after the grace period: %s)",
                    object_key, deletable)

    def _answer(self, block: ClosedBlock, committed_runs: Iterable[PendingRun]) -> None:
        committed = {(r.topic, r.partition) for r in committed_runs}
        now_ms = self.now_ms()
        for key, ack in block.acks:
            if not ack.done():
                ack.set_result(key in committed)
        if committed:
            self.metrics.observe("tiered_durable_ack_seconds", max(0.0, now_ms - block.opened_ms) / 1000.0,
                                 help="time from a block's first record to its commit")
