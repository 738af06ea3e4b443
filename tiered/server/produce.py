"""Produce (0x01) and ProduceWithSeqnum (0x05), both answered with message id 0x01 (PROTOCOL.md §3.1, §3.2).

Every bundle of the request is validated completely (read_checked_produce: header, snappy block, every message,
count, no trailing bytes) before the request reaches this handler, so a malformed request changes nothing: its
ProtocolError closes that connection only (connection.py), and no bad bundle ever reaches a log, a block or a
consumer. Appends happen in request order. A partition on a durable topic is answered only once the block holding
its bundle is committed to the catalog; a failed upload or commit answers 0x02 and nothing is reported as written
that the catalog does not hold (DESIGN.md, data path step 4).

The answer is kept as plain status bytes per request topic and encoded with encode_produce_codes: a produce request
costs no result objects.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tiered.protocol.bundle import BundleFacts
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType
from tiered.protocol.requests import ProduceRequest
from tiered.protocol.responses import encode_produce_codes
from tiered.storage.partition_log import InvalidSeqnums

log = logging.getLogger("tiered.server")

OK = ProduceStatus.OK
# One request topic's answer: (name, topic-level status or None, one partition-level status byte per partition).
TopicAnswer = tuple[str, "int | None", bytearray]


class ProduceHandler:
    def __init__(self, broker):
        self.broker = broker

    async def handle(self, conn, req: ProduceRequest, facts: list[BundleFacts]) -> None:
        """`facts`: each bundle's, in request order (read_checked_produce validated them all)."""
        broker = self.broker
        started = time.monotonic()
        if broker.stopping:
            # Shutting down: the open block is being committed and this broker leads nothing any more. "No leader"
            # sends TANK's client to retry, on the broker that takes over; nothing was appended, so nothing doubles.
            await self._answer_all(conn, req, ProduceStatus.NO_LEADER)
            return
        if broker.tiering is not None and not await broker.tiering.admission():
            # Uploads are stalled: refuse before appending rather than pile up records nobody can make durable.
            await self._answer_all(conn, req, ProduceStatus.SYSTEM)
            return
        registry = broker.registry
        read_only = broker.settings.read_only
        base_seqs = req.with_seqnum
        answers: list[TopicAnswer] = []
        pending: list[tuple[int, int, asyncio.Future]] = []  # (answer index, partition index, durable ack)
        i = 0  # the next bundle's index in `facts`
        for topic in req.topics:
            name = topic.name
            if read_only or name not in registry.topics:
                answers.append((name, ProduceStatus.READ_ONLY if read_only else ProduceStatus.UNKNOWN_TOPIC, None))
                i += len(topic.partitions)
                continue
            codes = bytearray()
            for p in topic.partitions:
                bundle_facts = facts[i]
                i += 1
                part = registry.get(name, p.partition)
                if part is None:
                    codes.append(ProduceStatus.UNKNOWN_PARTITION)
                    continue
                if part.fenced:
                    codes.append(ProduceStatus.NO_LEADER)
                    continue
                try:
                    appended = part.log.append(p.bundle, p.base_seq if base_seqs else None, bundle_facts)
                except InvalidSeqnums as exc:
                    log.info("produce %s/%d refused: %s", name, p.partition, exc)
                    codes.append(ProduceStatus.INVALID_SEQNUMS)
                    continue
                except OSError as exc:
                    log.error("produce %s/%d: append failed: %s", name, p.partition, exc)
                    codes.append(ProduceStatus.SYSTEM)
                    continue
                broker.metrics.produced(name, len(appended.record), bundle_facts.count)
                ack = broker.after_append(part, appended)
                if ack is not None:
                    pending.append((len(answers), len(codes), ack))
                codes.append(OK)
            answers.append((name, None, codes))
        if pending:
            # Wait outside the request loop so later requests on this connection are not held up by this one.
            conn.spawn(self._answer_when_durable(conn, req, answers, pending, started))
            return
        await self._send(conn, req, answers, started)

    async def _send(self, conn, req: ProduceRequest, answers: list[TopicAnswer], started: float) -> None:
        elapsed = time.monotonic() - started
        metrics = self.broker.metrics
        topics = self.broker.registry.topics
        for name in {name for name, _, _ in answers if name in topics}:  # never a label per unknown name
            metrics.ack_latency(name, elapsed)
        await conn.send(MsgType.PRODUCE, encode_produce_codes(req.request_id, answers))

    async def _answer_all(self, conn, req: ProduceRequest, status: int) -> None:
        topics = self.broker.registry.topics
        answers = [(t.name, None, bytearray([status]) * len(t.partitions)) if t.name in topics
                   else (t.name, ProduceStatus.UNKNOWN_TOPIC, None) for t in req.topics]
        await conn.send(MsgType.PRODUCE, encode_produce_codes(req.request_id, answers))

    async def _answer_when_durable(self, conn, req, answers: list[TopicAnswer], pending, started: float) -> None:
        for a_index, p_index, ack in pending:
            try:
                ok = await ack
            except Exception as exc:  # every failure of the durable path is answered, never lost
                log.error("durable ack failed for request %d: %s", req.request_id, exc)
                ok = False
            if not ok:
                answers[a_index][2][p_index] = ProduceStatus.SYSTEM
        await self._send(conn, req, answers, started)
