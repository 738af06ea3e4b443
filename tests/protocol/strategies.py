"""Hypothesis strategies for every request, response and bundle, and the registry of codecs the generic tests walk."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, Message, encode_bundle
from tiered.protocol.codes import (
    PRODUCE_PARTITION_STATUSES,
    PRODUCE_TOPIC_STATUSES,
    UINT64_MAX,
    ConsumeStatus,
    CreateTopicStatus,
    DiscoverReason,
    Endpoint,
    NodeFlags,
    ProduceStatus,
    ReloadConfStatus,
)
from tiered.protocol.frame import MsgType
from tiered.protocol import requests as rq
from tiered.protocol import responses as rs


def budget(max_examples: int) -> settings:
    """Bounded example counts keep the protocol tests fast; on a shared, loaded machine slow generation is no bug."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, UINT64_MAX)

# Any byte is a valid name character (latin-1); a few fixed names make consecutive repeats (produce runs) likely.
names = st.one_of(
    st.sampled_from(["pyt", "nosuch", "events"]),
    st.text(st.characters(max_codepoint=0xFF), max_size=12),
    st.text(st.characters(max_codepoint=0xFF), min_size=250, max_size=255),
)
endpoints = st.builds(Endpoint, st.ip_addresses(v=4).map(str), u16)


def small_tuples(elements, min_size=0, max_size=4):
    return st.lists(elements, min_size=min_size, max_size=max_size).map(tuple)


# --- requests -------------------------------------------------------------------------------------------------------


@st.composite
def produce_requests(draw) -> rq.ProduceRequest:
    with_seqnum = draw(st.booleans())
    partition = st.builds(rq.ProducePartition, u16, st.binary(max_size=200), u64 if with_seqnum else st.none(),
                          record=st.none())  # the reader sets `record` only when asked (read_checked_produce)
    topics = draw(small_tuples(st.builds(rq.ProduceTopic, names, small_tuples(partition))))
    return rq.ProduceRequest(draw(u32), topics, with_seqnum, draw(u16), draw(names), draw(u8), draw(u32))


@st.composite
def consume_requests(draw) -> rq.ConsumeRequest:
    version = draw(st.one_of(st.sampled_from([2, 3]), u16))
    op_flags = draw(u8) if version >= 3 else 0
    # 0xffff is refused by the reader: a consume response uses it as the unknown-topic marker.
    partition = st.builds(rq.ConsumePartition, st.integers(0, 0xFFFE), u64, u32)
    topics = draw(small_tuples(st.builds(rq.ConsumeTopic, names, small_tuples(partition))))
    return rq.ConsumeRequest(draw(u32), draw(u64), draw(u32), topics, version, draw(names), op_flags)


discover_partitions_requests = st.builds(
    rq.DiscoverPartitionsRequest, u32, names, st.none() | small_tuples(u16, min_size=1, max_size=8)
)
create_topic_requests = st.builds(rq.CreateTopicRequest, u32, names, u16, st.binary(max_size=300))
reload_conf_requests = st.builds(rq.ReloadConfRequest, u32, names, u16)
status_requests = st.builds(rq.StatusRequest, u32)
discover_topics_requests = st.builds(rq.DiscoverTopicsRequest, u32, u8)
discover_topology_requests = st.builds(rq.DiscoverTopologyRequest, u32, u8)


# --- responses ------------------------------------------------------------------------------------------------------


@st.composite
def partition_statuses(draw) -> rs.PartitionStatus:
    code = draw(st.sampled_from(sorted(PRODUCE_PARTITION_STATUSES)))
    return rs.PartitionStatus(code, draw(endpoints) if code == ProduceStatus.OTHER_LEADER else None)


@st.composite
def produce_responses(draw) -> tuple[rs.ProduceResponse, rq.ProduceRequest]:
    request = draw(produce_requests())
    topics = []
    for name, count in rs.produce_runs(request):
        if count and draw(st.booleans()):
            topics.append(rs.ProduceTopicResult(name, draw(st.sampled_from(sorted(PRODUCE_TOPIC_STATUSES))), ()))
        else:
            statuses = draw(st.lists(partition_statuses(), min_size=count, max_size=count).map(tuple))
            topics.append(rs.ProduceTopicResult(name, None, statuses))
    return rs.ProduceResponse(request.request_id, tuple(topics)), request


partition_ids = st.integers(0, 0xFFFE)  # 0xFFFF in place of a partition id marks an unknown topic
chunk_lens = st.integers(0, 48)
consume_partition_results = st.one_of(
    st.builds(
        rs.ConsumePartitionResult,
        partition_ids,
        st.just(ConsumeStatus.OK),
        base_seq=u64,
        hwmark=u64,
        chunk_len=chunk_lens,
    ),
    st.builds(
        rs.ConsumePartitionResult, partition_ids, st.just(ConsumeStatus.SPARSE), hwmark=u64, chunk_len=chunk_lens
    ),
    st.builds(
        rs.ConsumePartitionResult,
        partition_ids,
        st.just(ConsumeStatus.BOUNDARY),
        base_seq=u64,
        hwmark=u64,
        first_available=u64,
    ),
    st.builds(rs.ConsumePartitionResult, partition_ids, st.just(ConsumeStatus.OTHER_LEADER), leader=endpoints),
    st.builds(
        rs.ConsumePartitionResult,
        partition_ids,
        st.sampled_from([ConsumeStatus.SYSTEM, ConsumeStatus.NO_LEADER, ConsumeStatus.UNKNOWN_PARTITION]),
    ),
)


@st.composite
def consume_topic_results(draw) -> rs.ConsumeTopicResult:
    name = draw(names)
    if draw(st.integers(0, 4)) == 0:
        return rs.ConsumeTopicResult(name, None, draw(u8))
    partitions = draw(small_tuples(consume_partition_results, min_size=1))
    return rs.ConsumeTopicResult(name, partitions, len(partitions))


@st.composite
def consume_responses(draw) -> rs.ConsumeResponse:
    topics = draw(small_tuples(consume_topic_results()))
    chunks = tuple(
        draw(st.binary(min_size=p.chunk_len, max_size=p.chunk_len))
        for t in topics
        for p in t.partitions or ()
        if p.status in (ConsumeStatus.OK, ConsumeStatus.SPARSE)
    )
    return rs.ConsumeResponse(draw(u32), topics, chunks)


partition_ranges = st.one_of(
    st.builds(rs.PartitionRange, u64, u64).filter(lambda p: not p.first_available == p.hwmark == UINT64_MAX),
    st.builds(
        rs.PartitionRange,
        st.just(UINT64_MAX),
        st.just(UINT64_MAX),
        st.sampled_from([DiscoverReason.SYSTEM, DiscoverReason.NO_LEADER]),
    ),
    st.builds(
        rs.PartitionRange, st.just(UINT64_MAX), st.just(UINT64_MAX), st.just(DiscoverReason.OTHER_LEADER), endpoints
    ),
)
discover_partitions_responses = st.builds(
    rs.DiscoverPartitionsResponse, u32, names, small_tuples(partition_ranges, max_size=6)
)
create_topic_responses = st.builds(rs.CreateTopicResponse, u32, names, st.sampled_from(list(CreateTopicStatus)))
reload_conf_responses = st.builds(rs.ReloadConfResponse, u32, names, u16, st.sampled_from(list(ReloadConfStatus)))


@st.composite
def status_responses(draw) -> rs.StatusResponse:
    cluster_aware = draw(st.booleans())
    cluster = (draw(u8), draw(names), draw(u32)) if cluster_aware else (0, "", 0)
    return rs.StatusResponse(
        draw(u32), draw(u32), draw(u32), draw(u32), draw(u32), draw(u32), draw(u32), draw(u8), cluster_aware, *cluster
    )


@st.composite
def discover_topics_responses(draw) -> rs.DiscoverTopicsResponse:
    cluster_aware = draw(st.booleans())
    topic = st.builds(rs.TopicInfo, names, st.booleans(), u16, u8 if cluster_aware else st.none())
    return rs.DiscoverTopicsResponse(draw(u32), draw(small_tuples(topic, max_size=6)), cluster_aware)


@st.composite
def topology_nodes(draw) -> rs.TopologyNode:
    flags = draw(u8)
    endpoint = draw(endpoints) if flags & NodeFlags.HAS_ENDPOINT else None
    return rs.TopologyNode(draw(u16), flags, endpoint, draw(u16))


discover_topology_responses = st.one_of(
    st.builds(rs.DiscoverTopologyResponse, u32),
    st.builds(rs.DiscoverTopologyResponse, u32, names, small_tuples(topology_nodes(), max_size=5)),
)


# --- the registry ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Codec:
    name: str
    msg_id: int
    cases: st.SearchStrategy  # draws (value, reader): the reader takes a payload and returns the value
    encode: Callable[[Any], bytes]
    # Some layouts end in an optional or repeated part: these say which prefix lengths of an encoding of `value`
    # are valid encodings themselves, and which extra bytes after an encoding are a valid continuation.
    valid_prefixes: Callable[[Any, bytes], set[int]] = lambda value, payload: set()
    valid_extension: Callable[[bytes], bool] = lambda extra: False


def _partition_list_prefixes(value: rq.DiscoverPartitionsRequest, payload: bytes) -> set[int]:
    list_at = 4 + 1 + len(value.topic.encode("latin-1"))
    return set(range(list_at, len(payload), 2))


def _status_prefixes(value: rs.StatusResponse, payload: bytes) -> set[int]:
    return {len(payload) - 4, len(payload) - 16}  # without the version; without the open partition fields too


def _with(reader):
    return lambda strategy: strategy.map(lambda value: (value, reader))


CODECS = [
    Codec(
        "produce request",
        MsgType.PRODUCE,
        produce_requests().map(lambda r: (r, partial(rq.read_produce_request, with_seqnum=r.with_seqnum))),
        rq.encode_produce_request,
    ),
    Codec(
        "consume request",
        MsgType.CONSUME,
        _with(rq.read_consume_request)(consume_requests()),
        rq.encode_consume_request,
    ),
    Codec(
        "discover partitions request",
        MsgType.DISCOVER_PARTITIONS,
        _with(rq.read_discover_partitions_request)(discover_partitions_requests),
        rq.encode_discover_partitions_request,
        valid_prefixes=_partition_list_prefixes,
        valid_extension=lambda extra: len(extra) % 2 == 0,
    ),
    Codec(
        "create topic request",
        MsgType.CREATE_TOPIC,
        _with(rq.read_create_topic_request)(create_topic_requests),
        rq.encode_create_topic_request,
    ),
    Codec(
        "reload conf request",
        MsgType.RELOAD_CONF,
        _with(rq.read_reload_conf_request)(reload_conf_requests),
        rq.encode_reload_conf_request,
    ),
    Codec("status request", MsgType.STATUS, _with(rq.read_status_request)(status_requests), rq.encode_status_request),
    Codec(
        "discover topics request",
        MsgType.DISCOVER_TOPICS,
        _with(rq.read_discover_topics_request)(discover_topics_requests),
        rq.encode_discover_topics_request,
    ),
    Codec(
        "discover topology request",
        MsgType.DISCOVER_TOPOLOGY,
        _with(rq.read_discover_topology_request)(discover_topology_requests),
        rq.encode_discover_topology_request,
    ),
    Codec(
        "produce response",
        MsgType.PRODUCE,
        produce_responses().map(lambda pair: (pair[0], partial(rs.read_produce_response, request=pair[1]))),
        rs.encode_produce_response,
    ),
    Codec(
        "consume response",
        MsgType.CONSUME,
        _with(rs.read_consume_response)(consume_responses()),
        rs.encode_consume_response,
    ),
    Codec(
        "discover partitions response",
        MsgType.DISCOVER_PARTITIONS,
        _with(rs.read_discover_partitions_response)(discover_partitions_responses),
        rs.encode_discover_partitions_response,
    ),
    Codec(
        "create topic response",
        MsgType.CREATE_TOPIC,
        _with(rs.read_create_topic_response)(create_topic_responses),
        rs.encode_create_topic_response,
    ),
    Codec(
        "reload conf response",
        MsgType.RELOAD_CONF,
        _with(rs.read_reload_conf_response)(reload_conf_responses),
        rs.encode_reload_conf_response,
    ),
    Codec(
        "status response",
        MsgType.STATUS,
        _with(rs.read_status_response)(status_responses()),
        rs.encode_status_response,
        valid_prefixes=_status_prefixes,
    ),
    Codec(
        "discover topics response",
        MsgType.DISCOVER_TOPICS,
        _with(rs.read_discover_topics_response)(discover_topics_responses()),
        rs.encode_discover_topics_response,
    ),
    Codec(
        "discover topology response",
        MsgType.DISCOVER_TOPOLOGY,
        _with(rs.read_discover_topology_response)(discover_topology_responses),
        rs.encode_discover_topology_response,
    ),
]
CODECS_BY_NAME = {c.name: c for c in CODECS}


@st.composite
def framed_cases(draw):
    """(msg_id, payload, reader, value) for any codec."""
    codec = draw(st.sampled_from(CODECS))
    value, reader = draw(codec.cases)
    return codec.msg_id, codec.encode(value), reader, value


# --- bundles --------------------------------------------------------------------------------------------------------

# A few repeated stamps make UseLastSpecifiedTS likely; the extremes check the u64 field.
timestamps = st.one_of(st.sampled_from([0, 1, 1_700_000_000_000, UINT64_MAX]), u64)
keys = st.none() | st.binary(max_size=255)


@st.composite
def message_lists(draw, min_size=1, max_size=40) -> list[Message]:
    count = draw(st.integers(min_size, max_size))
    return [Message(draw(st.binary(max_size=60)), draw(keys), draw(timestamps)) for _ in range(count)]


@st.composite
def sparse_seqs(draw, count: int) -> list[int]:
    """Strictly increasing seqs from 1 up, with gaps of 0 (SeqNumPrevPlusOne) made likely.

    The header holds last - first - 1 as a 32-bit varint, so the whole span stays below 2**32 + 1.
    """
    budget = 2**32 - count  # the sum of the gaps
    seq = draw(st.integers(1, 2**40))
    seqs = [seq]
    for _ in range(count - 1):
        gap = draw(st.one_of(st.just(0), st.integers(0, min(3, budget)), st.integers(0, budget)))
        budget -= gap
        seq += gap + 1
        seqs.append(seq)
    return seqs


@st.composite
def bundles(draw) -> bytes:
    """A valid bundle: plain or sparse, uncompressed or snappy."""
    messages = draw(message_lists(max_size=20))
    codec = draw(st.sampled_from([CODEC_NONE, CODEC_SNAPPY]))
    if draw(st.booleans()):
        seqs = draw(sparse_seqs(len(messages)))
        messages = [Message(m.value, m.key, m.ts_ms, s) for m, s in zip(messages, seqs)]
        return encode_bundle(messages, codec=codec, sparse=True)
    return encode_bundle(messages, codec=codec)


@st.composite
def mutations(draw, payload: bytes) -> bytes:
    """`payload` with a few bytes overwritten, inserted or deleted; overwrites favour 0x00 and 0xff."""
    data = bytearray(payload)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "insert", "delete"]))
        position = draw(st.integers(0, len(data)))
        byte = draw(st.one_of(st.sampled_from([0x00, 0xFF, 0x80, 0x7F]), st.integers(0, 0xFF)))
        if kind == "insert":
            data.insert(position, byte)
        elif position < len(data):
            if kind == "set":
                data[position] = byte
            else:
                del data[position]
    return bytes(data)
