"""Request payloads sent by clients (docs/protocol.md §3.1, §3.3, §3.6-§3.11). The frame header is not part of them.

Produce (0x01) / ProduceWithSeqnum (0x05):

    client_version u16, request_id u32           PRODUCE_HEAD
    client_id      str8                          TANK's client sends "c++"; brokers skip it
    required_acks  u8, ack_timeout_ms u32        PRODUCE_ACKS (cluster mode only)
    topics u8 × { name str8, partitions u8 × {
        partition u16, bundle_len varint, [base_seq u64, 0x05 only], bundle (bundle_len bytes) } }

    bundle_len counts the bundle alone; for 0x05 the base_seq sits between it and the bundle.

Consume (0x02):

    client_version u16, request_id u32           CONSUME_HEAD
    client_id      str8                          TANK's client sends ""
    max_wait_ms u64, min_bytes u32               CONSUME_WAIT
    [op_flags u8]                                iff client_version >= 3 (ConsumeFlags)
    topics u8 × { name str8, partitions u8 × { partition u16, seq u64, fetch_size u32 } }   CONSUME_PARTITION

DiscoverPartitions (0x06):  request_id u32, topic str8, [partition u16 ...]   (no list: every partition)
CreateTopic (0x07):         request_id u32, topic str8, partitions u16, config_len varint, config
ReloadConf (0x08):          request_id u32, topic str8, partition u16
Status (0x0a):              request_id u32
DiscoverTopics (0x0b):      request_id u32, flags u8
DiscoverTopology (0x0c):    request_id u32, flags u8

Readers take a frame payload (bytes or memoryview) and raise ProtocolError on anything that does not parse exactly
to its end. Bundles are returned as views of the payload: `read_produce_request` checks framing only;
`read_checked_produce` (what the broker reads) also validates every bundle completely, in one native pass when the
extension (_bundlescan.c) is built, hands out read-only views only, and gives a plain-produce partition its
`record` view where it may (ProducePartition.record), which the log appends without a copy. A record view keeps its payload
alive until its block is uploaded, so a payload must never be written after it is read (connection.py holds to it).

The produce request types are NamedTuples rather than frozen dataclasses: the broker builds them for every request,
and a tuple is built ten times faster.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from tiered.protocol.buffers import BytesLike
from tiered.protocol.bundle import BundleFacts, validate_bundle
from tiered.protocol.codes import Endpoint
from tiered.protocol.frame import MsgType
from tiered.protocol.varint import varint_size
from tiered.protocol.wire import U8, U16, U32, U64, Reader, pack, pack_count8, pack_str8, pack_varint

__all__ = [
    "ConsumePartition",
    "ConsumeRequest",
    "ConsumeTopic",
    "CreateTopicRequest",
    "DiscoverPartitionsRequest",
    "DiscoverTopicsRequest",
    "DiscoverTopologyRequest",
    "Endpoint",
    "ProducePartition",
    "ProduceRequest",
    "ProduceTopic",
    "ReloadConfRequest",
    "StatusRequest",
    "encode_consume_request",
    "encode_create_topic_request",
    "encode_discover_partitions_request",
    "encode_discover_topics_request",
    "encode_discover_topology_request",
    "encode_produce_request",
    "encode_reload_conf_request",
    "encode_status_request",
    "peek_request_id",
    "read_consume_request",
    "read_create_topic_request",
    "read_discover_partitions_request",
    "read_discover_topics_request",
    "read_discover_topology_request",
    "read_checked_produce",
    "read_produce_request",
    "read_reload_conf_request",
    "read_status_request",
]

PRODUCE_HEAD = struct.Struct("<HI")  # client_version, request_id
PRODUCE_ACKS = struct.Struct("<BI")  # required_acks, ack_timeout_ms
CONSUME_HEAD = struct.Struct("<HI")  # client_version, request_id
CONSUME_WAIT = struct.Struct("<QI")  # max_wait_ms, min_bytes
CONSUME_PARTITION = struct.Struct("<HQI")  # partition, seq, fetch_size
TOPIC_PARTITION = struct.Struct("<H")  # partition (DiscoverPartitions list entries, ReloadConf)
REQUEST_ID = struct.Struct("<I")  # the first field of every request but produce and consume
ID_AND_FLAGS = struct.Struct("<IB")  # request_id, flags (DiscoverTopics, DiscoverTopology)

# Consume requests carry op_flags from this client_version on (TANK_SUPPORT_CONSUME_FLAGS).
CONSUME_FLAGS_VERSION = 3


# --- produce ----------------------------------------------------------------------------------------------------


class ProducePartition(NamedTuple):
    partition: int
    bundle: bytes | memoryview
    base_seq: int | None = None  # ProduceWithSeqnum (0x05) only
    # `{varint length, bundle}` exactly as a segment holds it, as a read-only view of the payload: set by the broker's
    # reader (read_checked_produce) when the payload holds those bytes contiguously (a plain produce: no base seq
    # between them), the length is in its minimal encoding, and the record is at least half of the payload, so the
    # append writes the payload's bytes without joining a copy. None otherwise: the append then builds the record (a
    # segment holds TANK's bytes, and TANK writes the minimal encoding). The half: a view keeps its whole payload
    # alive until its block is uploaded, so what views hold stays within twice the bytes of the blocks holding them,
    # whatever else a request carries (a big bundle for a partition not led here beside a small one, say).
    record: memoryview | None = None


class ProduceTopic(NamedTuple):
    name: str
    partitions: tuple[ProducePartition, ...]


class ProduceRequest(NamedTuple):
    request_id: int
    topics: tuple[ProduceTopic, ...]
    with_seqnum: bool = False  # sent as MsgType.PRODUCE_WITH_SEQNUM
    client_version: int = 2
    client_id: str = "c++"
    required_acks: int = 0
    ack_timeout_ms: int = 0


def read_produce_request(payload: BytesLike, with_seqnum: bool, records: bool = False) -> ProduceRequest:
    """`records`: also set each partition's `record` where the payload allows (what read_checked_produce reads), and
    read through a read-only view, so no bundle or record handed out can write into the payload."""
    if records:
        payload = memoryview(payload).toreadonly()
    r = Reader(payload, "produce with seqnum request" if with_seqnum else "produce request")
    client_version, request_id = r.unpack(PRODUCE_HEAD, "header")
    client_id = r.str8("client id")
    required_acks, ack_timeout_ms = r.unpack(PRODUCE_ACKS, "acks")
    topics = []
    for _ in range(r.u8("topic count")):
        name = r.str8("topic name")
        partitions = []
        for _ in range(r.u8(f"partition count of topic {name!r}")):
            partition = r.u16(f"partition id in topic {name!r}")
            where = f"{name}/{partition}"
            length_at = r.position
            size = r.varint(f"bundle length of {where}")
            base_seq = r.u64(f"base seq of {where}") if with_seqnum else None
            start = r.position
            bundle = r.take(size, f"bundle of {where}")
            record = None
            if (records and not with_seqnum and start - length_at == varint_size(size)
                    and 2 * (r.position - length_at) >= len(r.view)):
                record = r.view[length_at : r.position]
            partitions.append(ProducePartition(partition, bundle, base_seq, record))
        topics.append(ProduceTopic(name, tuple(partitions)))
    r.finish()
    return ProduceRequest(
        request_id, tuple(topics), with_seqnum, client_version, client_id, required_acks, ack_timeout_ms
    )


def read_checked_produce(payload: BytesLike, with_seqnum: bool) -> tuple[ProduceRequest, list[BundleFacts]]:
    """The request, as read_produce_request reads it, and the facts of each of its bundles in request order, every
    bundle validated completely (validate_bundle). Raises the ProtocolError that reading the request, then validating
    its bundles one by one, would raise first."""
    if _scan_produce is not None:
        got = _scan_produce(payload, with_seqnum)
        if got is not None:
            return got
    req = read_produce_request(payload, with_seqnum, records=True)  # raises for the framing fault the scan found
    return req, [validate_bundle(p.bundle) for t in req.topics for p in t.partitions]


def encode_produce_request(req: ProduceRequest) -> bytes:
    out = [
        pack(PRODUCE_HEAD, "produce client_version/request_id", req.client_version, req.request_id),
        pack_str8(req.client_id, "client id"),
        pack(PRODUCE_ACKS, "required_acks/ack_timeout_ms", req.required_acks, req.ack_timeout_ms),
        pack_count8(req.topics, "topics"),
    ]
    for topic in req.topics:
        out.append(pack_str8(topic.name, "topic name"))
        out.append(pack_count8(topic.partitions, f"partitions of topic {topic.name!r}"))
        for p in topic.partitions:
            where = f"{topic.name}/{p.partition}"
            out.append(pack(U16, f"partition id of {where}", p.partition))
            out.append(pack_varint(len(p.bundle), f"bundle length of {where}"))
            if req.with_seqnum:
                if p.base_seq is None:
                    raise ValueError(f"{where}: a produce with seqnum needs a base_seq for every partition")
                out.append(pack(U64, f"base seq of {where}", p.base_seq))
            elif p.base_seq is not None:
                raise ValueError(f"{where}: base_seq is only sent by a produce with seqnum")
            out.append(bytes(p.bundle))
    return b"".join(out)


# --- consume ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumePartition:
    partition: int
    seq: int  # 0: from the first available seq; UINT64_MAX: tail
    fetch_size: int


@dataclass(frozen=True, slots=True)
class ConsumeTopic:
    name: str
    partitions: tuple[ConsumePartition, ...]


@dataclass(frozen=True, slots=True)
class ConsumeRequest:
    request_id: int
    max_wait_ms: int
    min_bytes: int
    topics: tuple[ConsumeTopic, ...]
    client_version: int = 2  # the encoder sends 3 when op_flags != 0, since only v3 carries them
    client_id: str = ""
    op_flags: int = 0  # ConsumeFlags


UNANSWERABLE_PARTITION = 0xFFFF  # docs/protocol.md §3.4: `ffff` after a partition count means "unknown topic"


def read_consume_request(payload: BytesLike) -> ConsumeRequest:
    r = Reader(payload, "consume request")
    client_version, request_id = r.unpack(CONSUME_HEAD, "header")
    client_id = r.str8("client id")
    max_wait_ms, min_bytes = r.unpack(CONSUME_WAIT, "max_wait_ms/min_bytes")
    op_flags = r.u8("op_flags") if client_version >= CONSUME_FLAGS_VERSION else 0
    topics = []
    for _ in range(r.u8("topic count")):
        name = r.str8("topic name")
        partitions = []
        for _ in range(r.u8(f"partition count of topic {name!r}")):
            position = r.position
            partition = ConsumePartition(*r.unpack(CONSUME_PARTITION, f"partition of topic {name!r}"))
            if partition.partition == UNANSWERABLE_PARTITION:
                r.fail(f"partition id 0xffff of topic {name!r} cannot be answered: in a consume response it reads as "
                       "the unknown-topic marker (partition ids are 0..65534)", position)
            partitions.append(partition)
        topics.append(ConsumeTopic(name, tuple(partitions)))
    r.finish()
    return ConsumeRequest(request_id, max_wait_ms, min_bytes, tuple(topics), client_version, client_id, op_flags)


def encode_consume_request(req: ConsumeRequest) -> bytes:
    version = req.client_version
    if req.op_flags and version < CONSUME_FLAGS_VERSION:
        version = CONSUME_FLAGS_VERSION
    out = [
        pack(CONSUME_HEAD, "consume client_version/request_id", version, req.request_id),
        pack_str8(req.client_id, "client id"),
        pack(CONSUME_WAIT, "max_wait_ms/min_bytes", req.max_wait_ms, req.min_bytes),
    ]
    if version >= CONSUME_FLAGS_VERSION:
        out.append(pack(U8, "op_flags", req.op_flags))
    out.append(pack_count8(req.topics, "topics"))
    for topic in req.topics:
        out.append(pack_str8(topic.name, "topic name"))
        out.append(pack_count8(topic.partitions, f"partitions of topic {topic.name!r}"))
        for p in topic.partitions:
            out.append(pack(CONSUME_PARTITION, f"partition of topic {topic.name!r}", p.partition, p.seq, p.fetch_size))
    return b"".join(out)


# --- the small requests -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DiscoverPartitionsRequest:
    request_id: int
    topic: str
    partitions: tuple[int, ...] | None = None  # None: every partition; TANK's client lists them only on retries


def read_discover_partitions_request(payload: BytesLike) -> DiscoverPartitionsRequest:
    r = Reader(payload, "discover partitions request")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    topic = r.str8("topic name")
    if r.remaining() % TOPIC_PARTITION.size:
        r.fail("partition list has an odd number of bytes")
    partitions = tuple(r.u16("partition id") for _ in range(r.remaining() // TOPIC_PARTITION.size))
    r.finish()
    return DiscoverPartitionsRequest(request_id, topic, partitions or None)


def encode_discover_partitions_request(req: DiscoverPartitionsRequest) -> bytes:
    out = [pack(REQUEST_ID, "request id", req.request_id), pack_str8(req.topic, "topic name")]
    if req.partitions is not None:
        if not req.partitions:
            raise ValueError("an empty partition list is sent as no list: use partitions=None for all of them")
        out.extend(pack(TOPIC_PARTITION, "partition id", p) for p in req.partitions)
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    request_id: int
    topic: str
    partitions: int
    config: bytes  # the text form of a topic config: b"key=value\n..."


def read_create_topic_request(payload: BytesLike) -> CreateTopicRequest:
    r = Reader(payload, "create topic request")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    topic = r.str8("topic name")
    partitions = r.u16("partition count")
    config = bytes(r.take(r.varint("config length"), "config"))
    r.finish()
    return CreateTopicRequest(request_id, topic, partitions, config)


def encode_create_topic_request(req: CreateTopicRequest) -> bytes:
    return b"".join(
        (
            pack(REQUEST_ID, "request id", req.request_id),
            pack_str8(req.topic, "topic name"),
            pack(U16, "partition count", req.partitions),
            pack_varint(len(req.config), "config length"),
            bytes(req.config),
        )
    )


@dataclass(frozen=True, slots=True)
class ReloadConfRequest:
    request_id: int
    topic: str
    partition: int


def read_reload_conf_request(payload: BytesLike) -> ReloadConfRequest:
    r = Reader(payload, "reload conf request")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    topic = r.str8("topic name")
    partition = r.u16("partition id")
    r.finish()
    return ReloadConfRequest(request_id, topic, partition)


def encode_reload_conf_request(req: ReloadConfRequest) -> bytes:
    return (
        pack(REQUEST_ID, "request id", req.request_id)
        + pack_str8(req.topic, "topic name")
        + pack(TOPIC_PARTITION, "partition id", req.partition)
    )


@dataclass(frozen=True, slots=True)
class StatusRequest:
    request_id: int


def read_status_request(payload: BytesLike) -> StatusRequest:
    r = Reader(payload, "status request")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    r.finish()
    return StatusRequest(request_id)


def encode_status_request(req: StatusRequest) -> bytes:
    return pack(REQUEST_ID, "request id", req.request_id)


@dataclass(frozen=True, slots=True)
class DiscoverTopicsRequest:
    request_id: int
    flags: int = 0


def read_discover_topics_request(payload: BytesLike) -> DiscoverTopicsRequest:
    r = Reader(payload, "discover topics request")
    request_id, flags = r.unpack(ID_AND_FLAGS, "request id/flags")
    r.finish()
    return DiscoverTopicsRequest(request_id, flags)


def encode_discover_topics_request(req: DiscoverTopicsRequest) -> bytes:
    return pack(ID_AND_FLAGS, "request id/flags", req.request_id, req.flags)


@dataclass(frozen=True, slots=True)
class DiscoverTopologyRequest:
    request_id: int
    flags: int = 0


def read_discover_topology_request(payload: BytesLike) -> DiscoverTopologyRequest:
    r = Reader(payload, "discover topology request")
    request_id, flags = r.unpack(ID_AND_FLAGS, "request id/flags")
    r.finish()
    return DiscoverTopologyRequest(request_id, flags)


def encode_discover_topology_request(req: DiscoverTopologyRequest) -> bytes:
    return pack(ID_AND_FLAGS, "request id/flags", req.request_id, req.flags)


# --- logging --------------------------------------------------------------------------------------------------------

# Where the request id sits in each request's payload: after client_version (u16) in produce and consume, first
# in every other request.
_REQUEST_ID_POSITION: dict[int, int] = {
    MsgType.PRODUCE: 2,
    MsgType.PRODUCE_WITH_SEQNUM: 2,
    MsgType.CONSUME: 2,
    MsgType.DISCOVER_PARTITIONS: 0,
    MsgType.CREATE_TOPIC: 0,
    MsgType.RELOAD_CONF: 0,
    MsgType.STATUS: 0,
    MsgType.DISCOVER_TOPICS: 0,
    MsgType.DISCOVER_TOPOLOGY: 0,
}


def peek_request_id(msg_id: int, payload: BytesLike) -> int | None:
    """The request id of a request that may not parse, for logging it; None when there is none to find."""
    position = _REQUEST_ID_POSITION.get(msg_id)
    if position is None or len(payload) < position + REQUEST_ID.size:
        return None
    request_id: int = U32.unpack_from(payload, position)[0]
    return request_id


_scan_produce: Callable[[BytesLike, bool], tuple[ProduceRequest, list[BundleFacts]] | None] | None
try:
    from tiered.protocol import _bundlescan
except ImportError:  # the extension is not built: read_checked_produce reads and validates in Python
    _scan_produce = None
else:
    _bundlescan.register(BundleFacts, ProduceRequest, ProduceTopic, ProducePartition)
    _scan_produce = _bundlescan.scan_produce
