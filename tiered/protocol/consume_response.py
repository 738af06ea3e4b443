"""Consume (0x02) response: a header, then the chunks it describes (docs/protocol.md §3.4).

Payload layout:

    header_len   u32              bytes of header after this field; chunks start at payload position 4 + header_len
    request_id   u32, topics u8   CONSUME_HEAD
    topics × {
      name       str8
      partitions u8               echoes the request's partition count for this topic
      unknown topic: u16 0xFFFF and nothing else for this topic
      else partitions × { partition u16, status u8 (ConsumeStatus)   PARTITION_HEAD
        OK                base_seq u64, hwmark u64, chunk_len u32                    OK_FIELDS
        SPARSE            hwmark u64, chunk_len u32 (the first bundle carries its own base)   SPARSE_FIELDS
        BOUNDARY          base_seq u64 (0), hwmark u64, chunk_len u32 (0), first_available u64   BOUNDARY_FIELDS
        OTHER_LEADER      endpoint
        SYSTEM, NO_LEADER, UNKNOWN_PARTITION: nothing
      } }
    chunks: for every OK or SPARSE partition, in header order, chunk_len bytes of {bundle_len varint, bundle}

A broker writes the frame prefix from `encode_consume_head` and then the chunk bytes straight from segment files or
object ranges, so the chunks never pass through this module on the serving side.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from tiered.protocol.buffers import BytesLike
from tiered.protocol.codes import ConsumeStatus, Endpoint
from tiered.protocol.frame import FRAME_HEADER, MAX_FRAME_BYTES, MsgType
from tiered.protocol.wire import U16, U32, Reader, pack, pack_count8, pack_endpoint, pack_str8

CONSUME_HEAD = struct.Struct("<IB")  # request_id, topics
PARTITION_HEAD = struct.Struct("<HB")  # partition, status
OK_FIELDS = struct.Struct("<QQI")  # base_seq, hwmark, chunk_len
SPARSE_FIELDS = struct.Struct("<QI")  # hwmark, chunk_len
BOUNDARY_FIELDS = struct.Struct("<QQIQ")  # base_seq, hwmark, chunk_len, first_available
UNKNOWN_TOPIC = 0xFFFF  # in place of the first partition id: the topic does not exist
UNKNOWN_TOPIC_FIELDS = struct.Struct("<BH")  # partitions (the request's count), UNKNOWN_TOPIC

_WITH_CHUNK = frozenset({ConsumeStatus.OK, ConsumeStatus.SPARSE})
_STATUSES = frozenset(ConsumeStatus)
# The ConsumePartitionResult fields each status puts on the wire; the others must stay at their defaults.
_OPTIONAL_FIELDS = ("base_seq", "hwmark", "chunk_len", "first_available", "leader")
_FIELDS_ON_WIRE: dict[int, tuple[str, ...]] = {
    ConsumeStatus.OK: ("base_seq", "hwmark", "chunk_len"),
    ConsumeStatus.SPARSE: ("hwmark", "chunk_len"),
    ConsumeStatus.BOUNDARY: ("base_seq", "hwmark", "chunk_len", "first_available"),
    ConsumeStatus.OTHER_LEADER: ("leader",),
}


@dataclass(frozen=True, slots=True)
class ConsumePartitionResult:
    """Fields not on the wire for `status` stay at their defaults (see the layout above)."""

    partition: int
    status: int  # ConsumeStatus
    base_seq: int = 0
    hwmark: int = 0
    chunk_len: int = 0
    first_available: int = 0
    leader: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class ConsumeTopicResult:
    name: str
    partitions: tuple[ConsumePartitionResult, ...] | None  # None: unknown topic
    partition_count: int  # equals len(partitions) for a known topic; the request's count for an unknown one


@dataclass(frozen=True, slots=True)
class ConsumeResponse:
    request_id: int
    topics: tuple[ConsumeTopicResult, ...]
    chunks: tuple[memoryview, ...]  # one per OK or SPARSE partition result, in header order


def _encode_partition(p: ConsumePartitionResult, where: str) -> bytes:
    status = p.status
    if status not in _STATUSES:
        raise ValueError(f"{where}: unknown consume status {status}")
    if p.partition == UNKNOWN_TOPIC:
        raise ValueError(f"{where}: partition id 0xFFFF is taken to mean an unknown topic")
    on_wire = _FIELDS_ON_WIRE.get(status, ())
    for field in _OPTIONAL_FIELDS:
        if field not in on_wire and getattr(p, field) not in (0, None):
            raise ValueError(f"{where}: {field} is not sent with status 0x{status:02x}")
    if status == ConsumeStatus.BOUNDARY and p.chunk_len:
        raise ValueError(f"{where}: a boundary fault carries no chunk")
    head = pack(PARTITION_HEAD, f"{where} id", p.partition, status)
    if status == ConsumeStatus.OK:
        return head + pack(OK_FIELDS, where, p.base_seq, p.hwmark, p.chunk_len)
    if status == ConsumeStatus.SPARSE:
        return head + pack(SPARSE_FIELDS, where, p.hwmark, p.chunk_len)
    if status == ConsumeStatus.BOUNDARY:
        return head + pack(BOUNDARY_FIELDS, where, p.base_seq, p.hwmark, p.chunk_len, p.first_available)
    if status == ConsumeStatus.OTHER_LEADER:
        return head + pack_endpoint(p.leader, f"{where} other leader")
    return head


def _encode_header(request_id: int, topics: Iterable[ConsumeTopicResult]) -> tuple[bytes, int]:
    """(header after header_len, sum of chunk_len)."""
    results = tuple(topics)
    pack_count8(results, "topics")
    out = [pack(CONSUME_HEAD, "request id", request_id, len(results))]
    chunk_bytes = 0
    for i, topic in enumerate(results):
        name = pack_str8(topic.name, "topic name")
        previous = results[i - 1].partitions if i else None
        if previous is not None and not previous and name[:2] == b"\xff\xff":
            # TANK's client looks for the unknown-topic marker after every partition count, even 0: after an empty
            # known topic, a 255-byte name starting with 0xff would read as that marker.
            raise ValueError(f"topic {topic.name[:8]!r}...: its name would read as an unknown-topic marker")
        out.append(name)
        if topic.partitions is None:
            count = topic.partition_count
            out.append(pack(UNKNOWN_TOPIC_FIELDS, f"partition count of {topic.name!r}", count, UNKNOWN_TOPIC))
            continue
        if topic.partition_count != len(topic.partitions):
            raise ValueError(f"topic {topic.name!r}: partition_count {topic.partition_count} != its partitions")
        out.append(pack_count8(topic.partitions, f"partitions of topic {topic.name!r}"))
        for p in topic.partitions:
            out.append(_encode_partition(p, f"{topic.name}/{p.partition}"))
            chunk_bytes += p.chunk_len
    return b"".join(out), chunk_bytes


def encode_consume_head(request_id: int, topics: Iterable[ConsumeTopicResult]) -> bytes:
    """The frame header, header_len and header of a consume response; the chunk bytes (sum of chunk_len) follow."""
    header, chunk_bytes = _encode_header(request_id, topics)
    length = U32.size + len(header) + chunk_bytes
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"consume response of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return FRAME_HEADER.pack(MsgType.CONSUME, length) + U32.pack(len(header)) + header


def encode_consume_response(resp: ConsumeResponse) -> bytes:
    """The whole payload, chunks included (clients in tests, and small responses built in memory)."""
    header, chunk_bytes = _encode_header(resp.request_id, resp.topics)
    lengths = [p.chunk_len for t in resp.topics for p in t.partitions or () if p.status in _WITH_CHUNK]
    if [len(c) for c in resp.chunks] != lengths:
        raise ValueError(f"chunk sizes {[len(c) for c in resp.chunks]} do not match the header's {lengths}")
    return U32.pack(len(header)) + header + b"".join(bytes(c) for c in resp.chunks)


def _read_partition(r: Reader, name: str) -> ConsumePartitionResult:
    partition, status = r.unpack(PARTITION_HEAD, f"partition of topic {name!r}")
    where = f"{name}/{partition}"
    if status not in _STATUSES:
        r.fail(f"{where}: unknown consume status 0x{status:02x}", r.position - 1)
    status = ConsumeStatus(status)
    if status == ConsumeStatus.OK:
        base_seq, hwmark, chunk_len = r.unpack(OK_FIELDS, f"{where} base/hwmark/chunk_len")
        return ConsumePartitionResult(partition, status, base_seq, hwmark, chunk_len)
    if status == ConsumeStatus.SPARSE:
        hwmark, chunk_len = r.unpack(SPARSE_FIELDS, f"{where} hwmark/chunk_len")
        return ConsumePartitionResult(partition, status, 0, hwmark, chunk_len)
    if status == ConsumeStatus.BOUNDARY:
        base_seq, hwmark, chunk_len, first = r.unpack(BOUNDARY_FIELDS, f"{where} boundary fault")
        if chunk_len:
            r.fail(f"{where}: boundary fault with chunk_len {chunk_len}")
        return ConsumePartitionResult(partition, status, base_seq, hwmark, 0, first)
    if status == ConsumeStatus.OTHER_LEADER:
        return ConsumePartitionResult(partition, status, leader=r.endpoint(f"{where} other leader"))
    return ConsumePartitionResult(partition, status)


def read_consume_response(payload: BytesLike) -> ConsumeResponse:
    r = Reader(payload, "consume response")
    header_len = r.u32("header length")
    chunks_at = U32.size + header_len
    if chunks_at > len(r.view):
        r.fail(f"header of {header_len} bytes runs past the end of the payload")
    h = Reader(r.view[:chunks_at], "consume response header")
    h.position = U32.size
    request_id = h.u32("request id")
    topics = []
    for _ in range(h.u8("topic count")):
        name = h.str8("topic name")
        count = h.u8(f"partition count of topic {name!r}")
        # Like TANK's client, look for the unknown-topic marker whatever the partition count.
        if h.remaining() >= U16.size and U16.unpack_from(h.view, h.position)[0] == UNKNOWN_TOPIC:
            h.position += U16.size
            topics.append(ConsumeTopicResult(name, None, count))
            continue
        partitions = tuple(_read_partition(h, name) for _ in range(count))
        topics.append(ConsumeTopicResult(name, partitions, count))
    h.finish()
    r.position = chunks_at
    chunks = []
    for topic in topics:
        for p in topic.partitions or ():
            if p.status in _WITH_CHUNK:
                chunks.append(r.take(p.chunk_len, f"chunk of {topic.name}/{p.partition}"))
    r.finish()
    return ConsumeResponse(request_id, tuple(topics), tuple(chunks))
