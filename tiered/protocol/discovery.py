"""Discovery responses: which partitions, topics and brokers exist (docs/protocol.md §3.6, §3.10, §3.11).

DiscoverPartitions (0x06):

    request_id u32, topic str8, count u16 (0: unknown topic)
    count × { first_available u64, hwmark u64                                       PARTITION_RANGE
              [reason u8 (DiscoverReason) iff both are UINT64_MAX; OTHER_LEADER: + endpoint] }

DiscoverTopics (0x0b):

    request_id u32, count u32, cluster_aware u8                                       TOPICS_HEAD
    count × { name str8, enabled u8, partitions u16, [replication_factor u8 iff cluster_aware] }   TOPIC_INFO

DiscoverTopology (0x0c):

    request_id u32, nodes u16 (0xFFFF: standalone broker, nothing follows)
    [cluster_name str8, nodes × { node_id u16, flags u8 (NodeFlags), [endpoint iff HAS_ENDPOINT], replica_for u16 }]
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tiered.protocol.buffers import BytesLike
from tiered.protocol.codes import UINT64_MAX, DiscoverReason, Endpoint, NodeFlags
from tiered.protocol.wire import U8, U16, Reader, pack, pack_endpoint, pack_str8

REQUEST_ID = struct.Struct("<I")
PARTITION_RANGE = struct.Struct("<QQ")  # first_available, hwmark
TOPICS_HEAD = struct.Struct("<IIB")  # request_id, count, cluster_aware
TOPIC_INFO = struct.Struct("<BH")  # enabled, partitions (after the name)
TOPOLOGY_NODE = struct.Struct("<HB")  # node_id, flags (then [endpoint], replica_for u16)
STANDALONE = 0xFFFF  # DiscoverTopology node count of a broker that is not in a cluster

_REASONS = frozenset(DiscoverReason)

# --- discover partitions --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionRange:
    first_available: int  # 0 with hwmark 0: an empty partition
    hwmark: int
    reason: int | None = None  # DiscoverReason, iff first_available == hwmark == UINT64_MAX
    leader: Endpoint | None = None  # iff reason is OTHER_LEADER


@dataclass(frozen=True, slots=True)
class DiscoverPartitionsResponse:
    request_id: int
    topic: str
    partitions: tuple[PartitionRange, ...]  # empty: unknown topic


def encode_discover_partitions_response(resp: DiscoverPartitionsResponse) -> bytes:
    out = [
        pack(REQUEST_ID, "request id", resp.request_id),
        pack_str8(resp.topic, "topic name"),
        pack(U16, "partition count", len(resp.partitions)),
    ]
    for i, p in enumerate(resp.partitions):
        where = f"partition {i}"
        out.append(pack(PARTITION_RANGE, where, p.first_available, p.hwmark))
        if p.first_available == p.hwmark == UINT64_MAX:
            if p.reason not in _REASONS:
                raise ValueError(f"{where}: (UINT64_MAX, UINT64_MAX) needs a DiscoverReason, not {p.reason}")
            out.append(bytes((p.reason,)))
            if p.reason == DiscoverReason.OTHER_LEADER:
                out.append(pack_endpoint(p.leader, f"{where} other leader"))
            elif p.leader is not None:
                raise ValueError(f"{where}: a leader is only sent with OTHER_LEADER")
        elif p.reason is not None or p.leader is not None:
            raise ValueError(f"{where}: a reason is only sent when first_available and hwmark are UINT64_MAX")
    return b"".join(out)


def read_discover_partitions_response(payload: BytesLike) -> DiscoverPartitionsResponse:
    r = Reader(payload, "discover partitions response")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    topic = r.str8("topic name")
    partitions = []
    for i in range(r.u16("partition count")):
        first, hwmark = r.unpack(PARTITION_RANGE, f"partition {i}")
        reason = leader = None
        if first == hwmark == UINT64_MAX:
            reason = r.u8(f"reason of partition {i}")
            if reason not in _REASONS:
                r.fail(f"unknown reason 0x{reason:02x} for partition {i}", r.position - 1)
            reason = DiscoverReason(reason)
            if reason == DiscoverReason.OTHER_LEADER:
                leader = r.endpoint(f"other leader of partition {i}")
        partitions.append(PartitionRange(first, hwmark, reason, leader))
    r.finish()
    return DiscoverPartitionsResponse(request_id, topic, tuple(partitions))


# --- discover topics ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    enabled: bool
    partitions: int
    replication_factor: int | None = None  # iff the response is cluster_aware


@dataclass(frozen=True, slots=True)
class DiscoverTopicsResponse:
    request_id: int
    topics: tuple[TopicInfo, ...]
    cluster_aware: bool = False


def encode_discover_topics_response(resp: DiscoverTopicsResponse) -> bytes:
    out = [pack(TOPICS_HEAD, "discover topics header", resp.request_id, len(resp.topics), int(resp.cluster_aware))]
    for t in resp.topics:
        out.append(pack_str8(t.name, "topic name"))
        out.append(pack(TOPIC_INFO, f"topic {t.name!r}", int(t.enabled), t.partitions))
        if resp.cluster_aware:
            if t.replication_factor is None:
                raise ValueError(f"topic {t.name!r}: a cluster-aware response needs a replication factor")
            out.append(pack(U8, f"replication factor of {t.name!r}", t.replication_factor))
        elif t.replication_factor is not None:
            raise ValueError(f"topic {t.name!r}: a replication factor is only sent when cluster_aware")
    return b"".join(out)


def read_discover_topics_response(payload: BytesLike) -> DiscoverTopicsResponse:
    r = Reader(payload, "discover topics response")
    request_id, count, cluster_aware = r.unpack(TOPICS_HEAD, "header")
    if cluster_aware > 1:
        r.fail(f"cluster_aware is {cluster_aware}, not a bool", r.position - 1)
    topics = []
    for _ in range(count):  # each topic takes at least 4 bytes, so a bogus count fails on truncation, quickly
        name = r.str8("topic name")
        enabled = r.bool8(f"enabled flag of {name!r}")
        partitions = r.u16(f"partition count of {name!r}")
        rf = r.u8(f"replication factor of {name!r}") if cluster_aware else None
        topics.append(TopicInfo(name, enabled, partitions, rf))
    r.finish()
    return DiscoverTopicsResponse(request_id, tuple(topics), bool(cluster_aware))


# --- discover topology ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopologyNode:
    node_id: int
    flags: int  # NodeFlags; HAS_ENDPOINT iff endpoint is not None
    endpoint: Endpoint | None
    replica_for: int  # partitions this node replicates


@dataclass(frozen=True, slots=True)
class DiscoverTopologyResponse:
    request_id: int
    cluster_name: str | None = None  # None: a standalone broker
    nodes: tuple[TopologyNode, ...] = ()


def encode_discover_topology_response(resp: DiscoverTopologyResponse) -> bytes:
    head = pack(REQUEST_ID, "request id", resp.request_id)
    if resp.cluster_name is None:
        if resp.nodes:
            raise ValueError("a standalone broker (cluster_name None) lists no nodes")
        return head + U16.pack(STANDALONE)
    if len(resp.nodes) >= STANDALONE:
        raise ValueError(f"{len(resp.nodes)} nodes; at most {STANDALONE - 1} fit before the standalone marker")
    out = [head, U16.pack(len(resp.nodes)), pack_str8(resp.cluster_name, "cluster name")]
    for n in resp.nodes:
        where = f"node {n.node_id}"
        out.append(pack(TOPOLOGY_NODE, where, n.node_id, n.flags))
        if bool(n.flags & NodeFlags.HAS_ENDPOINT) != (n.endpoint is not None):
            raise ValueError(f"{where}: flag HAS_ENDPOINT must be set iff an endpoint is given")
        if n.endpoint is not None:
            out.append(pack_endpoint(n.endpoint, f"{where} endpoint"))
        out.append(pack(U16, f"{where} replica_for", n.replica_for))
    return b"".join(out)


def read_discover_topology_response(payload: BytesLike) -> DiscoverTopologyResponse:
    r = Reader(payload, "discover topology response")
    (request_id,) = r.unpack(REQUEST_ID, "request id")
    count = r.u16("node count")
    if count == STANDALONE:
        r.finish()
        return DiscoverTopologyResponse(request_id)
    cluster_name = r.str8("cluster name")
    nodes = []
    for i in range(count):
        node_id, flags = r.unpack(TOPOLOGY_NODE, f"node #{i}")
        endpoint = r.endpoint(f"endpoint of node {node_id}") if flags & NodeFlags.HAS_ENDPOINT else None
        nodes.append(TopologyNode(node_id, flags, endpoint, r.u16(f"replica_for of node {node_id}")))
    r.finish()
    return DiscoverTopologyResponse(request_id, cluster_name, tuple(nodes))
