"""Small fake brokers of one service, for the client's redirect following (`fake_cluster` fixture).

Each FakeBroker is an asyncio server on 127.0.0.1 that pings on accept as the broker does, reads real request frames
with tiered.protocol and answers real response bytes built with its encoders. The brokers share one FakeCluster:
its topics, the messages stored per partition, and each broker's own view of who leads what (`leaders`: a partition
absent from it is led by that broker; an Endpoint: led there, answered 0xfc; None: no leader, 0xfd). As issue 10
says: produce goes to the leader only; a consume of history (a seq at or below the high-water mark) is served by any
broker, one at the tail only by the leader, which long-polls; DiscoverPartitions answers the partitions led here.

Every request is recorded (`requests`) before it is answered. `hold(msg_id)` makes a broker read the next such
request and close the connection instead of answering (an answer lost after the request was written);
`before_answer` is called with each request so that a test can change the cluster at a precise point.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

import pytest

from tiered.protocol import requests as rq
from tiered.protocol import responses as rs
from tiered.protocol.bundle import bundle_facts, encode_record
from tiered.protocol.codes import UINT64_MAX, ConsumeStatus, DiscoverReason, Endpoint, ProduceStatus
from tiered.protocol.frame import FrameBuffer, MsgType, encode_frame

Key = tuple[str, int]
LEADS_HERE = object()


@dataclass
class Stored:
    records: list[tuple[int, bytes]] = field(default_factory=list)  # (first seq, record) in seq order
    hwmark: int = 0
    grew: asyncio.Event = field(default_factory=asyncio.Event)


class FakeCluster:
    def __init__(self) -> None:
        self.topics: dict[str, int] = {}  # name -> partition count
        self.data: dict[Key, Stored] = {}
        self.brokers: list[FakeBroker] = []

    def create(self, topic: str, partitions: int) -> None:
        self.topics[topic] = partitions
        for p in range(partitions):
            self.data[(topic, p)] = Stored()

    def messages(self, key: Key) -> int:
        return self.data[key].hwmark

    async def start(self, name: str) -> "FakeBroker":
        broker = FakeBroker(self, name)
        await broker.start()
        self.brokers.append(broker)
        return broker

    def lead(self, key: Key, leader: "FakeBroker | Endpoint | None") -> None:
        """Every broker's view: `leader` leads `key` (None: nobody does)."""
        endpoint = leader.endpoint if isinstance(leader, FakeBroker) else leader
        for b in self.brokers:
            b.leaders[key] = LEADS_HERE if endpoint == b.endpoint else endpoint

    def lead_later(self, key: Key, leader: "FakeBroker | None", *, when: "FakeBroker", msg_id: int, count: int) -> None:
        """`leader` leads `key` once `when` has received `count` requests of `msg_id` (from that one's answer on)."""

        def elect(broker: FakeBroker, got_msg_id: int, request) -> None:
            if broker.count(msg_id) == count:
                self.lead(key, leader)

        when.before_answer = elect

    async def stop(self) -> None:
        for b in self.brokers:
            await b.stop()


class FakeBroker:
    def __init__(self, cluster: FakeCluster, name: str):
        self.cluster = cluster
        self.name = name
        self.leaders: dict[Key, object] = {}  # LEADS_HERE (also when absent), an Endpoint, or None
        self.requests: list[tuple[int, object]] = []
        self.arrivals: list[float] = []  # loop time of each request, as `requests`
        self.before_answer: Callable[["FakeBroker", int, object], None] | None = None
        self._held: set[int] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)

    def __str__(self) -> str:
        return f"127.0.0.1:{self.port}"

    def count(self, msg_id: int) -> int:
        return len(self.received(msg_id))

    def received(self, msg_id: int) -> list:
        return [r for m, r in self.requests if m == msg_id]

    def hold(self, msg_id: int) -> None:
        self._held.add(msg_id)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stops listening and drops every connection: its port refuses from now on."""
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        answering: set[asyncio.Task] = set()
        writer.write(encode_frame(MsgType.PING, b""))
        frames = FrameBuffer()
        try:
            while True:
                got = frames.next_frame()
                if got is None:
                    data = await reader.read(65536)
                    if not data:
                        return
                    frames.feed(data)
                    continue
                msg_id, payload = got
                request = _read_request(msg_id, payload)
                self.requests.append((msg_id, request))
                self.arrivals.append(asyncio.get_running_loop().time())
                if msg_id in self._held:
                    self._held.discard(msg_id)
                    return  # read, never answered: the connection ends
                if self.before_answer is not None:
                    self.before_answer(self, msg_id, request)
                answer = asyncio.ensure_future(self._answer(msg_id, request, writer))
                answering.add(answer)
                answer.add_done_callback(answering.discard)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for answer in answering:
                answer.cancel()
            writer.close()
            self._tasks.discard(task)

    async def _answer(self, msg_id: int, request, writer: asyncio.StreamWriter) -> None:
        if msg_id in (MsgType.PRODUCE, MsgType.PRODUCE_WITH_SEQNUM):
            writer.write(encode_frame(MsgType.PRODUCE, self._produce(request)))
        elif msg_id == MsgType.CONSUME:
            writer.write(encode_frame(MsgType.CONSUME, await self._consume(request)))
        elif msg_id == MsgType.DISCOVER_PARTITIONS:
            writer.write(encode_frame(msg_id, self._discover(request)))
        elif msg_id == MsgType.STATUS:
            topics = self.cluster.topics
            resp = rs.StatusResponse(request.request_id, len(topics), sum(topics.values()))
            writer.write(encode_frame(msg_id, rs.encode_status_response(resp)))
        elif msg_id == MsgType.DISCOVER_TOPICS:
            infos = tuple(rs.TopicInfo(n, True, c) for n, c in self.cluster.topics.items())
            resp = rs.DiscoverTopicsResponse(request.request_id, infos)
            writer.write(encode_frame(msg_id, rs.encode_discover_topics_response(resp)))
        else:
            raise AssertionError(f"the fake broker does not answer message 0x{msg_id:02x}")

    def _leader(self, key: Key):
        return self.leaders.get(key, LEADS_HERE)

    def _produce(self, req: rq.ProduceRequest) -> bytes:
        results = []
        for topic in req.topics:
            if topic.name not in self.cluster.topics:
                results.append(rs.ProduceTopicResult(topic.name, ProduceStatus.UNKNOWN_TOPIC, ()))
                continue
            statuses = []
            for part in topic.partitions:
                leader = self._leader((topic.name, part.partition))
                if leader is LEADS_HERE:
                    self._append((topic.name, part.partition), bytes(part.bundle))
                    statuses.append(rs.PartitionStatus(ProduceStatus.OK))
                elif leader is None:
                    statuses.append(rs.PartitionStatus(ProduceStatus.NO_LEADER))
                else:
                    statuses.append(rs.PartitionStatus(ProduceStatus.OTHER_LEADER, leader))
            results.append(rs.ProduceTopicResult(topic.name, None, tuple(statuses)))
        return rs.encode_produce_response(rs.ProduceResponse(req.request_id, tuple(results)))

    def _append(self, key: Key, bundle: bytes) -> None:
        stored = self.cluster.data[key]
        stored.records.append((stored.hwmark + 1, encode_record(bundle)))
        stored.hwmark += bundle_facts(bundle).messages
        stored.grew.set()
        stored.grew = asyncio.Event()

    async def _consume(self, req: rq.ConsumeRequest) -> bytes:
        waits = []
        for topic in req.topics:
            for p in topic.partitions:
                key = (topic.name, p.partition)
                if self._leader(key) is LEADS_HERE and self._at_tail(key, p.seq):
                    waits.append(self.cluster.data[key].grew)
        if waits and req.max_wait_ms:  # long-poll until one of them grows
            done, pending = await asyncio.wait([asyncio.ensure_future(e.wait()) for e in waits],
                                               timeout=req.max_wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()
        topics, chunks = [], []
        for topic in req.topics:
            results = []
            for p in topic.partitions:
                result, chunk = self._consume_partition((topic.name, p.partition), p.seq)
                results.append(result)
                if chunk is not None:
                    chunks.append(chunk)
            topics.append(rs.ConsumeTopicResult(topic.name, tuple(results), len(results)))
        return rs.encode_consume_response(rs.ConsumeResponse(req.request_id, tuple(topics), tuple(chunks)))

    def _at_tail(self, key: Key, seq: int) -> bool:
        hwmark = self.cluster.data[key].hwmark
        return seq == UINT64_MAX or seq > hwmark or hwmark == 0

    def _consume_partition(self, key: Key, seq: int) -> tuple[rs.ConsumePartitionResult, bytes | None]:
        stored = self.cluster.data[key]
        leader = self._leader(key)
        partition = key[1]
        if self._at_tail(key, seq) and leader is not LEADS_HERE:
            if leader is None:
                return rs.ConsumePartitionResult(partition, ConsumeStatus.NO_LEADER), None
            return rs.ConsumePartitionResult(partition, ConsumeStatus.OTHER_LEADER, leader=leader), None
        start = max(seq, 1)
        if seq == UINT64_MAX or start > stored.hwmark:  # nothing (more) to read: EOF at the high-water mark
            return rs.ConsumePartitionResult(partition, ConsumeStatus.OK, 0, stored.hwmark, 0), b""
        i = max(j for j, (first, _) in enumerate(stored.records) if first <= start)  # the record holding start
        chunk = b"".join(record for _, record in stored.records[i:])
        first = stored.records[i][0]
        return rs.ConsumePartitionResult(partition, ConsumeStatus.OK, first, stored.hwmark, len(chunk)), chunk

    def _discover(self, req: rq.DiscoverPartitionsRequest) -> bytes:
        count = self.cluster.topics.get(req.topic, 0)
        wanted = req.partitions if req.partitions is not None else range(count)
        ranges = []
        for p in wanted:
            key = (req.topic, p)
            leader = self._leader(key)
            if leader is LEADS_HERE:
                hwmark = self.cluster.data[key].hwmark
                ranges.append(rs.PartitionRange(1 if hwmark else 0, hwmark))
            elif leader is None:
                ranges.append(rs.PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.NO_LEADER))
            else:
                ranges.append(rs.PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.OTHER_LEADER, leader))
        resp = rs.DiscoverPartitionsResponse(req.request_id, req.topic, tuple(ranges) if count else ())
        return rs.encode_discover_partitions_response(resp)


def _read_request(msg_id: int, payload: bytes):
    if msg_id in (MsgType.PRODUCE, MsgType.PRODUCE_WITH_SEQNUM):
        return rq.read_produce_request(payload, msg_id == MsgType.PRODUCE_WITH_SEQNUM)
    readers = {
        MsgType.CONSUME: rq.read_consume_request,
        MsgType.DISCOVER_PARTITIONS: rq.read_discover_partitions_request,
        MsgType.STATUS: rq.read_status_request,
        MsgType.DISCOVER_TOPICS: rq.read_discover_topics_request,
    }
    return readers[msg_id](payload)


@pytest.fixture
async def fake_cluster():
    cluster = FakeCluster()
    try:
        yield cluster
    finally:
        await cluster.stop()
