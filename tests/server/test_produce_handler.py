"""ProduceHandler.handle answers a plain request at once, without a coroutine, and hands back the coroutine to await
only when the answer must wait (here: a connection that does not take it at once). Either way the answer's bytes are
the same, and the records are appended once."""

from __future__ import annotations

import asyncio

from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType, maybe_frame
from tiered.protocol.responses import read_produce_response


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
