"""A small asyncio TANK client on tiered.protocol, used by the CLI, the tests, the benchmarks and replay.

One connection, requests pipelined and matched to responses by request id (a long-poll consume may be answered
after later requests). A request the broker would refuse (a bad topic name, partition or config: tiered.topic_rules,
the broker's own checks) raises InvalidRequest with the reason before anything is sent; CreateTopic's answer is one
byte, so this is where a user learns why. A produce that may or may not be committed (the broker answered 0x02 or
0x03, or nothing came within the caller's `timeout_s`) raises NotConfirmed. It chooses snappy as TANK's client does (more than 512 messages or more than 1 KiB of keys
and content), handles partial last bundles and sparse bundles, and turns TANK's status codes into exceptions.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import AsyncIterator, Iterable, Mapping, Sequence

from tiered.protocol import requests as rq
from tiered.protocol import responses as rs
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.chunk import read_chunk
from tiered.protocol.codes import UINT64_MAX, ConsumeStatus, CreateTopicStatus, ProduceStatus
from tiered.protocol.frame import FrameBuffer, MsgType, encode_frame
from tiered.storage.topic_config import ConfigError
from tiered.topic_rules import (
    check_config_text,
    validate_new_topic_name,
    validate_partition,
    validate_partition_count,
    validate_topic_name,
)

DEFAULT_FETCH_BYTES = 1 << 20
READ_BYTES = 256 * 1024


class TankError(Exception):
    """A status a request could not succeed with, named as TANK names it."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class InvalidRequest(TankError):
    """Not sent: the broker would refuse it. The message says what is wrong and what is allowed."""


class NotConfirmed(TankError):
    """A produce neither acknowledged nor refused: its messages may still be committed (or not). `reason` says what
    happened: the broker's answer (its ack timeout passed, or the block could not be committed) or the client's
    deadline."""

    def __init__(self, message: str, reason: str, code: int | None = None):
        super().__init__(message, code)
        self.reason = reason


class UnknownTopic(TankError):
    pass


class UnknownPartition(TankError):
    pass


class BoundaryError(TankError):
    def __init__(self, message: str, first_available: int, hwmark: int):
        super().__init__(message, ConsumeStatus.BOUNDARY)
        self.first_available = first_available
        self.hwmark = hwmark


@dataclass
class ConsumeResult:
    topic: str
    partition: int
    messages: list[Message]
    next_seq: int  # the seq to ask for next
    hwmark: int
    first_available: int = 0
    need_bytes: int = 0  # a larger fetch size is needed to read the next bundle whole
    drained: bool = False  # the response carried no data


def check_target(topic: str, partition: int | None = None) -> None:
    """Raises InvalidRequest for a topic name or partition no broker can have."""
    try:
        validate_topic_name(topic)
        if partition is not None:
            validate_partition(partition)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def as_messages(items: Iterable[Message | bytes | str]) -> list[Message]:
    out = []
    for item in items:
        if isinstance(item, Message):
            out.append(item)
        else:
            out.append(Message(item.encode() if isinstance(item, str) else bytes(item)))
    return out


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}  # by request id
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop())
        self._closed_exc: BaseException | None = None

    @classmethod
    async def connect(cls, host: str = "127.0.0.1", port: int = 11011, *, timeout_s: float = 10.0) -> "Client":
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 20), timeout_s)
        return cls(reader, writer)

    async def close(self) -> None:
        self._read_task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- transport --------------------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        frames = FrameBuffer()
        try:
            while True:
                got = frames.next_frame()
                if got is None:
                    data = await self.reader.read(READ_BYTES)
                    if not data:
                        raise ConnectionError("the broker closed the connection")
                    frames.feed(data)
                    continue
                msg_id, payload = got
                if msg_id != MsgType.PING:
                    self._deliver(msg_id, payload)
        except asyncio.CancelledError:
            self._fail_all(ConnectionError("client closed"))
            raise
        except BaseException as exc:  # every waiter learns why the connection ended
            self._fail_all(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))

    def _deliver(self, msg_id: int, payload: bytes) -> None:
        request_id = int.from_bytes(payload[4:8] if msg_id == MsgType.CONSUME else payload[0:4], "little")
        future = self._pending.pop(request_id, None)
        if future is None:
            raise ConnectionError(f"response to unknown request {request_id} (message 0x{msg_id:02x})")
        if not future.done():
            future.set_result(payload)

    def _fail_all(self, exc: BaseException) -> None:
        self._closed_exc = exc
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
        self._pending.clear()

    async def _call(self, msg_id: int, request_id: int, payload: bytes, timeout_s: float | None = None):
        if self._closed_exc is not None:
            raise ConnectionError(f"connection is closed: {self._closed_exc}")
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self.writer.write(encode_frame(msg_id, payload))
        await self.writer.drain()
        if timeout_s is None:
            return await future
        return await asyncio.wait_for(future, timeout_s)

    # -- produce ----------------------------------------------------------------------------------------------

    async def produce(self, topic: str, partition: int, messages: Iterable[Message | bytes | str], *,
                      codec: int | None = None, timeout_s: float | None = None) -> None:
        """Produces one bundle; raises TankError unless the broker acknowledged it (NotConfirmed when the outcome is
        unknown, including no answer within `timeout_s`)."""
        statuses = await self.produce_many({(topic, partition): as_messages(messages)}, codec=codec,
                                           timeout_s=timeout_s)
        _raise_for_produce(topic, partition, statuses[(topic, partition)])

    async def produce_many(self, bundles: Mapping[tuple[str, int], Sequence[Message]], *, codec: int | None = None,
                           timeout_s: float | None = None) -> dict[tuple[str, int], int]:
        """One request with one bundle per partition; returns each partition's ProduceStatus."""
        by_topic: dict[str, list[rq.ProducePartition]] = {}
        for (topic, partition), messages in bundles.items():
            bundle = encode_bundle(list(messages), codec=codec)
            by_topic.setdefault(topic, []).append(rq.ProducePartition(partition, bundle))
        return await self._produce(by_topic, with_seqnum=False, timeout_s=timeout_s)

    async def produce_with_seqnum(self, topic: str, partition: int, messages: Sequence[Message], *,
                                  codec: int | None = None, timeout_s: float | None = None) -> None:
        """ProduceWithSeqnum (0x05): keeps each message's `seq`, as TANK's client does, in a sparse bundle."""
        bundle = encode_bundle(list(messages), codec=codec, sparse=True)
        part = rq.ProducePartition(partition, bundle, messages[0].seq)
        statuses = await self._produce({topic: [part]}, with_seqnum=True, timeout_s=timeout_s)
        _raise_for_produce(topic, partition, statuses[(topic, partition)])

    async def produce_raw(self, topic: str, partition: int, bundle: bytes, base_seq: int | None = None) -> int:
        statuses = await self._produce({topic: [rq.ProducePartition(partition, bundle, base_seq)]},
                                       with_seqnum=base_seq is not None)
        return statuses[(topic, partition)]

    async def _produce(self, by_topic, *, with_seqnum: bool, timeout_s: float | None = None,
                       ) -> dict[tuple[str, int], int]:
        for name, parts in by_topic.items():
            for part in parts:
                check_target(name, part.partition)
        request_id = next(self._ids)
        topics = tuple(rq.ProduceTopic(name, tuple(parts)) for name, parts in by_topic.items())
        req = rq.ProduceRequest(request_id, topics, with_seqnum=with_seqnum)
        msg_id = MsgType.PRODUCE_WITH_SEQNUM if with_seqnum else MsgType.PRODUCE
        try:
            payload = await self._call(msg_id, request_id, rq.encode_produce_request(req), timeout_s)
        except asyncio.TimeoutError:
            where = ", ".join(f"{t.name}/{p.partition}" for t in topics for p in t.partitions)
            raise NotConfirmed(f"produce to {where} not confirmed within {timeout_s:g} s",
                               f"no answer within {timeout_s:g} s") from None
        resp = rs.read_produce_response(payload, req)
        out: dict[tuple[str, int], int] = {}
        for topic, result in zip(topics, resp.topics):
            for i, part in enumerate(topic.partitions):
                out[(topic.name, part.partition)] = result.status if result.status is not None else result.partitions[i].code
        return out

    # -- consume ----------------------------------------------------------------------------------------------

    async def consume(self, topic: str, partition: int, seq: int, *, fetch_bytes: int = DEFAULT_FETCH_BYTES,
                      max_wait_ms: int = 0, min_bytes: int = 0) -> ConsumeResult:
        """One consume of one partition. Raises BoundaryError below the first available seq."""
        got = await self.consume_many([(topic, partition, seq, fetch_bytes)], max_wait_ms=max_wait_ms,
                                      min_bytes=min_bytes)
        return got[(topic, partition)]

    async def consume_many(self, wanted: Sequence[tuple[str, int, int, int]], *, max_wait_ms: int = 0,
                           min_bytes: int = 0, timeout_s: float | None = None) -> dict[tuple[str, int], ConsumeResult]:
        for topic, partition, _, _ in wanted:
            check_target(topic, partition)
        request_id = next(self._ids)
        by_topic: dict[str, list[rq.ConsumePartition]] = {}
        for topic, partition, seq, fetch_bytes in wanted:
            by_topic.setdefault(topic, []).append(rq.ConsumePartition(partition, seq, fetch_bytes))
        req = rq.ConsumeRequest(request_id, max_wait_ms, min_bytes,
                                tuple(rq.ConsumeTopic(n, tuple(ps)) for n, ps in by_topic.items()))
        if timeout_s is None and max_wait_ms:
            timeout_s = min(max_wait_ms, 3_600_000) / 1000.0 + 30.0
        payload = await self._call(MsgType.CONSUME, request_id, rq.encode_consume_request(req), timeout_s)
        resp = rs.read_consume_response(payload)
        requested = {(t, p): seq for t, p, seq, _ in wanted}
        out: dict[tuple[str, int], ConsumeResult] = {}
        chunks = iter(resp.chunks)
        for topic in resp.topics:
            if topic.partitions is None:
                raise UnknownTopic(f"unknown topic {topic.name!r}", ProduceStatus.UNKNOWN_TOPIC)
            for p in topic.partitions:
                key = (topic.name, p.partition)
                seq = requested.get(key, 0)
                out[key] = _consume_result(topic.name, p, seq, chunks)
        return out

    async def tail(self, topic: str, partition: int, seq: int = UINT64_MAX, *, fetch_bytes: int = DEFAULT_FETCH_BYTES,
                   max_wait_ms: int = 5000, min_bytes: int = 0) -> AsyncIterator[Message]:
        """Every message from `seq` on (UINT64_MAX: only new ones), waiting for more at the tail."""
        async for batch in self.tail_batches(topic, partition, seq, fetch_bytes=fetch_bytes, max_wait_ms=max_wait_ms,
                                             min_bytes=min_bytes):
            for m in batch:
                yield m

    async def tail_batches(self, topic: str, partition: int, seq: int = UINT64_MAX, *,
                           fetch_bytes: int = DEFAULT_FETCH_BYTES, max_wait_ms: int = 5000, min_bytes: int = 0,
                           ) -> AsyncIterator[list[Message]]:
        """As `tail`, one list per consume response that carried messages (a writer flushes between them)."""
        while True:
            got = await self.consume(topic, partition, seq, fetch_bytes=fetch_bytes, max_wait_ms=max_wait_ms,
                                     min_bytes=min_bytes)
            if got.messages:
                yield got.messages
            seq = got.next_seq
            if got.need_bytes > fetch_bytes:
                fetch_bytes = got.need_bytes

    async def drain(self, topic: str, partition: int, seq: int = 0, end_seq: int | None = None, *,
                    fetch_bytes: int = DEFAULT_FETCH_BYTES) -> AsyncIterator[Message]:
        """Every message from `seq` up to the hwmark at the time of each fetch (or `end_seq`), then stops."""
        while True:
            got = await self.consume(topic, partition, seq, fetch_bytes=fetch_bytes)
            for m in got.messages:
                if end_seq is not None and m.seq > end_seq:
                    return
                yield m
            if got.need_bytes > fetch_bytes:
                fetch_bytes = got.need_bytes
            elif got.drained or not got.messages and got.next_seq > got.hwmark:
                return
            seq = got.next_seq
            if end_seq is not None and seq > end_seq:
                return

    # -- administration ---------------------------------------------------------------------------------------

    async def discover_partitions(self, topic: str, partitions: Sequence[int] | None = None) -> list[rs.PartitionRange]:
        check_target(topic)
        request_id = next(self._ids)
        req = rq.DiscoverPartitionsRequest(request_id, topic, tuple(partitions) if partitions is not None else None)
        payload = await self._call(MsgType.DISCOVER_PARTITIONS, request_id, rq.encode_discover_partitions_request(req))
        resp = rs.read_discover_partitions_response(payload)
        if not resp.partitions:
            raise UnknownTopic(f"unknown topic {topic!r}")
        return list(resp.partitions)

    async def discover_topics(self) -> list[rs.TopicInfo]:
        request_id = next(self._ids)
        req = rq.DiscoverTopicsRequest(request_id)
        payload = await self._call(MsgType.DISCOVER_TOPICS, request_id, rq.encode_discover_topics_request(req))
        return list(rs.read_discover_topics_response(payload).topics)

    async def discover_topology(self) -> rs.DiscoverTopologyResponse:
        request_id = next(self._ids)
        req = rq.DiscoverTopologyRequest(request_id)
        payload = await self._call(MsgType.DISCOVER_TOPOLOGY, request_id, rq.encode_discover_topology_request(req))
        return rs.read_discover_topology_response(payload)

    async def create_topic(self, topic: str, partitions: int, config: Mapping[str, str] | str = "") -> int:
        """Returns the CreateTopicStatus; raises InvalidRequest (unsent) for a name, partition count or config the
        broker would refuse, with the reason, and TankError for every other status but OK and EXISTS."""
        if isinstance(config, Mapping):
            config = "".join(f"{k}={v}\n" for k, v in config.items())
        try:
            validate_new_topic_name(topic)
            validate_partition_count(partitions)
            check_config_text(config)
        except ConfigError as exc:
            raise InvalidRequest(f"topic {topic!r}: {exc}") from None
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        request_id = next(self._ids)
        req = rq.CreateTopicRequest(request_id, topic, partitions, config.encode())
        payload = await self._call(MsgType.CREATE_TOPIC, request_id, rq.encode_create_topic_request(req))
        status = rs.read_create_topic_response(payload).status
        if status not in (CreateTopicStatus.OK, CreateTopicStatus.EXISTS):
            why = _CREATE_REFUSALS.get(status) or f"status 0x{status:02x}"
            raise TankError(f"create topic {topic!r}: {why}", status)
        return status

    async def reload_conf(self, topic: str, partition: int) -> int:
        request_id = next(self._ids)
        req = rq.ReloadConfRequest(request_id, topic, partition)
        payload = await self._call(MsgType.RELOAD_CONF, request_id, rq.encode_reload_conf_request(req))
        return rs.read_reload_conf_response(payload).status

    async def status(self) -> rs.StatusResponse:
        request_id = next(self._ids)
        req = rq.StatusRequest(request_id)
        payload = await self._call(MsgType.STATUS, request_id, rq.encode_status_request(req))
        return rs.read_status_response(payload)


_CREATE_REFUSALS = {
    CreateTopicStatus.SYSTEM: "the broker could not create it (its log says why)",
    CreateTopicStatus.BAD_CONFIG: "the broker refused its config (its log says why)",
    CreateTopicStatus.READ_ONLY: "the broker is read-only (started with -r)",
    CreateTopicStatus.INVALID: "the broker refused the name or partition count",
    CreateTopicStatus.UNSUPPORTED: "the broker does not create topics (cluster mode)",
}


def _consume_result(topic: str, p, seq: int, chunks) -> ConsumeResult:
    if p.status == ConsumeStatus.UNKNOWN_PARTITION:
        raise UnknownPartition(f"unknown partition {topic}/{p.partition}", p.status)
    if p.status == ConsumeStatus.BOUNDARY:
        raise BoundaryError(
            f"seq {seq} of {topic}/{p.partition} is outside {p.first_available}..{p.hwmark + 1}",
            p.first_available, p.hwmark,
        )
    if p.status not in (ConsumeStatus.OK, ConsumeStatus.SPARSE):
        raise TankError(f"consume {topic}/{p.partition}: status 0x{p.status:02x}", p.status)
    if not p.chunk_len:
        # EOF: base is first_available (immediate) or 0 (timed out); either way the tail is hwmark + 1.
        next_seq = p.hwmark + 1 if seq in (0, UINT64_MAX) else seq
        return ConsumeResult(topic, p.partition, [], next_seq, p.hwmark, first_available=p.base_seq, drained=True)
    chunk = next(chunks)
    base = None if p.status == ConsumeStatus.SPARSE else p.base_seq
    start = 0 if seq == UINT64_MAX else seq
    read = read_chunk(chunk, base, start, p.hwmark)
    next_seq = read.next_seq or (seq if seq not in (0, UINT64_MAX) else read.first_seq)
    return ConsumeResult(topic, p.partition, read.messages, next_seq, p.hwmark, need_bytes=read.need_bytes)


def _raise_for_produce(topic: str, partition: int, status: int) -> None:
    if status == ProduceStatus.OK:
        return
    if status == ProduceStatus.UNKNOWN_TOPIC:
        raise UnknownTopic(f"unknown topic {topic!r}", status)
    if status == ProduceStatus.UNKNOWN_PARTITION:
        raise UnknownPartition(f"unknown partition {topic}/{partition}", status)
    name = ProduceStatus(status).name.lower() if status in ProduceStatus._value2member_map_ else f"0x{status:02x}"
    if status == ProduceStatus.ACK_TIMEOUT:
        raise NotConfirmed(f"produce to {topic}/{partition} not confirmed: the broker answered {name}",
                           "the broker answered ack timeout (appended, but its block was not committed in time; the "
                           "block keeps retrying)", status)
    # 0x02 (nothing was appended) and 0xfd (not led here, or fenced before the commit): not stored, safe to resend.
    raise TankError(f"produce to {topic}/{partition} failed: {name}", status)
