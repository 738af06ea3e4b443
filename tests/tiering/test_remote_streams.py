"""Streamed remote reads (issue 14): answers byte for byte what the local disk answered, GET windows from the index,
read-ahead of the next window, partitions of one fetch read in parallel, the head leaving before the GET is done, the
read budget, and bad bytes in the bucket. Over real sockets, with moto behind the fault proxy."""

from __future__ import annotations

import asyncio
import random
import shutil
import struct

import pytest

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle, encode_record
from tiered.protocol.consume_response import read_consume_response
from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import FRAME_HEADER, MsgType, encode_frame
from tiered.storage.index import SparseIndex
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.tiering.reads.range_reads import RangeRead, ReadBudget
from tiered.tiering.reads.remote_chunks import find_first_bundle
from tiered.tiering.reads.remote_fetch import AHEAD_DEPTH, indexed_end, segment_window
from tiered.tiering.objects.meter import Attribution

from tests.support.polling import eventually
from tests.tiering.test_remote_reads import _copied, tiered_broker  # noqa: F401 (the fixture)
from tiered.topic_partition import TopicPartition

TOPIC_CONFIG = {"log.segment.bytes": "4k", "log.index.interval.bytes": "300"}
MiB = 1 << 20


def value(i: int) -> bytes:
    return b"v%05d-" % i + random.Random(i).randbytes(40 + i % 90)


async def _fill(app, c: Client, partitions: int, count: int) -> None:
    """Bundles of 1 to 9 messages on every partition, until `count` messages each; then the sealed segments are
    copied (not yet deleted locally)."""
    rng = random.Random(7)
    await c.create_topic("hist", partitions, TOPIC_CONFIG)
    for p in range(partitions):
        i = 0
        while i < count:
            n = min(rng.randint(1, 9), count - i)
            await c.produce("hist", p, [Message(value(i + j), None, 1_700_000_000_000 + i + j) for j in range(n)])
            i += n
    for p in range(partitions):
        sealed = len(app.broker.registry.get("hist", p).log.segments)
        await eventually(lambda: len([r for r in _copied_p(app, p)]) >= sealed, what="segments copied")


async def _from_the_bucket_only(app, tiered_broker) -> tuple[object, dict[int, int]]:
    """The broker restarted on an empty disk: every seq comes from the bucket. Returns it, and the last seq of each
    partition's copied segments (seqs past it are in block runs)."""
    last = {p: max(s.last for s in _copied_p(app, p)) for p in range(len(app.broker.registry.topics["hist"].partitions))}
    await app.stop()
    shutil.rmtree(tiered_broker.data_dir)
    return await tiered_broker(), last


def _copied_p(app, partition: int) -> list:
    copier = app.tier.remote.copier
    part = app.broker.registry.get("hist", partition)
    return [s for s in part.log.segments if copier.is_copied(TopicPartition("hist", partition), s.base)]


def _consume_frame(request_id: int, wanted: list[tuple[int, int, int]]) -> bytes:
    parts = tuple(rq.ConsumePartition(p, seq, size) for p, seq, size in wanted)
    req = rq.ConsumeRequest(request_id, 0, 0, (rq.ConsumeTopic("hist", parts),))
    return encode_frame(MsgType.CONSUME, rq.encode_consume_request(req))


class Raw:
    """One raw connection: whole consume responses, as bytes."""

    async def open(self, port: int) -> Raw:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        assert await self.reader.readexactly(FRAME_HEADER.size) == encode_frame(MsgType.PING, b"")
        return self

    async def consume(self, request_id: int, wanted: list[tuple[int, int, int]]) -> bytes:
        self.writer.write(_consume_frame(request_id, wanted))
        head = await asyncio.wait_for(self.reader.readexactly(FRAME_HEADER.size), 20)
        msg_id, length = FRAME_HEADER.unpack(head)
        assert msg_id == MsgType.CONSUME
        return await asyncio.wait_for(self.reader.readexactly(length), 20)

    def close(self) -> None:
        self.writer.close()


async def test_remote_answers_are_the_local_answers_byte_for_byte(tiered_broker):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await _fill(app, c, 2, 500)
    last_remote = {p: max(s.last for s in _copied_p(app, p)) for p in range(2)}
    rng = random.Random(3)
    requests = []
    for _ in range(120):
        size = rng.choice([1, 90, 300, 700, 2000, 5000])
        wanted = [(p, rng.randint(1, last_remote[p]), size) for p in rng.sample([0, 1], rng.randint(1, 2))]
        requests.append(wanted)
    for p in range(2):  # whole segments in order too, as a replaying consumer asks
        seq = 1
        while seq <= last_remote[p]:
            requests.append([(p, seq, 1500)])
            seq += 17
    raw = await Raw().open(app.broker.port)
    local = [await raw.consume(i, wanted) for i, wanted in enumerate(requests)]
    raw.close()
    app, _ = await _from_the_bucket_only(app, tiered_broker)
    raw = await Raw().open(app.broker.port)
    counters = app.broker.metrics.counters
    remote = [await raw.consume(i, wanted) for i, wanted in enumerate(requests)]
    raw.close()
    assert counters["tiered_remote_gets_total"] > 0
    for i, (was, now) in enumerate(zip(local, remote)):
        assert now == was, f"request {i} {requests[i]}: the remote answer differs from the local one"
    reader = app.tier.remote.reader
    await eventually(lambda: reader.budget.used == reader.budget.ahead_used, what="fetch buffers given back")


async def test_a_replay_is_read_ahead_and_gets_little_more_than_it_answers(tiered_broker):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await _fill(app, c, 1, 1500)
    app, last = await _from_the_bucket_only(app, tiered_broker)
    last_remote = last[0]
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        counters = app.broker.metrics.counters
        store = app.tier.store.counters
        get_bytes, answered = store.get_bytes, counters["tiered_remote_bytes_total"]
        seq = 1
        fetches = 0
        while seq <= last_remote:
            got = await c.consume("hist", 0, seq, fetch_bytes=2500)
            assert got.messages and got.messages[0].seq == seq
            assert [m.value for m in got.messages] == [value(m.seq - 1) for m in got.messages]
            seq = got.messages[-1].seq + 1
            fetches += 1
    segments = len(_copied(tiered_broker.catalog_url))
    # Once the second fetch shows the consumer reads in order, every fetch is served by the GET started ahead of it
    # (at a segment's end, from the next segment).
    assert counters["tiered_remote_read_ahead_hits_total"] >= fetches - 2
    # One lookup per segment, and one by the read-ahead past the last one (it finds the run the consumer would read
    # next, and remembers it): the reader asks the catalog where a seq is, not what it believes was copied.
    assert counters["tiered_remote_catalog_queries_total"] <= segments + 1
    read = store.get_bytes - get_bytes
    assert read / (counters["tiered_remote_bytes_total"] - answered) <= 1.25


async def test_a_consumer_reading_in_order_has_several_windows_read_ahead(tiered_broker):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await _fill(app, c, 1, 1500)
    app, _ = await _from_the_bucket_only(app, tiered_broker)
    reader = app.tier.remote.reader
    counters = app.broker.metrics.counters
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        seq = 1
        for _ in range(3):
            got = await c.consume("hist", 0, seq, fetch_bytes=2500)
            seq = got.messages[-1].seq + 1
        entries = reader._ahead[("hist", 0)]
        await eventually(lambda: len(entries) >= AHEAD_DEPTH and all(e.task.done() for e in entries),
                         what="the windows ahead located")
        assert [e.seq for e in entries[:2]] == [seq, entries[0].follow]
        hits = counters["tiered_remote_read_ahead_hits_total"]
        for _ in range(AHEAD_DEPTH):
            got = await c.consume("hist", 0, seq, fetch_bytes=2500)
            assert [m.value for m in got.messages] == [value(m.seq - 1) for m in got.messages]
            seq = got.messages[-1].seq + 1
        assert counters["tiered_remote_read_ahead_hits_total"] - hits == AHEAD_DEPTH  # each answer was read ahead


async def test_the_head_leaves_before_the_get_is_done(tiered_broker, s3_faults):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await _fill(app, c, 1, 400)
    app, _ = await _from_the_bucket_only(app, tiered_broker)
    reader = app.tier.remote.reader
    reader.read_ahead = False
    raw = await Raw().open(app.broker.port)
    whole = await raw.consume(1, [(0, 5, 3000)])  # warms the row and index caches; the answer to compare with
    s3_faults.hold_body_next(1, 400, match=lambda method, path: method == "GET" and ".ilog" in path)
    raw.writer.write(_consume_frame(1, [(0, 5, 3000)]))
    head = await asyncio.wait_for(raw.reader.readexactly(FRAME_HEADER.size), 20)
    msg_id, length = FRAME_HEADER.unpack(head)
    early = await asyncio.wait_for(raw.reader.read(length), 20)  # the head and the bundles in so far
    assert msg_id == MsgType.CONSUME and 0 < len(early) < length
    assert s3_faults.faults_served == 1
    s3_faults.release_bodies()
    rest = await asyncio.wait_for(raw.reader.readexactly(length - len(early)), 20)
    assert early + rest == whole
    raw.close()


async def test_a_get_that_fails_mid_answer_closes_the_connection_and_frees_its_buffer(tiered_broker, s3_faults):
    app = await tiered_broker()
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await _fill(app, c, 1, 400)
    app, _ = await _from_the_bucket_only(app, tiered_broker)
    reader = app.tier.remote.reader
    reader.read_ahead = False
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.consume("hist", 0, 5, fetch_bytes=3000)  # caches warm: the next request GETs the data only
    # The GET whose connection goes away (its body held, then released into a closed client) ends at the store's
    # deadline: its base 2 s here rather than the usual 10.
    app.tier.store.deadline_base_s = 2.0
    raw = await Raw().open(app.broker.port)
    s3_faults.hold_body_next(1, 400, match=lambda method, path: method == "GET" and ".ilog" in path)
    raw.writer.write(_consume_frame(1, [(0, 5, 3000)]))
    await asyncio.wait_for(raw.reader.readexactly(FRAME_HEADER.size + 10), 20)
    await app.tier.store.close()  # the GET's connection goes away under it
    s3_faults.release_bodies()
    assert await asyncio.wait_for(raw.reader.read(), 20) is not None  # read to the end: the broker closes
    await eventually(lambda: reader.budget.used == 0, what="the buffer given back")
    raw.close()


# -- windows, budget and bad bytes, without a broker -----------------------------------------------------------------

def test_windows_cover_the_bundle_holding_the_seq_and_the_whole_answer():
    # bundles of 10 seqs, 100 bytes each; every other one indexed
    index = SparseIndex((rel, rel * 10) for rel in range(0, 200, 20))
    size = 2000
    for seq in range(100, 300):
        for fetch_size in (1, 50, 150, 450, 5000):
            w = segment_window(index, 100, size, seq, fetch_size)
            start = (seq - 100) // 10 * 100  # the bundle holding seq
            assert w.floor <= start and start + 100 <= w.end
            end = indexed_end(index, size, start, start + 100, fetch_size)
            assert end is None or end <= w.end
            assert w.end <= size
            if end is None:
                assert start + fetch_size <= w.end  # a walked end stays inside the window too


@pytest.fixture
async def budgeted(tmp_path):
    store = LocalObjectStore(str(tmp_path / "objects"))
    yield store, ReadBudget(4 * MiB)
    await store.close()


async def test_budget_waits_for_fetches_and_refuses_read_ahead_past_half(budgeted):
    _, budget = budgeted
    assert budget.buffer_bytes == 3 * MiB
    await budget.acquire(2 * MiB)
    waiting = asyncio.ensure_future(budget.acquire(2 * MiB))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert not budget.try_acquire_ahead(1024)  # a fetch waits: read-ahead does not jump the queue
    budget.release(2 * MiB)
    await asyncio.wait_for(waiting, 5)
    assert budget.try_acquire_ahead(MiB // 2) and budget.try_acquire_ahead(MiB // 2)
    assert not budget.try_acquire_ahead(1)  # full
    budget.release(2 * MiB)
    assert not budget.try_acquire_ahead(MiB)  # read-ahead holds half of the buffers already
    budget.release(MiB // 2, ahead=True)
    budget.release(MiB // 2, ahead=True)
    await asyncio.wait_for(budget.acquire(10 * MiB), 5)  # larger than the buffers: waits for all of them
    assert budget.used == 10 * MiB
    budget.release(10 * MiB)
    cancelled = asyncio.ensure_future(budget.acquire(MiB))
    await asyncio.wait_for(cancelled, 5)
    budget.release(MiB)
    assert budget.used == 0 and budget.ahead_used == 0


def _records(first: int, counts: list[int]) -> bytes:
    out = b""
    seq = first
    for n in counts:
        out += encode_record(encode_bundle([Message(b"x%d" % (seq + i), None, 1) for i in range(n)]))
        seq += n
    return out


async def test_the_first_bundle_is_found_in_whole_records_and_bad_bytes_are_refused(budgeted):
    store, budget = budgeted
    data = _records(100, [3, 1, 5, 2])
    await store.put("seg", data)
    slots = asyncio.Semaphore(2)

    async def first(obj: str, end: int, seq: int):
        read = await RangeRead.open(store, obj, 0, end, budget, slots, Attribution.topic("t"))
        try:
            return await find_first_bundle(read, 0, 100, seq)
        finally:
            read.close()

    assert (await first("seg", len(data), 104)).first_seq == 104
    assert (await first("seg", len(data), 105)).first_seq == 104
    assert (await first("seg", len(data), 110)).last_seq == 110
    assert await first("seg", len(data), 200) is None
    with pytest.raises((EOFError, ProtocolError)):  # the object is shorter than the window
        await first("seg", len(data) + 50, 111)
    await store.put("cut", data[:-3])  # truncated inside the last record
    with pytest.raises((EOFError, ProtocolError)):
        await first("cut", len(data), 111)
    await store.put("huge", struct.pack("<B", 0xFF) * 6)  # an oversized varint
    with pytest.raises(ProtocolError):
        await first("huge", 6, 100)
    rng = random.Random(11)
    for _ in range(200):  # random bytes: refused or read, never a hang or another error
        junk = rng.randbytes(rng.randint(1, 300))
        await store.put("junk", junk)
        try:
            await first("junk", len(junk), rng.randint(100, 400))
        except (ProtocolError, EOFError):
            pass
    assert budget.used == 0


async def test_the_s3_client_is_open_before_the_broker_is_ready(tiered_broker):
    app = await tiered_broker()  # the first remote fetch does not pay for creating it
    assert app.broker.ready and app.tier.store._client is not None
