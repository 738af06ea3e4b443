"""Produce (0x01) and ProduceWithSeqnum (0x05), both answered with message id 0x01 (PROTOCOL.md §3.1, §3.2).

Every bundle of the request is validated completely (validate_bundle: header, snappy block, every message, count,
no trailing bytes) before anything of the request is appended, so a malformed request changes nothing: the
ProtocolError closes that connection only (connection.py), and no bad bundle ever reaches a log, a block or a
consumer. Appends happen in request order. A partition on a durable
topic is answered only once the block holding its bundle is committed to the catalog; a failed upload or commit
answers 0x02 and nothing is reported as written that the catalog does not hold (DESIGN.md, data path step 4).
"""

from __future__ import annotations

import asyncio
import logging
import time

from tiered.protocol.bundle import validate_bundle
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType
from tiered.protocol.requests import ProduceRequest
from tiered.protocol.responses import PartitionStatus, ProduceResponse, ProduceTopicResult, encode_produce_response
from tiered.storage.partition_log import InvalidSeqnums

log = logging.getLogger("tiered.server")


class ProduceHandler:
    def __init__(self, broker):
        self.broker = broker

    async def handle(self, conn, req: ProduceRequest) -> None:
        broker = self.broker
        started = time.monotonic()
        facts = [[validate_bundle(p.bundle) for p in t.partitions] for t in req.topics]
        if broker.stopping:
            # Shutting down: the open block is being committed and this broker leads nothing any more. "No leader"
            # sends TANK's client to retry, on the broker that takes over; nothing was appended, so nothing doubles.
            await self._answer_all(conn, req, ProduceStatus.NO_LEADER)
            return
        if broker.tiering is not None and not await broker.tiering.admission():
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
                if part.fenced:
                    statuses.append(PartitionStatus(ProduceStatus.NO_LEADER))
                    continue
                try:
                    bundle_facts = facts[t_index][p_index]
                    appended = part.log.append(p.bundle, p.base_seq if req.with_seqnum else None, bundle_facts)
                except InvalidSeqnums as exc:
                    log.info("produce %s/%d refused: %s", topic.name, p.partition, exc)
                    statuses.append(PartitionStatus(ProduceStatus.INVALID_SEQNUMS))
                    continue
                except OSError as exc:
                    log.error("produce %s/%d: append failed: %s", topic.name, p.partition, exc)
                    statuses.append(PartitionStatus(ProduceStatus.SYSTEM))
                    continue
                broker.metrics.produced(topic.name, len(appended.record), bundle_facts.count)
                ack = broker.after_append(part, appended)
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
        elapsed = time.monotonic() - started
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

    async def _answer_when_durable(self, conn, req, results, pending, started: float) -> None:
        for r_index, s_index, ack in pending:
            try:
                ok = await ack
            except Exception as exc:  # every failure of the durable path is answered, never lost
                log.error("durable ack failed for request %d: %s", req.request_id, exc)
                ok = False
            if not ok:
                topic = results[r_index]
                statuses = list(topic.partitions)
                statuses[s_index] = PartitionStatus(ProduceStatus.SYSTEM)
                results[r_index] = ProduceTopicResult(topic.name, topic.status, tuple(statuses))
        await self._send(conn, req, results, started)
