"""Consume (0x02), as TANK answers it (docs/protocol.md §3.3, §3.4).

Each partition resolves to data (whole bundles from the one that holds the seq), a boundary fault, or EOF. Any
partition that is not at EOF makes the response immediate; so does max_wait 0. Otherwise the request waits until
`min_bytes` become visible across its partitions, or until its normalised deadline. EOF partitions carry one of
TANK's three base values: first available (answered at once), 0 (timed out), or the first seq that arrived (woken).

A partition led elsewhere serves its history here; its tail is redirected to the leader (0xfc), or answered "no
leader" (0xfd) while a takeover is under way (tiered.server.leaders). A long-poll on a partition that moves away
answers at once, redirected.

The waiter is registered before the handler yields to the event loop, and the tails are checked again right after:
a produce that lands while the request is being resolved (pipelined on the same connection, or committed meanwhile)
wakes it instead of being missed until the deadline.
"""

from __future__ import annotations

import asyncio
import logging

from tiered import metrics as m
from tiered.acl import Op
from tiered.protocol.codes import UINT64_MAX, ConsumeStatus
from tiered.protocol.consume_response import ConsumePartitionResult, ConsumeTopicResult, encode_consume_head
from tiered.protocol.requests import ConsumeRequest

from tiered.bounds import Boundary, Eof
from tiered.server.fetch import Chunk, Found, Resolved, release
from tiered.server.registry import Partition
from tiered.server.leaders import LedElsewhere, redirect_endpoint
from tiered.server.waiters import Waiter, wakeup_deadline_ms
from tiered.tier_interface import Unreadable
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.server")

MAX_FETCH_BYTES = 64 * 1024 * 1024
MAX_MIN_BYTES = 64 * 1024 * 1024
# All chunks of one response share this budget, so that a consume of many partitions stays well inside the
# 256 MiB frame limit; a partition past the budget still gets its first whole bundle (fetch size 1).
RESPONSE_BUDGET_BYTES = 128 * 1024 * 1024


class ConsumeHandler:
    def __init__(self, broker):
        self.broker = broker

    async def handle(self, conn, req: ConsumeRequest) -> None:
        broker = self.broker
        min_bytes = min(req.min_bytes, MAX_MIN_BYTES)
        topics = []
        chunks: list[Chunk] = []
        tails: dict[TopicPartition, int] = {}
        fetch_sizes: dict[TopicPartition, int] = {}
        immediate = req.max_wait_ms == 0 or broker.stopping  # no new long-polls while shutting down
        # What the request names, looked up once; the partitions are then read at once (remote ones GET in
        # parallel), the response budget shared out beforehand in request order by fetch size.
        # A topic the access rules refuse this client is answered as unknown (tiered.server.access).
        access = broker.access if broker.access.active else None
        named = [(topic, None if broker.registry.topics.get(topic.name) is None
                  or access is not None and not access.allows(conn, Op.CONSUME, topic.name) else
                  [(p, broker.registry.get(topic.name, p.partition)) for p in topic.partitions])
                 for topic in req.topics]
        budget = RESPONSE_BUDGET_BYTES
        reads = []
        for _, partitions in named:
            for p, part in partitions or ():
                if part is not None:
                    share = min(p.fetch_size, MAX_FETCH_BYTES, budget)
                    budget -= share
                    reads.append((part, p.seq, max(1, share)))
        resolved = iter(await self._resolve_all(reads))
        for topic, partitions in named:
            if partitions is None:
                topics.append(ConsumeTopicResult(topic.name, None, len(topic.partitions)))
                immediate = True
                continue
            results = []
            for p, part in partitions:
                if part is None:
                    results.append(ConsumePartitionResult(p.partition, ConsumeStatus.UNKNOWN_PARTITION))
                    immediate = True
                    continue
                got = next(resolved)
                if isinstance(got, Found):
                    chunks.append(got.chunk)
                if not isinstance(got, Eof):
                    if isinstance(got, LedElsewhere):
                        broker.metrics.inc(m.REDIRECTS)
                    results.append(_result(p.partition, got, conn, broker))
                    immediate = True
                else:
                    results.append(ConsumePartitionResult(p.partition, ConsumeStatus.OK, got.first_available, got.hwmark, 0))
                    tail = p.seq if p.seq not in (0, UINT64_MAX) else got.hwmark + 1
                    tails[part.tp] = tail
                    fetch_sizes[part.tp] = min(p.fetch_size, MAX_FETCH_BYTES)
            topics.append(ConsumeTopicResult(topic.name, tuple(results), len(topic.partitions)))
        if immediate or not tails:
            broker.metrics.consumed(topics)
            await conn.send_consume(encode_consume_head(req.request_id, topics), chunks)
            return
        waiter = Waiter(dict(tails), min_bytes, asyncio.get_running_loop().create_future())
        broker.waiters.add(waiter)
        for tp, tail in tails.items():
            part = broker.registry.get(*tp)
            # Something became visible while this request was resolved: it answers now, from the tails.
            if part is not None and part.hwmark >= tail:
                waiter.first_seen.setdefault(tp, tail)
                waiter.fire("data")
        conn.spawn(self._wait(conn, req, waiter, fetch_sizes))

    async def _resolve_all(self, reads: list[tuple[Partition, int, int]]) -> list[Resolved]:
        """Each (partition, seq, fetch size) resolved, all at once. Should this be cancelled or one of them fail,
        what the others found is released (a streamed chunk holds read buffers) before the error goes on."""
        resolve = self.broker.fetch.resolve
        if len(reads) == 1:
            return [await resolve(*reads[0])]
        tasks = [asyncio.ensure_future(resolve(*read)) for read in reads]
        try:
            done = await asyncio.gather(*tasks, return_exceptions=True)
        except BaseException:
            for task in tasks:
                task.cancel()
                task.add_done_callback(_release_found)
            raise
        failed = next((got for got in done if isinstance(got, BaseException)), None)
        if failed is not None:
            release([got.chunk for got in done if isinstance(got, Found)])
            raise failed
        return done

    async def _wait(self, conn, req: ConsumeRequest, waiter: Waiter, fetch_sizes) -> None:
        broker = self.broker
        tails = waiter.seqs
        clock = broker.clock
        now_ms = clock.monotonic() * 1000.0
        delay_ms = wakeup_deadline_ms(now_ms, req.max_wait_ms) - now_ms
        timer = asyncio.ensure_future(clock.sleep(max(delay_ms, 0) / 1000.0))
        try:
            await asyncio.wait({waiter.future, timer}, return_when=asyncio.FIRST_COMPLETED)
            woken = waiter.future.done() and waiter.future.result() == "data"  # "shutdown" answers like a timeout
        finally:
            timer.cancel()
            broker.waiters.remove(waiter)
        topics: list[ConsumeTopicResult] = []
        chunks = []
        # A long-poll response carries only the waiting partitions, grouped by topic in request order.
        for topic in req.topics:
            results = []
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                if tp not in tails:
                    continue
                part = broker.registry.get(*tp)
                got = None
                if part is not None and (woken or waiter.future.done() and waiter.future.result() == "moved"):
                    got = await broker.fetch.resolve(part, tails[tp], fetch_sizes[tp])
                hwmark = part.hwmark if part is not None else 0
                if isinstance(got, Found):
                    chunks.append(got.chunk)
                if got is not None and not isinstance(got, Eof):
                    if isinstance(got, LedElsewhere):
                        broker.metrics.inc(m.REDIRECTS)
                    results.append(_result(p.partition, got, conn, broker))
                else:
                    results.append(ConsumePartitionResult(p.partition, ConsumeStatus.OK, 0, hwmark, 0))
            if results:
                topics.append(ConsumeTopicResult(topic.name, tuple(results), len(results)))
        broker.metrics.consumed(topics)
        await conn.send_consume(encode_consume_head(req.request_id, topics), chunks)


def _release_found(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is None and isinstance(task.result(), Found):
        release([task.result().chunk])


def _result(partition: int, got: Resolved, conn, broker) -> ConsumePartitionResult:
    """The partition's result for anything but EOF; a redirect names the leader's endpoint for `conn`'s kind."""
    if isinstance(got, Found):
        if got.first_bundle_sparse:
            return ConsumePartitionResult(partition, ConsumeStatus.SPARSE, 0, got.hwmark, got.chunk.size)
        return ConsumePartitionResult(partition, ConsumeStatus.OK, got.first_bundle_seq, got.hwmark, got.chunk.size)
    if isinstance(got, Boundary):
        return ConsumePartitionResult(partition, ConsumeStatus.BOUNDARY, 0, got.hwmark, 0, got.first_available)
    if isinstance(got, Unreadable):
        return ConsumePartitionResult(partition, ConsumeStatus.SYSTEM)
    if isinstance(got, LedElsewhere):
        if got.leader is None:
            return ConsumePartitionResult(partition, ConsumeStatus.NO_LEADER)
        return ConsumePartitionResult(partition, ConsumeStatus.OTHER_LEADER,
                                      leader=redirect_endpoint(got.leader, conn.plaintext, broker.advertised_host))
    raise TypeError(f"no consume result for {got!r}")
