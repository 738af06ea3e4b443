"""ProduceHandler.handle answers a plain request at once, without a coroutine, and hands back the coroutine to await
only when the answer must wait (here: a connection that does not take it at once). Either way the answer's bytes are
the same, and the records are appended once. A request whose clock read is at or past the tier's ack deadline (the
lease's, tiered.tier_interface.AckDeadline) is answered "no leader" with nothing appended, on both paths."""

from __future__ import annotations

import asyncio

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType, encode_frame, maybe_frame
from tiered.protocol.responses import read_produce_response
from tiered.server.app import App
from tiered.server.produce import ProduceHandler
from tiered.tier_interface import AckDeadline, LocalOnly, ProduceCalls

from tests.support.broker import local_settings
from tests.support.clock import ManualClock


class Conn:
    """What the handler asks of a connection; `takes`: whether it queues an answer without waiting."""

    plaintext = True

    def __init__(self, takes: bool):
        self.takes = takes
        self.sent: list[tuple[int, bytes]] = []

    def try_send_frame(self, frame: bytes) -> bool:
        if self.takes:
            self.sent.append(unframed(frame))
        return self.takes

    async def send_frame(self, frame: bytes) -> None:
        await asyncio.sleep(0)  # a send that waits for the client to read
        self.sent.append(unframed(frame))

    async def send(self, msg_id: int, payload: bytes) -> None:
        await self.send_frame(encode_frame(msg_id, payload))


def unframed(frame: bytes) -> tuple[int, bytes]:
    """(msg_id, payload) of one whole frame, which it must be."""
    msg_id, payload, end = maybe_frame(frame)
    assert end == len(frame)
    return msg_id, bytes(payload)

    def spawn(self, coro) -> None:
        raise AssertionError("a local-ack produce spawns no task")


def request(request_id: int, partitions: tuple[int, ...]) -> rq.ProduceRequest:
    bundle = encode_bundle([Message(b"v%d" % request_id, None, 1_000)])
    return rq.ProduceRequest(request_id, (rq.ProduceTopic("h", tuple(rq.ProducePartition(p, bundle)
                                                                       for p in partitions)),))


def statuses(req: rq.ProduceRequest, payload: bytes) -> list[int]:
    answer = read_produce_response(payload, req)
    return [p.code for t in answer.topics for p in t.partitions]


async def test_a_plain_produce_is_answered_without_a_coroutine_and_a_waiting_one_with_one(broker, client):
    await client.create_topic("h", 2)
    handler = broker.broker.handlers.produce
    at_once, waiting = Conn(takes=True), Conn(takes=False)

    req = request(1, (0, 1))
    assert handler.handle(at_once, *rq.read_checked_produce(rq.encode_produce_request(req), False)) is None
    assert [m for m, _ in at_once.sent] == [MsgType.PRODUCE]
    assert statuses(req, at_once.sent[0][1]) == [ProduceStatus.OK, ProduceStatus.OK]

    req = request(2, (1, 5))  # partition 5 does not exist
    pending = handler.handle(waiting, *rq.read_checked_produce(rq.encode_produce_request(req), False))
    assert asyncio.iscoroutine(pending) and not waiting.sent  # appended, the answer not sent yet
    await pending
    assert [m for m, _ in waiting.sent] == [MsgType.PRODUCE]
    assert statuses(req, waiting.sent[0][1]) == [ProduceStatus.OK, ProduceStatus.UNKNOWN_PARTITION]

    got = [m async for m in client.drain("h", 1, 0)]
    assert [(m.seq, m.value) for m in got] == [(1, b"v1"), (2, b"v2")]  # each record appended once, in order


class LeasedTier(LocalOnly):
    """A tier with a lease, as far as the produce path sees one: an ack deadline its owner (here, the test, as the
    coordinator does) moves, and an upload pipeline that may be full (admission waits until `opened`)."""

    def __init__(self) -> None:
        super().__init__()
        self.deadline = AckDeadline()
        self.full = False
        self.opened = asyncio.Event()
        self.produce_calls = ProduceCalls(self.deadline, self.admits_now, self.appended)

    def admits_now(self) -> bool:
        return not self.full

    async def admission(self) -> bool:
        await self.opened.wait()
        return True


async def test_no_request_is_acknowledged_at_or_past_the_ack_deadline(tmp_path):
    """On the manual clock, on the native path and on the reference's: before the deadline a request is appended and
    answered 0x00; with the clock at the deadline, 0xfd and nothing appended; and a request that waited for
    admission while the deadline passed is checked again after the wait: 0xfd, nothing appended."""
    clock = ManualClock()
    tier = LeasedTier()
    app = App(local_settings(tmp_path / "data"), tier=lambda *_: tier, clock=clock)
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("h", 1)
        log = app.registry.get("h", 0).log
        request_id = 0
        for handler in (app.broker.handlers.produce, ProduceHandler(app.broker, path="python")):
            def payload() -> tuple[rq.ProduceRequest, bytes]:
                nonlocal request_id
                request_id += 1
                req = request(request_id, (0,))
                return req, rq.encode_produce_request(req)

            tier.deadline.until = clock.monotonic() + 1.0  # renewed now
            conn = Conn(takes=True)
            req, body = payload()
            assert handler.handle_payload(conn, body, False) is None
            assert statuses(req, conn.sent[-1][1]) == [ProduceStatus.OK]
            appended = log.last_assigned

            clock.advance(1.0)  # the clock at the deadline: not renewed since
            req, body = payload()
            await handler.handle_payload(conn, body, False)
            assert statuses(req, conn.sent[-1][1]) == [ProduceStatus.NO_LEADER]
            assert log.last_assigned == appended

            tier.deadline.until = clock.monotonic() + 1.0  # renewed again, and the pipeline full
            tier.full = True
            req, body = payload()
            waiting = asyncio.ensure_future(handler.handle_payload(conn, body, False))
            await asyncio.sleep(0)
            clock.advance(2.0)  # the lease passes while the request waits for admission
            tier.full = False
            tier.opened.set()
            await waiting
            tier.opened.clear()
            assert statuses(req, conn.sent[-1][1]) == [ProduceStatus.NO_LEADER]
            assert log.last_assigned == appended
    finally:
        await app.stop()
