"""Response payloads sent by a broker (docs/protocol.md §3.2, §3.4, §3.6-§3.11). The frame header is not part of them.

This module holds produce, create topic, reload conf and status; consume lives in consume_response.py and the
discovery responses in discovery.py; all are re-exported here.

Produce (msg id 0x01, for both 0x01 and 0x05 requests):

    request_id u32
    then for each run of consecutive request topics with the same name, in request order:
      unknown topic: 0xff, read-only topic: 0xfe      ONE byte for the whole run
      else one ProduceStatus byte per partition of the run, in request order; OTHER_LEADER (0xfc) + endpoint

    The partition count of each run comes from the request, so reading a produce response needs the request.

CreateTopic (0x07):   request_id u32, topic str8, status u8 (CreateTopicStatus)
ReloadConf (0x08):    request_id u32, topic str8, partition u16, status u8 (ReloadConfStatus)

Status (0x0a):

    request_id u32, global_flags u8, cluster_aware u8, topics u32, partitions u32   STATUS_HEAD
    [cluster_flags u8, cluster_name str8, available_nodes u32]                        iff cluster_aware
    open_partitions u32, open_partitions_time_ms u32, startup_ts u32 (unix s)        STATUS_OPEN (older brokers: absent)
    version u32 (400)                                                                 (older brokers: absent)

Readers validate every status byte against TANK's codes: TANK's own client aborts on codes it does not know.
The broker encodes its produce answers with `encode_produce_codes` (the same bytes, from plain status bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby

from tiered.protocol.buffers import BytesLike
from tiered.protocol.codes import (
    PRODUCE_PARTITION_STATUSES,
    PRODUCE_TOPIC_STATUSES,
    CreateTopicStatus,
    Endpoint,
    ProduceStatus,
    ReloadConfStatus,
)
from tiered.protocol.consume_response import (
    ConsumePartitionResult,
    ConsumeResponse,
    ConsumeTopicResult,
    encode_consume_head,
    encode_consume_response,
    read_consume_response,
)
from tiered.protocol.discovery import (
    DiscoverPartitionsResponse,
    DiscoverTopicsResponse,
    DiscoverTopologyResponse,
    PartitionRange,
    TopicInfo,
    TopologyNode,
    encode_discover_partitions_response,
    encode_discover_topics_response,
    encode_discover_topology_response,
    read_discover_partitions_response,
    read_discover_topics_response,
    read_discover_topology_response,
)
from tiered.protocol.requests import ProduceRequest
from tiered.protocol.wire import U16, U32, Reader, pack, pack_endpoint, pack_str8

__all__ = [
    "ConsumePartitionResult",
    "ConsumeResponse",
    "ConsumeTopicResult",
    "CreateTopicResponse",
    "DiscoverPartitionsResponse",
    "DiscoverTopicsResponse",
    "DiscoverTopologyResponse",
    "Endpoint",
    "PartitionRange",
    "PartitionStatus",
    "ProduceResponse",
    "ProduceTopicResult",
    "ReloadConfResponse",
    "StatusResponse",
    "TopicInfo",
    "TopologyNode",
    "encode_consume_head",
    "encode_consume_response",
    "encode_create_topic_response",
    "encode_discover_partitions_response",
    "encode_discover_topics_response",
    "encode_discover_topology_response",
    "encode_produce_codes",
    "encode_produce_response",
    "encode_reload_conf_response",
    "encode_status_response",
    "produce_runs",
    "read_consume_response",
    "read_create_topic_response",
    "read_discover_partitions_response",
    "read_discover_topics_response",
    "read_discover_topology_response",
    "read_produce_response",
    "read_reload_conf_response",
    "read_status_response",
]

REQUEST_ID = struct.Struct("<I")
STATUS_HEAD = struct.Struct("<IBBII")  # request_id, global_flags, cluster_aware, topics, partitions
STATUS_CLUSTER_FLAGS = struct.Struct("<B")  # cluster_flags (then cluster_name str8, available_nodes u32)
STATUS_OPEN = struct.Struct("<III")  # open_partitions, open_partitions_time_ms, startup_ts
STATUS_VERSION = struct.Struct("<I")  # version

_CREATE_STATUSES = frozenset(CreateTopicStatus)
_RELOAD_STATUSES = frozenset(ReloadConfStatus)


# --- produce ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    code: int  # ProduceStatus, partition-level
    leader: Endpoint | None = None  # iff code is OTHER_LEADER


@dataclass(frozen=True, slots=True)
class ProduceTopicResult:
    name: str
    status: int | None  # UNKNOWN_TOPIC or READ_ONLY for the whole topic (then partitions is empty), else None
    partitions: tuple[PartitionStatus, ...]


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    request_id: int
    # Read: one per run of consecutive request topics with the same name. Encoded: one per request topic will do.
    topics: tuple[ProduceTopicResult, ...]


def produce_runs(request: ProduceRequest) -> list[tuple[str, int]]:
    """(topic name, partition count) of each run of consecutive request topics with the same name."""
    return [(name, sum(len(t.partitions) for t in run)) for name, run in groupby(request.topics, lambda t: t.name)]


def encode_produce_response(resp: ProduceResponse) -> bytes:
    """Consecutive results with the same topic name are one run on the wire, as TANK writes them: their partition
    bytes follow each other, and a topic-level status is written once for the whole run."""
    out = [pack(REQUEST_ID, "request id", resp.request_id)]
    for name, group in groupby(resp.topics, lambda t: t.name):
        run = list(group)
        statuses = {t.status for t in run}
        if statuses != {None}:
            status = statuses.pop() if len(statuses) == 1 else None
            if status not in PRODUCE_TOPIC_STATUSES:
                raise ValueError(f"topic {name!r}: {statuses} is not one topic-level produce status for the run")
            if any(t.partitions for t in run):
                raise ValueError(f"topic {name!r}: a topic-level status stands for all its partitions")
            out.append(bytes((status,)))
            continue
        for i, p in enumerate(p for t in run for p in t.partitions):
            where = f"topic {name!r} partition #{i}"
            if p.code not in PRODUCE_PARTITION_STATUSES:
                raise ValueError(f"{where}: {p.code} is not a partition-level produce status")
            out.append(bytes((p.code,)))
            if p.code == ProduceStatus.OTHER_LEADER:
                out.append(pack_endpoint(p.leader, f"{where} other leader"))
            elif p.leader is not None:
                raise ValueError(f"{where}: a leader is only sent with OTHER_LEADER")
    return b"".join(out)


# Partition-level statuses a broker answers with that carry nothing more (OTHER_LEADER carries an endpoint).
_PLAIN_PARTITION_STATUSES = bytes(sorted(PRODUCE_PARTITION_STATUSES - {ProduceStatus.OTHER_LEADER}))
_OK_BYTE = bytes([ProduceStatus.OK])


PRODUCE_FRAME_HEAD = struct.Struct("<BII")  # the frame's msg_id and length, then the answer's request id


def _produce_codes_frame_py(request_id: int, codes: BytesLike) -> bytes | None:
    """The whole frame (docs/protocol.md §1) of the commonest produce answer: one topic answered per partition, every
    code plain (no endpoint follows it), as encode_produce_codes encodes it; None for any other, which that encodes
    or refuses. The reference of the native `produce_codes_frame`."""
    if not 0 <= request_id <= 0xFFFF_FFFF or len(codes) > 255 or bytes(codes).translate(None, _PLAIN_PARTITION_STATUSES):
        return None
    return PRODUCE_FRAME_HEAD.pack(_PRODUCE_ID, 4 + len(codes), request_id) + bytes(codes)


_PRODUCE_ID = 1  # MsgType.PRODUCE (tiered.protocol.frame), the id of every produce answer
_produce_codes_frame_native: Callable[[int, BytesLike], bytes | None] | None
try:
    from tiered.protocol._bundlescan import produce_codes_frame as _produce_codes_frame_native
except ImportError:  # no C compiler at install: the reference serves
    _produce_codes_frame_native = None
produce_codes_frame = _produce_codes_frame_py if _produce_codes_frame_native is None else _produce_codes_frame_native


def encode_produce_codes(request_id: int, topics: Sequence[tuple[str, int | None, bytes | bytearray]]) -> bytes:
    """encode_produce_response for a broker's answer, without building the dataclasses: `topics` holds each request
    topic, in request order, as (name, topic-level status or None, a bytes-like of one partition status per
    partition); OTHER_LEADER is not among them. The same bytes as encode_produce_response, and the same refusals."""
    if len(topics) == 1:  # what almost every request names: one topic, answered per partition
        name, status, codes = topics[0]
        # All OK (strip: the cheapest test of that, ~4x faster than the translate), or only plain codes.
        if status is None and (not codes.strip(_OK_BYTE) or not codes.translate(None, _PLAIN_PARTITION_STATUSES)):
            try:
                return REQUEST_ID.pack(request_id) + codes  # the struct itself: no frame of `pack` per answer
            except struct.error:
                pass  # a request id out of range: refused below, as `pack` refuses it
    out = bytearray(pack(REQUEST_ID, "request id", request_id))
    run_name = run_status = None
    for i, (name, status, codes) in enumerate(topics):
        in_run = i > 0 and name == run_name
        if in_run and status != run_status:
            raise ValueError(f"topic {name!r}: {{{run_status}, {status}}} is not one topic-level produce status for "
                             "the run")
        run_name, run_status = name, status
        if status is None:
            if codes.translate(None, _PLAIN_PARTITION_STATUSES):
                raise ValueError(f"topic {name!r}: {bytes(codes).hex()} holds a code that is not a plain "
                                 "partition-level produce status")
            out += codes
        elif status not in PRODUCE_TOPIC_STATUSES:
            raise ValueError(f"topic {name!r}: {status} is not one topic-level produce status for the run")
        elif codes:
            raise ValueError(f"topic {name!r}: a topic-level status stands for all its partitions")
        elif not in_run:
            out.append(status)
    return bytes(out)


def read_produce_response(payload: BytesLike, request: ProduceRequest) -> ProduceResponse:
    r = Reader(payload, "produce response")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    topics = []
    for name, count in produce_runs(request):
        partitions = []
        for i in range(count):
            code = r.u8(f"status of topic {name!r} partition #{i}")
            if i == 0 and code in PRODUCE_TOPIC_STATUSES:
                topics.append(ProduceTopicResult(name, ProduceStatus(code), ()))
                break
            if code not in PRODUCE_PARTITION_STATUSES:
                r.fail(f"unknown produce status 0x{code:02x} for topic {name!r} partition #{i}", r.position - 1)
            leader = None
            if code == ProduceStatus.OTHER_LEADER:
                leader = r.endpoint(f"other leader of {name!r} partition #{i}")
            partitions.append(PartitionStatus(ProduceStatus(code), leader))
        else:
            topics.append(ProduceTopicResult(name, None, tuple(partitions)))
    r.finish()
    return ProduceResponse(request_id, tuple(topics))


# --- create topic, reload conf ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateTopicResponse:
    request_id: int
    topic: str
    status: int  # CreateTopicStatus


def encode_create_topic_response(resp: CreateTopicResponse) -> bytes:
    if resp.status not in _CREATE_STATUSES:
        raise ValueError(f"unknown create topic status {resp.status}")
    return pack(REQUEST_ID, "request id", resp.request_id) + pack_str8(resp.topic, "topic name") + bytes((resp.status,))


def read_create_topic_response(payload: BytesLike) -> CreateTopicResponse:
    r = Reader(payload, "create topic response")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    topic = r.str8("topic name")
    status = r.u8("status")
    if status not in _CREATE_STATUSES:
        r.fail(f"unknown create topic status 0x{status:02x}", r.position - 1)
    r.finish()
    return CreateTopicResponse(request_id, topic, CreateTopicStatus(status))


@dataclass(frozen=True, slots=True)
class ReloadConfResponse:
    request_id: int
    topic: str
    partition: int
    status: int  # ReloadConfStatus


def encode_reload_conf_response(resp: ReloadConfResponse) -> bytes:
    if resp.status not in _RELOAD_STATUSES:
        raise ValueError(f"unknown reload conf status {resp.status}")
    return (
        pack(REQUEST_ID, "request id", resp.request_id)
        + pack_str8(resp.topic, "topic name")
        + pack(U16, "partition id", resp.partition)
        + bytes((resp.status,))
    )


def read_reload_conf_response(payload: BytesLike) -> ReloadConfResponse:
    r = Reader(payload, "reload conf response")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    topic = r.str8("topic name")
    partition = r.u16("partition id")
    status = r.u8("status")
    if status not in _RELOAD_STATUSES:
        r.fail(f"unknown reload conf status 0x{status:02x}", r.position - 1)
    r.finish()
    return ReloadConfResponse(request_id, topic, partition, ReloadConfStatus(status))


# --- status -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusResponse:
    request_id: int
    topics: int
    partitions: int
    open_partitions: int = 0
    open_partitions_time_ms: int = 0
    startup_ts: int = 0  # unix seconds
    version: int = 400  # TANK 4.0.0; read as 0 from an older broker that does not send it
    global_flags: int = 0
    cluster_aware: bool = False
    cluster_flags: int = 0  # these three only on the wire when cluster_aware
    cluster_name: str = ""
    available_nodes: int = 0


def encode_status_response(resp: StatusResponse) -> bytes:
    out = [
        pack(
            STATUS_HEAD,
            "status header",
            resp.request_id,
            resp.global_flags,
            int(resp.cluster_aware),
            resp.topics,
            resp.partitions,
        )
    ]
    if resp.cluster_aware:
        out.append(pack(STATUS_CLUSTER_FLAGS, "cluster flags", resp.cluster_flags))
        out.append(pack_str8(resp.cluster_name, "cluster name"))
        out.append(pack(U32, "available nodes", resp.available_nodes))
    elif resp.cluster_flags or resp.cluster_name or resp.available_nodes:
        raise ValueError("cluster_flags, cluster_name and available_nodes are only sent when cluster_aware")
    out.append(
        pack(STATUS_OPEN, "open partitions", resp.open_partitions, resp.open_partitions_time_ms, resp.startup_ts)
    )
    out.append(pack(STATUS_VERSION, "version", resp.version))
    return b"".join(out)


def read_status_response(payload: BytesLike) -> StatusResponse:
    r = Reader(payload, "status response")
    request_id, global_flags, cluster_aware, topics, partitions = r.unpack(STATUS_HEAD, "header")
    if cluster_aware > 1:
        r.fail(f"cluster_aware is {cluster_aware}, not a bool", 5)
    cluster_flags, cluster_name, available_nodes = 0, "", 0
    if cluster_aware:
        (cluster_flags,) = r.unpack(STATUS_CLUSTER_FLAGS, "cluster flags")
        cluster_name = r.str8("cluster name")
        available_nodes = r.u32("available nodes")
    open_partitions = open_time_ms = startup_ts = version = 0
    # Like TANK's client: the open-partition fields and the version are each optional, for older brokers.
    if r.remaining():
        open_partitions, open_time_ms, startup_ts = r.unpack(STATUS_OPEN, "open partitions")
        if r.remaining():
            (version,) = r.unpack(STATUS_VERSION, "version")
    r.finish()
    return StatusResponse(
        request_id,
        topics,
        partitions,
        open_partitions,
        open_time_ms,
        startup_ts,
        version,
        global_flags,
        bool(cluster_aware),
        cluster_flags,
        cluster_name,
        available_nodes,
    )
