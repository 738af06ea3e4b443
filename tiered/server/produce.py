"""Produce (0x01) and ProduceWithSeqnum (0x05), both answered with message id 0x01 (PROTOCOL.md §3.1, §3.2).

Every bundle header in the request is validated before anything is appended, so a malformed request changes
nothing (the connection is then closed by the caller). Appends happen in request order.

What a partition's answer means (docs/operations.md, "What a produce answer means"):
- 0x00: stored. On a durable topic: in the bucket and the catalog (its block is committed).
- 0x03 (ack timeout): appended, but its block was not committed within the deadline (the request's own
  ack_timeout when it names one, else `produce_ack_timeout_ms`). The block keeps retrying, so the records may
  still become visible: a producer that sends them again may store them twice; check the partition's seqs first.
- 0xfd (no leader): not stored, and never will be (the partition is not led here, or was fenced before the
  records were committed): safe to send again, to the partition's leader.
- 0x02 (system): not stored: nothing was appended (uploads stalled past the deadline before the append, or the
  local append failed).
"""

from __future__ import annotations

import asyncio
import logging

from tiered import metrics as m
from tiered.protocol.bundle import read_bundle_header
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType
from tiered.protocol.requests import ProduceRequest
from tiered.protocol.responses import PartitionStatus, ProduceResponse, ProduceTopicResult, encode_produce_response
from tiered.server.registry import Role
from tiered.storage.partition_log import InvalidSeqnums
from tiered.tier_interface import AckOutcome

log = logging.getLogger("tiered.server")

MAX_ACK_TIMEOUT_MS = 300_000  # a request may ask for a longer wait than the broker's default, up to this
OUTCOME_STATUS = {
    AckOutcome.COMMITTED: ProduceStatus.OK,
    AckOutcome.NOT_CONFIRMED: ProduceStatus.ACK_TIMEOUT,
    AckOutcome.REFUSED: ProduceStatus.NO_LEADER,
}


class ProduceHandler:
    def __init__(self, broker):
        self.broker = broker

    async def handle(self, conn, req: ProduceRequest) -> None:
        broker = self.broker
        started = broker.clock.monotonic()
        headers = [[read_bundle_header(p.bundle) for p in t.partitions] for t in req.topics]
        if broker.stopping:
            # Shutting down: the open block is being committed and this broker leads nothing any more. "No leader"
            # sends TANK's client to retry, on the broker that takes over; nothing was appended, so nothing doubles.
            await self._answer_all(conn, req, ProduceStatus.NO_LEADER)
            return
        if not await broker.tier.admission():
            # Uploads are stalled: refuse before appending rather than pile up records nobody can make durable.
            await self._answer_all(conn, req, ProduceStatus.SYSTEM)
            return
        results: list[ProduceTopicResult] = []
        pending: list[tuple[int, int, asyncio.Future]] = []  # (result index, partition index, durable ack)
        for t_index, topic in enumerate(req.topics):
            if broker.settings.read_only:
                results.append(ProduceTopicResult(topic.name, ProduceStatus.READ_ONLY, ()))
                continue
            if topic.name not in broker.registry.topics:
                results.append(ProduceTopicResult(topic.name, ProduceStatus.UNKNOWN_TOPIC, ()))
                continue
            statuses: list[PartitionStatus] = []
            for p_index, p in enumerate(topic.partitions):
                part = broker.registry.get(topic.name, p.partition)
                if part is None:
                    statuses.append(PartitionStatus(ProduceStatus.UNKNOWN_PARTITION))
                    continue
                if part.role is not Role.LEADER:
                    statuses.append(PartitionStatus(ProduceStatus.NO_LEADER))
                    continue
                try:
                    header = headers[t_index][p_index]
                    appended = part.log.append(p.bundle, p.base_seq if req.with_seqnum else None, header)
                except InvalidSeqnums as exc:
                    log.info("produce %s/%d refused: %s", topic.name, p.partition, exc)
                    statuses.append(PartitionStatus(ProduceStatus.INVALID_SEQNUMS))
                    continue
                except OSError as exc:
                    log.error("produce %s/%d: append failed: %s", topic.name, p.partition, exc)
                    statuses.append(PartitionStatus(ProduceStatus.SYSTEM))
                    continue
                broker.metrics.produced(topic.name, len(appended.record), header.count)
                ack = broker.appended(part, appended)
                if ack is not None:
                    pending.append((len(results), len(statuses), ack))
                statuses.append(PartitionStatus(ProduceStatus.OK))
            results.append(ProduceTopicResult(topic.name, None, tuple(statuses)))
        if pending:
            # Wait outside the request loop so later requests on this connection are not held up by this one.
            conn.spawn(self._answer_when_durable(conn, req, results, pending, started))
            return
        await self._send(conn, req, results, started)

    async def _send(self, conn, req: ProduceRequest, results, started: float) -> None:
        elapsed = self.broker.clock.monotonic() - started
        for name in {t.name for t in req.topics if t.name in self.broker.registry.topics}:
            self.broker.metrics.ack_latency(name, elapsed)
        await conn.send(MsgType.PRODUCE, encode_produce_response(ProduceResponse(req.request_id, tuple(results))))

    async def _answer_all(self, conn, req: ProduceRequest, status: int) -> None:
        results = []
        for topic in req.topics:
            if topic.name not in self.broker.registry.topics:
                results.append(ProduceTopicResult(topic.name, ProduceStatus.UNKNOWN_TOPIC, ()))
            else:
                results.append(ProduceTopicResult(topic.name, None, tuple(PartitionStatus(status) for _ in topic.partitions)))
        await conn.send(MsgType.PRODUCE, encode_produce_response(ProduceResponse(req.request_id, tuple(results))))

    def _ack_timeout_s(self, req: ProduceRequest) -> float:
        if req.ack_timeout_ms:
            return min(req.ack_timeout_ms, MAX_ACK_TIMEOUT_MS) / 1000.0
        return self.broker.settings.produce_ack_timeout_ms / 1000.0

    async def _answer_when_durable(self, conn, req, results, pending, started: float) -> None:
        clock = self.broker.clock
        deadline = started + self._ack_timeout_s(req)
        timer = asyncio.ensure_future(clock.sleep(max(0.0, deadline - clock.monotonic())))
        try:
            acks = {ack for _, _, ack in pending}
            await asyncio.wait({*acks, timer}, return_when=asyncio.FIRST_COMPLETED)
            while not all(ack.done() for ack in acks) and not timer.done():
                await asyncio.wait({*(a for a in acks if not a.done()), timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        not_confirmed = 0
        for r_index, s_index, ack in pending:
            outcome = ack.result() if ack.done() and not ack.cancelled() else AckOutcome.NOT_CONFIRMED
            if outcome is AckOutcome.NOT_CONFIRMED:
                not_confirmed += 1
            status = OUTCOME_STATUS[outcome]
            if status != ProduceStatus.OK:
                topic = results[r_index]
                statuses = list(topic.partitions)
                statuses[s_index] = PartitionStatus(status)
                results[r_index] = ProduceTopicResult(topic.name, topic.status, tuple(statuses))
        if not_confirmed:
            self.broker.metrics.inc(m.ACK_TIMEOUTS, not_confirmed)
            log.error("request %d: %d durable produces not confirmed within %.1f s (answered 0x03; their block "
                      "keeps retrying)", req.request_id, not_confirmed, self._ack_timeout_s(req))
        await self._send(conn, req, results, started)
