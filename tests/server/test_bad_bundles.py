"""A produce whose bundle headers are valid but whose message sets are not (issue 16, item 3) is refused whole.

Over real sockets to a real broker (tiering on its embedded defaults: local-directory store and SQLite catalog):
the connection that sent it is closed; nothing of the request is appended (neither the good bundle sent before the
bad one in the same request, nor the bad one): not to the local log, not to the block builder; other connections
keep working; the next good produce gets the next seq; consumers (`tiered consume`, the client) and the bucket only
ever see the good bundles.

The broker runs on an event loop of its own thread, so that synchronous tests (hypothesis among them) talk to it
over sockets and look at its state between requests.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.bad_bundles import BAD_BUNDLES
from tests.protocol.strategies import budget, bundles, mutations
from tests.support.broker import REPO, local_settings
from tiered.catalog import blocks as catalog_blocks
from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle, validate_bundle
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import FrameBuffer, MsgType, encode_frame
from tiered.server.app import App
from tiered.storage.partition_log import MAX_SEQ

DURABLE, LOCAL = "durable", "local"


class BrokerThread:
    """An App with tiering on its embedded defaults, serving from an event loop in a thread of its own."""

    def __init__(self, data_dir):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="broker", daemon=True)
        self.app = App(local_settings(data_dir, block_max_age_ms=20))

    def start(self) -> "BrokerThread":
        self.thread.start()
        self.call(self.app.start())
        return self

    def call(self, coro, timeout_s: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.call(self.app.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @property
    def port(self) -> int:
        return self.app.broker.port

    def log(self, topic: str, partition: int = 0):
        return self.app.broker.registry.get(topic, partition).log

    @property
    def builder(self):
        return self.app.tier.durable.builder

    def wait_builder_empty(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.builder.empty:
            assert time.monotonic() < deadline, "the block builder never emptied"
            time.sleep(0.01)


class Wire:
    """A blocking TANK connection: frames out, frames in, and whether the broker closed it."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.frames = FrameBuffer()
        assert self.recv() == (MsgType.PING, b"")

    def send(self, msg_id: int, payload: bytes) -> None:
        self.sock.sendall(encode_frame(msg_id, payload))

    def recv(self) -> tuple[int, bytes] | None:
        """The next frame, or None when the broker closed the connection first."""
        while (got := self.frames.next_frame()) is None:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.frames.feed(data)
        return got

    def close(self) -> None:
        self.sock.close()


def produce_payload(topic: str, bundles_: list[bytes], request_id: int = 7,
                    base_seqs: list[int] | None = None) -> bytes:
    partitions = tuple(rq.ProducePartition(0, b, None if base_seqs is None else base_seqs[i])
                       for i, b in enumerate(bundles_))
    return rq.encode_produce_request(rq.ProduceRequest(request_id, (rq.ProduceTopic(topic, partitions),),
                                                       with_seqnum=base_seqs is not None))


def produce_answer(wire: Wire, topic: str, bundles_: list[bytes]) -> bytes:
    """Produces `bundles_` to partition 0 of `topic` in one request; returns each bundle's status byte."""
    wire.send(MsgType.PRODUCE, produce_payload(topic, bundles_))
    msg_id, payload = wire.recv()
    assert msg_id == MsgType.PRODUCE and payload[:4] == rq.REQUEST_ID.pack(7) and len(payload) == 4 + len(bundles_)
    return payload[4:]


def produce_ok(wire: Wire, topic: str, bundles_: list[bytes]) -> None:
    assert produce_answer(wire, topic, bundles_) == bytes(len(bundles_))  # OK for each


@dataclass(frozen=True)
class LogState:
    last_assigned: int
    visible: int
    size_bytes: int


def log_state(broker: BrokerThread, topic: str) -> LogState:
    log = broker.log(topic)
    hwmark = broker.app.broker.registry.get(topic, 0).hwmark
    return LogState(log.last_assigned, hwmark, log.stats().bytes)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerThread(tmp_path_factory.mktemp("bad-bundles") / "data").start()

    async def topics():
        async with await Client.connect("127.0.0.1", b.port) as c:
            await c.create_topic(DURABLE, 2, {"produce.ack": "durable"})
            await c.create_topic(LOCAL, 2, {"produce.ack": "local"})

    b.call(topics())
    yield b
    b.stop()


GOOD = encode_bundle([Message(b"good", None, 1_700_000_000_000)])


def refused_whole(broker: BrokerThread, topic: str, payload: bytes, msg_id: int = MsgType.PRODUCE) -> None:
    """Sends `payload` on a fresh connection and checks that the broker closes it having appended nothing, that a
    connection opened before still works, and that the next good produce takes the next seq."""
    broker.wait_builder_empty()
    before = log_state(broker, topic)
    bystander = Wire(broker.port)
    wire = Wire(broker.port)
    wire.send(msg_id, payload)
    assert wire.recv() is None, "the broker answered a produce holding a bad bundle"
    wire.close()
    assert log_state(broker, topic) == before
    assert broker.builder.empty
    produce_ok(bystander, topic, [GOOD])
    after = log_state(broker, topic)
    assert after.last_assigned == before.last_assigned + 1
    assert after.visible == after.last_assigned  # a durable ack came after its commit
    bystander.close()


@pytest.mark.parametrize("topic", [DURABLE, LOCAL])
@pytest.mark.parametrize("name, bad, error", BAD_BUNDLES, ids=[b[0] for b in BAD_BUNDLES])
def test_every_kind_of_bad_bundle_is_refused_whole(broker, topic, name, bad, error):
    with pytest.raises(ProtocolError, match=error):
        validate_bundle(bad)
    # The good bundle comes first in the request: it must not be appended either.
    refused_whole(broker, topic, produce_payload(topic, [GOOD, bad]))


def test_a_bad_sparse_bundle_in_a_produce_with_seqnum_is_refused_whole(broker):
    base = broker.log(DURABLE).last_assigned + 100
    sparse = [Message(b"a", None, 5, base), Message(b"b", None, 5, base + 3), Message(b"c", None, 5, base + 9)]
    bad = bytearray(encode_bundle(sparse, sparse=True))
    bad[-6] = 0x0F  # the middle message's delta (2) becomes 15: seq base + 16, past the last seq base + 9
    with pytest.raises(ProtocolError, match="not below its last seq"):
        validate_bundle(bytes(bad))
    good = encode_bundle([Message(b"x", None, 5, base - 50)], sparse=True)
    refused_whole(broker, DURABLE, produce_payload(DURABLE, [good, bytes(bad)], base_seqs=[0, 0]),
                  MsgType.PRODUCE_WITH_SEQNUM)


@budget(40)
@given(st.data())
def test_any_bundle_is_appended_whole_or_refused_whole(broker, data):
    candidate = data.draw(st.one_of(bundles(), bundles().flatmap(mutations)))
    topic = data.draw(st.sampled_from([DURABLE, LOCAL]))
    try:
        facts = validate_bundle(candidate)
    except ProtocolError:
        refused_whole(broker, topic, produce_payload(topic, [GOOD, candidate]))
        return
    before = log_state(broker, topic)
    wire = Wire(broker.port)
    statuses = produce_answer(wire, topic, [GOOD, candidate])
    wire.close()
    last = before.last_assigned + 1
    if not facts.sparse:
        assert statuses == bytes([ProduceStatus.OK, ProduceStatus.OK])
        last += facts.messages
    elif last < facts.first_seq and facts.last_seq <= MAX_SEQ:  # a sparse bundle names its own seqs
        assert statuses == bytes([ProduceStatus.OK, ProduceStatus.OK])
        last = facts.last_seq
    else:
        assert statuses == bytes([ProduceStatus.OK, ProduceStatus.INVALID_SEQNUMS])
    assert log_state(broker, topic).last_assigned == last


def test_consumers_and_the_bucket_only_ever_see_the_good_bundles(broker):
    """Good and bad produces interleaved on partition 1 of both topics; then `tiered consume` and the client read
    exactly the good messages, and the durable topic's committed runs cover exactly their seqs, without a hole."""
    expected: list[bytes] = []
    for i, (name, bad, _) in enumerate(BAD_BUNDLES):
        good = [f"m{i}-{j}".encode() for j in range(3)]
        for topic in (DURABLE, LOCAL):
            wire = Wire(broker.port)
            wire.send(MsgType.PRODUCE, rq.encode_produce_request(rq.ProduceRequest(1, (rq.ProduceTopic(topic, (
                rq.ProducePartition(1, encode_bundle([Message(v, None, 10 + i) for v in good])),)),))))
            assert wire.recv()[0] == MsgType.PRODUCE
            wire.send(MsgType.PRODUCE, rq.encode_produce_request(rq.ProduceRequest(2, (rq.ProduceTopic(topic, (
                rq.ProducePartition(1, bad),)),))))
            assert wire.recv() is None, name
            wire.close()
        expected += good
    for topic in (DURABLE, LOCAL):
        done = subprocess.run([sys.executable, "-m", "tiered.cli.main", "consume", "-b", f"127.0.0.1:{broker.port}",
                               "-t", f"{topic}/1", "-d", "-F", "content"], cwd=REPO, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.decode().splitlines() == [v.decode() for v in expected]

        async def drain():
            async with await Client.connect("127.0.0.1", broker.port) as c:
                return [m async for m in c.drain(topic, 1, 0)]

        messages = broker.call(drain())
        assert [m.value for m in messages] == expected
        assert [m.seq for m in messages] == list(range(1, len(expected) + 1))
    runs = broker.call(broker.app.tier.catalog.read(catalog_blocks.runs_for_range, DURABLE, 1, 1, 1000))
    assert runs and runs[0].first_seq == 1 and runs[-1].last_seq == len(expected)
    assert all(b.first_seq == a.last_seq + 1 for a, b in zip(runs, runs[1:]))


def test_what_the_catalog_cannot_hold_never_poisons_the_block_pipeline(broker):
    """A valid bundle stamped 2**64 - 1 is committed (its bounds recorded at 2**63 - 1); a sparse bundle whose seqs
    pass 2**63 - 1 is answered INVALID_SEQNUMS and appends nothing; durable produces are acked after either."""
    wire = Wire(broker.port)
    produce_ok(wire, DURABLE, [encode_bundle([Message(b"late", None, 2**64 - 1)])])
    before = log_state(broker, DURABLE)
    too_far = encode_bundle([Message(b"x", None, 1, MAX_SEQ), Message(b"y", None, 1, MAX_SEQ + 1)], sparse=True)
    assert produce_answer(wire, DURABLE, [too_far]) == bytes([ProduceStatus.INVALID_SEQNUMS])
    assert log_state(broker, DURABLE) == before
    produce_ok(wire, DURABLE, [GOOD])
    assert log_state(broker, DURABLE).visible == before.last_assigned + 1
    wire.close()
