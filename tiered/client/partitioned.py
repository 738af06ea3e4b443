"""The three requests cut by partition: produce, consume and DiscoverPartitions.

Each `*_sender` returns the Send that tiered.client.routing.route calls with one connection and some of the request's
partitions: it builds the request for just those partitions, sends it, and classifies each partition's answer as
final, Redirect (0xfc + the leader's endpoint) or NO_LEADER (0xfd). Keys are (topic, partition). The final answers:

    produce     the ProduceStatus code (a topic-level status stands for each of the topic's partitions)
    consume     (ConsumePartitionResult, its chunk or None); an unknown topic raises UnknownTopic
    discover    the PartitionRange
"""

from __future__ import annotations

import asyncio
from typing import Mapping, Sequence

from tiered.client.connection import Connection, reason
from tiered.client.errors import ConnectionLost, NotConfirmed, UnknownTopic
from tiered.client.routing import NO_LEADER, Key, Redirect, Send
from tiered.protocol import requests as rq
from tiered.protocol import responses as rs
from tiered.protocol.codes import UINT64_MAX, ConsumeStatus, DiscoverReason, Endpoint, ProduceStatus
from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import MsgType

_WITH_CHUNK = (ConsumeStatus.OK, ConsumeStatus.SPARSE)


def _by_topic(keys: Sequence[Key], item) -> dict[str, list]:
    """The request's topics in the order their first partition comes, each with its partitions' `item(key)`."""
    out: dict[str, list] = {}
    for key in keys:
        out.setdefault(key[0], []).append(item(key))
    return out


def _where(keys: Sequence[Key]) -> str:
    return ", ".join(f"{topic}/{partition}" for topic, partition in keys)


def _classify(code: int, leader: Endpoint | None, final):
    if code == ProduceStatus.OTHER_LEADER:  # 0xfc and 0xfd mean the same in produce, consume and discover
        return Redirect(leader)
    if code == ProduceStatus.NO_LEADER:
        return NO_LEADER
    return final


def _check_answered(keys: Sequence[Key], answers: dict, what: str) -> dict:
    missing = [key for key in keys if key not in answers]
    if missing:
        raise ProtocolError(f"{what} answers nothing for {_where(missing)}")
    return answers


# --- produce ------------------------------------------------------------------------------------------------------


def produce_sender(parts: Mapping[Key, rq.ProducePartition], *, with_seqnum: bool,
                   timeout_s: float | None) -> Send:
    msg_id = MsgType.PRODUCE_WITH_SEQNUM if with_seqnum else MsgType.PRODUCE

    async def send(conn: Connection, keys: list[Key]) -> dict:
        request_id = conn.request_id()
        by_topic = _by_topic(keys, parts.__getitem__)
        topics = tuple(rq.ProduceTopic(name, tuple(ps)) for name, ps in by_topic.items())
        req = rq.ProduceRequest(request_id, topics, with_seqnum=with_seqnum)
        try:
            payload = await conn.call(msg_id, request_id, rq.encode_produce_request(req), timeout_s)
        except asyncio.TimeoutError:
            raise NotConfirmed(f"produce to {_where(keys)} not confirmed within {timeout_s:g} s",
                               f"no answer within {timeout_s:g} s") from None
        resp = rs.read_produce_response(payload, req)
        answers = {}
        for topic, result in zip(topics, resp.topics):  # one run per topic: names are unique here
            for i, part in enumerate(topic.partitions):
                if result.status is not None:
                    answers[(topic.name, part.partition)] = result.status
                else:
                    status = result.partitions[i]
                    answers[(topic.name, part.partition)] = _classify(status.code, status.leader, status.code)
        return answers

    return send


def produce_lost(endpoint: Endpoint, keys: list[Key], exc: BaseException) -> ConnectionLost:
    return ConnectionLost(f"produce to {_where(keys)} not confirmed: the connection to {endpoint} was lost",
                          f"the connection to the broker at {endpoint} was lost after the produce was sent "
                          f"({reason(exc)})")


def produce_no_leader(key: Key) -> int:
    return ProduceStatus.NO_LEADER


# --- consume ------------------------------------------------------------------------------------------------------


def consume_sender(wanted: Mapping[Key, tuple[int, int]], *, max_wait_ms: int, min_bytes: int,
                   timeout_s: float | None) -> Send:
    """`wanted`: each key's (seq, fetch_bytes)."""

    async def send(conn: Connection, keys: list[Key]) -> dict:
        request_id = conn.request_id()
        by_topic = _by_topic(keys, lambda key: rq.ConsumePartition(key[1], *wanted[key]))
        req = rq.ConsumeRequest(request_id, max_wait_ms, min_bytes,
                                tuple(rq.ConsumeTopic(name, tuple(ps)) for name, ps in by_topic.items()))
        payload = await conn.call(MsgType.CONSUME, request_id, rq.encode_consume_request(req), timeout_s)
        resp = rs.read_consume_response(payload)
        chunks = iter(resp.chunks)  # one per OK or SPARSE partition, in header order
        answers = {}
        for topic in resp.topics:
            if topic.partitions is None:
                raise UnknownTopic(f"unknown topic {topic.name!r}", ProduceStatus.UNKNOWN_TOPIC)
            for p in topic.partitions:
                chunk = next(chunks) if p.status in _WITH_CHUNK else None
                answers[(topic.name, p.partition)] = _classify(p.status, p.leader, (p, chunk))
        return _check_answered(keys, answers, "the consume response")

    return send


def consume_no_leader(key: Key) -> tuple[rs.ConsumePartitionResult, None]:
    return rs.ConsumePartitionResult(key[1], ConsumeStatus.NO_LEADER), None


# --- discover partitions ------------------------------------------------------------------------------------------


def _range_answer(r: rs.PartitionRange):
    return _classify(r.reason, r.leader, r) if r.reason is not None else r


async def discover_all(conn: Connection, topic: str) -> tuple[Endpoint, dict]:
    """DiscoverPartitions of every partition from one broker: (that broker, {key: answer}) by partition number."""
    ranges = await _discover(conn, topic, None)
    return conn.endpoint, {(topic, i): _range_answer(r) for i, r in enumerate(ranges)}


def discover_sender(topic: str) -> Send:
    async def send(conn: Connection, keys: list[Key]) -> dict:
        ranges = await _discover(conn, topic, tuple(partition for _, partition in keys))
        if len(ranges) != len(keys):
            raise ProtocolError(f"discover partitions answers {len(ranges)} partitions of {topic!r} for the "
                                f"{len(keys)} asked")
        return {key: _range_answer(r) for key, r in zip(keys, ranges)}

    return send


async def _discover(conn: Connection, topic: str, partitions: tuple[int, ...] | None) -> tuple[rs.PartitionRange, ...]:
    request_id = conn.request_id()
    req = rq.DiscoverPartitionsRequest(request_id, topic, partitions)
    payload = await conn.call(MsgType.DISCOVER_PARTITIONS, request_id, rq.encode_discover_partitions_request(req))
    ranges = rs.read_discover_partitions_response(payload).partitions
    if not ranges:
        raise UnknownTopic(f"unknown topic {topic!r}")
    return ranges


def discover_no_leader(key: Key) -> rs.PartitionRange:
    return rs.PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.NO_LEADER)
