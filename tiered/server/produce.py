"""Produce (0x01) and ProduceWithSeqnum (0x05), both answered with message id 0x01 (docs/protocol.md §3.1, §3.2).

Every bundle of the request is validated completely (read_checked_produce: header, snappy block, every message,
count, no trailing bytes) before the request reaches this handler, so a malformed request changes nothing: its
ProtocolError closes that connection only (connection.py), and no bad bundle ever reaches a log, a block or a
consumer. Appends happen in request order. The answer is kept as plain status bytes per request topic and encoded
with encode_produce_codes: a produce request costs no result objects. A plain request costs no coroutine at all:
`handle` is a plain function that answers it, and returns a coroutine for the request task to await only when it must
wait (admission when the pipeline is full, the tier's produce_calls.admits_now; a send when the connection does not
take the answer without waiting, Connection.try_send_frame; the durable acks wait in a task of their own). The
commonest answer (one topic, a plain code per partition) is framed whole in one native call
(responses.produce_codes_frame).

What a partition's answer means (docs/operations.md, "What a produce answer means"):
- 0x00: stored. On a durable topic: in the bucket and the catalog (its block is committed).
- 0x03 (ack timeout): appended, but its block was not committed within the deadline (the request's own
  ack_timeout when it names one, else `produce_ack_timeout_ms`). The block keeps retrying, so the records may
  still become visible: a producer that sends them again may store them twice; check the partition's seqs first.
- 0xfc (other leader) + endpoint: not stored: the partition is led by the broker named; send it there.
- 0xfd (no leader): not stored, and never will be (no broker leads the partition this moment, this broker's lease
  is not renewed in time, or the partition was fenced before the records were committed): safe to send again.
- 0x02 (system): not stored: nothing was appended (uploads stalled past the deadline before the append, or the
  local append failed).
- 0xfe (read-only, for the whole topic): not stored: the broker is read-only, or the access rules do not let this
  client produce to the topic (tiered.server.access).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NamedTuple

from tiered import metrics as m
from tiered.acl import Op
from tiered.metrics import LATENCY_BUCKETS_S
from tiered.protocol.bundle import BundleFacts
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType, encode_frame
from tiered.protocol.requests import ProduceRequest, read_checked_produce
from tiered.protocol.responses import (
    PartitionStatus,
    ProduceResponse,
    ProduceTopicResult,
    encode_produce_codes,
    encode_produce_response,
    produce_codes_frame,
)
from tiered.server.leaders import redirect_endpoint
from tiered.server.registry import Role
from tiered.storage.appender import PRODUCE_PATH_ENV
from tiered.storage.partition_log import InvalidSeqnums, log_append_for
from tiered.tier_interface import AckOutcome, ProduceCalls

log = logging.getLogger("tiered.server")

_append_request_native: Callable[..., tuple | None] | None
_produce_payload_native: Callable[..., tuple | None] | None
try:
    from tiered.server._produce import append_request as _append_request_native
    from tiered.server._produce import produce_payload as _produce_payload_native
except ImportError:  # built without a C compiler: the handler's loop serves
    _append_request_native = _produce_payload_native = None

# Python 3.11's EnumType defines __getattr__, so every `Enum.MEMBER` read is a call through it (~850 instructions,
# measured with callgrind): the produce path reads members bound once here.
OK = ProduceStatus.OK
_read_checked_produce = read_checked_produce  # read per request: a module global, not an attribute of the module
LEADER = Role.LEADER
PRODUCE = MsgType.PRODUCE
MAX_ACK_TIMEOUT_MS = 300_000  # a request may ask for a longer wait than the broker's default, up to this
OUTCOME_STATUS = {
    AckOutcome.COMMITTED: ProduceStatus.OK,
    AckOutcome.NOT_CONFIRMED: ProduceStatus.ACK_TIMEOUT,
    AckOutcome.REFUSED: ProduceStatus.NO_LEADER,
}
# One request topic's answer: (name, topic-level status or None, one partition-level status byte per partition).
TopicAnswer = tuple[str, "int | None", bytearray]


class NativeContext(NamedTuple):
    """What _produce.produce_payload works with, read once rather than per request (its 9 arguments cost ~2k
    instructions a request in attribute reads). Each is its owner's for the broker's whole life (made once by its
    constructor), but for the tier's calls, which start() and join() replace: the context is made again when
    `tier_calls` is no longer the tier's (ProduceHandler.handle_payload). The last three count the ack latency of a
    request the call answers with its frame, as Metrics.ack_latency would: the broker's clock's `monotonic`, the
    metrics' histograms (Metrics.latency) and their bounds (metrics.LATENCY_BUCKETS_S)."""

    tier_calls: ProduceCalls  # the tier's calls it was made from
    registry_topics: dict
    leader: Role
    tier_appended: Callable[..., Any]
    visible: Callable[..., Any]
    waiting: Mapping
    produced_bytes: dict
    produced_msgs: dict
    failed: Callable[..., int]
    log_append: Callable[..., Any]
    monotonic: Callable[[], float]
    latency: dict
    latency_bounds: tuple[float, ...]


def append_request_for(path: str | None = None) -> Callable[..., tuple | None] | None:
    """The native appends of a whole request (_produce.append_request), or None: the handler's own loop serves, as it
    does with `path` "python" or the environment's TIERED_PRODUCE_PATH=python (as the appender and the builder)."""
    return None if _python_path(path) else _append_request_native


def produce_payload_for(path: str | None = None) -> Callable[..., tuple | None] | None:
    """The native read, appends and answer of a request from its payload (_produce.produce_payload), or None (as
    append_request_for): read_checked_produce and `handle` serve."""
    return None if _python_path(path) else _produce_payload_native


def _python_path(path: str | None) -> bool:
    return (path or os.environ.get(PRODUCE_PATH_ENV, "native")) == "python"


class ProduceHandler:
    def __init__(self, broker, path: str | None = None):
        self.broker = broker
        self._append_request = append_request_for(path)
        self._produce_payload = produce_payload_for(path)
        self._log_append = log_append_for(path)
        self._context: NativeContext | None = None  # made at the first request (the tier's calls are set by then)

    def handle_payload(self, conn, payload: bytes | bytearray,
                       with_seqnum: bool) -> Coroutine[Any, Any, None] | None:
        """A produce frame's payload, read (ProtocolError: nothing appended, the connection closes), appended and
        answered, as `handle` answers read_checked_produce's request; the request task's call (Connection.run).

        The commonest request (this broker may acknowledge and admits at once, no access rules, not read-only, every
        topic known and every partition led here) is read, appended and framed in one native call
        (_produce.produce_payload), which builds no request objects and counts the ack latency of the answer it
        frames; what is left here is the lease and admission checks and the send. Anything else, or a payload the
        call does not take (None: nothing appended), goes through read_checked_produce and `handle`."""
        broker = self.broker
        native = self._produce_payload
        if native is None or broker.stopping or broker.settings.read_only or broker.access.active:
            req, facts = _read_checked_produce(payload, with_seqnum)
            return self.handle(conn, req, facts)
        tier_calls = broker.tier.produce_calls
        started = broker.clock.monotonic()
        # The lease: this request's own clock read against the deadline its owner keeps (AckDeadline), no call.
        if started >= tier_calls.ack_deadline.until or not tier_calls.admits_now():
            req, facts = _read_checked_produce(payload, with_seqnum)
            return self.handle(conn, req, facts)
        context = self._context
        if context is None or context.tier_calls is not tier_calls:
            context = self._context = self._native_context(tier_calls)
        done = native(payload, with_seqnum, context, started)
        if done is None:
            req, facts = _read_checked_produce(payload, with_seqnum)
            return self.handle(conn, req, facts, started)  # checked and admitted above
        answers, pending, frame, request_id, ack_timeout_ms = done
        if frame is None:  # else the call counted the ack latency (one topic, answered now)
            if pending:
                conn.spawn(self._answer_when_durable(conn, request_id, ack_timeout_ms, answers, pending, started, {}))
                return None
            self._count_latency(answers, started)
            frame = self._frame(request_id, answers, None)
        if conn.try_send_frame(frame):
            return None
        return conn.send_frame(frame)

    def handle(self, conn, req: ProduceRequest, facts: list[BundleFacts],
               started: float | None = None) -> Coroutine[Any, Any, None] | None:
        """`facts`: each bundle's, in request order (read_checked_produce validated them all). None when the request
        was answered here and now, as almost every one is: no coroutine is made for it. Otherwise the coroutine the
        connection's request task awaits (Connection.run): an answer that must wait (shutting down, the lease not
        renewed, the upload pipeline full, the connection not taking writes). `started` is given only by
        _produce_when_admitted: the request was looked at and admitted already, and is appended now.

        Appends every partition's bundle in request order and answers: None when the answer is queued (or a task of
        its own waits for durable acks), else the send to await."""
        broker = self.broker
        tier_calls = broker.tier.produce_calls  # the tier's calls, bound to what answers them (ProduceCalls)
        if started is None:
            started = broker.clock.monotonic()
            if broker.stopping:
                # Shutting down: the open block is being committed and this broker leads nothing any more. "No
                # leader" sends TANK's client to retry, on the broker that takes over; nothing was appended, so
                # nothing doubles.
                return self._answer_all(conn, req, ProduceStatus.NO_LEADER)
            if started >= tier_calls.ack_deadline.until:
                # This broker's lease was not renewed in time: another may be taking its partitions over. Nothing is
                # appended; TANK's client retries, and finds the partition's leader.
                return self._answer_all(conn, req, ProduceStatus.NO_LEADER)
            if not tier_calls.admits_now():
                return self._produce_when_admitted(conn, req, facts, started)

        # Checked and admitted: the appends and the answer, in this frame (one Python call per request).
        registry_topics = broker.registry.topics
        tier_appended = tier_calls.appended
        visible = broker.waiters.visible
        produced = broker.metrics.produced
        read_only = broker.settings.read_only
        access = broker.access if broker.access.active else None
        base_seqs = req.with_seqnum
        redirects: dict[tuple[int, int], object] = {}  # (answer index, partition index) -> the leader's endpoint
        # The commonest request (every topic known, every partition led here, no access rules): the loop below in
        # one native call (_produce.append_request), or None with nothing appended and the loop decides.
        done = None if self._append_request is None or access is not None or read_only else self._append_request(
            req.topics, facts, base_seqs, registry_topics, LEADER, tier_appended, visible, broker.waiters.waiting,
            broker.metrics.produced_bytes, broker.metrics.produced_msgs, self._append_failed, self._log_append)
        if done is not None:
            answers, pending = done
        else:
            answers, pending = self._append_each(conn, req, facts, registry_topics, tier_appended, visible, produced,
                                                 read_only, access, redirects)
        if pending:
            # Wait outside the request loop so later requests on this connection are not held up by this one.
            conn.spawn(self._answer_when_durable(conn, req.request_id, req.ack_timeout_ms, answers, pending, started,
                                                 redirects))
            return None
        self._count_latency(answers, started)
        frame = self._frame(req.request_id, answers, redirects)
        if conn.try_send_frame(frame):
            return None
        return conn.send_frame(frame)

    def _native_context(self, tier_calls) -> NativeContext:
        broker = self.broker
        metrics = broker.metrics
        return NativeContext(tier_calls, broker.registry.topics, LEADER, tier_calls.appended, broker.waiters.visible,
                             broker.waiters.waiting, metrics.produced_bytes, metrics.produced_msgs,
                             self._append_failed, self._log_append, broker.clock.monotonic, metrics.latency,
                             LATENCY_BUCKETS_S)

    def _append_each(self, conn, req: ProduceRequest, facts: list[BundleFacts], registry_topics, tier_appended,
                     visible, produced, read_only: bool, access,
                     redirects: dict) -> tuple[list[TopicAnswer], list[tuple[int, int, asyncio.Future]]]:
        """The appends of a request, partition by partition in request order, and its answers: the reference of
        _produce.append_request, and the path of every request it does not take (an unknown topic or partition, a
        partition led elsewhere, access rules, a read-only broker). Fills `redirects`."""
        broker = self.broker
        base_seqs = req.with_seqnum
        answers: list[TopicAnswer] = []
        pending: list[tuple[int, int, asyncio.Future]] = []  # (answer index, partition index, durable ack)
        i = 0  # the next bundle's index in `facts`
        for topic in req.topics:
            name = topic.name
            if access is not None and not access.allows(conn, Op.PRODUCE, name):
                answers.append((name, ProduceStatus.READ_ONLY, None))  # TANK's nearest "not taken here"
                i += len(topic.partitions)
                continue
            local = None if read_only else registry_topics.get(name)
            if local is None:
                answers.append((name, ProduceStatus.READ_ONLY if read_only else ProduceStatus.UNKNOWN_TOPIC, None))
                i += len(topic.partitions)
                continue
            parts = local.partitions
            codes = bytearray()
            for p in topic.partitions:
                bundle_facts = facts[i]
                i += 1
                index = p.partition
                part = parts[index] if 0 <= index < len(parts) else None
                if part is None:
                    codes.append(ProduceStatus.UNKNOWN_PARTITION)
                    continue
                if part.role is not LEADER:
                    broker.metrics.inc(m.REDIRECTS)
                    if part.leader is None:
                        codes.append(ProduceStatus.NO_LEADER)
                    else:
                        redirects[(len(answers), len(codes))] = redirect_endpoint(part.leader, conn.plaintext,
                                                                                  broker.advertised_host)
                        codes.append(ProduceStatus.OTHER_LEADER)
                    continue
                try:
                    appended = part.log.append(p.bundle, p.base_seq if base_seqs else None, bundle_facts, p.record)
                except (InvalidSeqnums, OSError) as exc:
                    codes.append(self._append_failed(name, p.partition, exc))
                    continue
                record_len = len(appended.record)
                produced(name, record_len, bundle_facts.messages)
                # The tier takes the record (its block, and on a durable topic the ack's future). A topic that is not
                # durable shows it at once, as standalone TANK does (visibility follows durability).
                durable = part.durable
                ack = tier_appended(part.tp, appended, durable)
                if not durable:
                    visible(part.tp, appended.first_seq, record_len)
                if ack is not None:
                    pending.append((len(answers), len(codes), ack))
                codes.append(OK)
            answers.append((name, None, codes))
        return answers, pending

    @staticmethod
    def _append_failed(name: str, partition: int, exc: BaseException) -> int:
        """The code of an append the log refused (logged here), or `exc` raised again when it is not one."""
        if isinstance(exc, InvalidSeqnums):
            log.info("produce %s/%d refused: %s", name, partition, exc)
            return ProduceStatus.INVALID_SEQNUMS
        if isinstance(exc, OSError):
            log.error("produce %s/%d: append failed: %s", name, partition, exc)
            return ProduceStatus.SYSTEM
        raise exc

    async def _produce_when_admitted(self, conn, req: ProduceRequest, facts: list[BundleFacts],
                                     started: float) -> None:
        broker = self.broker
        if not await broker.tier.admission():
            # Uploads are stalled: refuse before appending rather than pile up records nobody can make durable.
            await self._answer_all(conn, req, ProduceStatus.SYSTEM)
            return
        if broker.stopping or not broker.tier.produce_calls.ack_deadline.allows(broker.clock.monotonic()):
            # The wait for admission may have outlasted the lease (or the broker began to stop): checked again, as
            # `handle` checked it before the wait, so that nothing is acknowledged past the lease's deadline.
            await self._answer_all(conn, req, ProduceStatus.NO_LEADER)
            return
        waiting = self.handle(conn, req, facts, started)
        if waiting is not None:
            await waiting

    def _count_latency(self, answers: list[TopicAnswer], started: float) -> None:
        """Counts the request's ack latency once per known topic it names."""
        elapsed = self.broker.clock.monotonic() - started
        metrics = self.broker.metrics
        topics = self.broker.registry.topics
        if len(answers) == 1:
            if answers[0][0] in topics:
                metrics.ack_latency(answers[0][0], elapsed)
        else:
            for name in {name for name, _, _ in answers if name in topics}:  # never a label per unknown name
                metrics.ack_latency(name, elapsed)

    @staticmethod
    def _frame(request_id: int, answers: list[TopicAnswer], redirects: dict | None) -> bytes:
        """The response's whole frame."""
        if redirects:
            return encode_frame(PRODUCE, encode_produce_response(_with_leaders(request_id, answers, redirects)))
        if len(answers) == 1 and answers[0][1] is None:  # the commonest answer, framed in one native call
            frame = produce_codes_frame(request_id, answers[0][2])
            if frame is not None:
                return frame
        return encode_frame(PRODUCE, encode_produce_codes(request_id, answers))

    async def _answer_all(self, conn, req: ProduceRequest, status: int) -> None:
        topics = self.broker.registry.topics
        answers = [(t.name, None, bytearray([status]) * len(t.partitions)) if t.name in topics
                   else (t.name, ProduceStatus.UNKNOWN_TOPIC, None) for t in req.topics]
        await conn.send(MsgType.PRODUCE, encode_produce_codes(req.request_id, answers))

    def _ack_timeout_s(self, ack_timeout_ms: int) -> float:
        """The request's own ack timeout (0: none named), else the broker's."""
        if ack_timeout_ms:
            return min(ack_timeout_ms, MAX_ACK_TIMEOUT_MS) / 1000.0
        return self.broker.settings.produce_ack_timeout_ms / 1000.0

    async def _answer_when_durable(self, conn, request_id: int, ack_timeout_ms: int, answers: list[TopicAnswer],
                                   pending, started: float, redirects: dict) -> None:
        clock = self.broker.clock
        acks = {ack for _, _, ack in pending}
        timeout_s = self._ack_timeout_s(ack_timeout_ms)
        timer = asyncio.ensure_future(clock.sleep(max(0.0, started + timeout_s - clock.monotonic())))
        try:
            while not timer.done() and not all(ack.done() for ack in acks):
                await asyncio.wait({*(a for a in acks if not a.done()), timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        not_confirmed = 0
        for a_index, p_index, ack in pending:
            outcome = ack.result() if ack.done() and not ack.cancelled() else AckOutcome.NOT_CONFIRMED
            if outcome is AckOutcome.NOT_CONFIRMED:
                not_confirmed += 1
            answers[a_index][2][p_index] = OUTCOME_STATUS[outcome]
        if not_confirmed:
            self.broker.metrics.inc(m.ACK_TIMEOUTS, not_confirmed)
            trouble = self.broker.tier.durable_trouble()
            log.error("request %d: %d durable produces not confirmed within %.1f s (answered 0x03; their block "
                      "keeps retrying)%s", request_id, not_confirmed, timeout_s, f": {trouble}" if trouble else "")
        self._count_latency(answers, started)
        await conn.send_frame(self._frame(request_id, answers, redirects))


def _with_leaders(request_id: int, answers: list[TopicAnswer], redirects: dict) -> ProduceResponse:
    """The answer as result objects, for the rare response that names other leaders (their endpoints follow 0xfc)."""
    topics = []
    for a_index, (name, status, codes) in enumerate(answers):
        if status is not None:
            topics.append(ProduceTopicResult(name, status, ()))
            continue
        topics.append(ProduceTopicResult(name, None, tuple(
            PartitionStatus(code, redirects.get((a_index, p_index))) for p_index, code in enumerate(codes))))
    return ProduceResponse(request_id, tuple(topics))
