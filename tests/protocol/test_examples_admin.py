"""The docs/protocol.md examples of the small admin messages (§3.6-§3.11), byte for byte, both ways.

Responses marked "(observed on a running TANK broker)" in docs/protocol.md are copied verbatim; requests, and the
responses docs/protocol.md gives only a layout for, are written out field by field from that layout.
"""

import pytest

from tests.protocol.hexbytes import h
from tiered.protocol.codes import CreateTopicStatus, DiscoverReason, Endpoint, NodeFlags, ReloadConfStatus
from tiered.protocol.frame import MsgType
from tiered.protocol.requests import (
    CreateTopicRequest,
    DiscoverPartitionsRequest,
    DiscoverTopicsRequest,
    DiscoverTopologyRequest,
    ReloadConfRequest,
    StatusRequest,
    encode_create_topic_request,
    encode_discover_partitions_request,
    encode_discover_topics_request,
    encode_discover_topology_request,
    encode_reload_conf_request,
    encode_status_request,
    peek_request_id,
    read_create_topic_request,
    read_discover_partitions_request,
    read_discover_topics_request,
    read_discover_topology_request,
    read_reload_conf_request,
    read_status_request,
)
from tiered.protocol.responses import (
    CreateTopicResponse,
    DiscoverPartitionsResponse,
    DiscoverTopicsResponse,
    DiscoverTopologyResponse,
    PartitionRange,
    ReloadConfResponse,
    StatusResponse,
    TopicInfo,
    TopologyNode,
    encode_create_topic_response,
    encode_discover_partitions_response,
    encode_discover_topics_response,
    encode_discover_topology_response,
    encode_reload_conf_response,
    encode_status_response,
    read_create_topic_response,
    read_discover_partitions_response,
    read_discover_topics_response,
    read_discover_topology_response,
    read_reload_conf_response,
    read_status_response,
)

UINT64_MAX = 2**64 - 1

SMALL_CASES = [
    # §3.6 request (layout), all partitions and an explicit list.
    (
        DiscoverPartitionsRequest(0x50, "events"),
        h("50000000 06'events'"),
        encode_discover_partitions_request,
        read_discover_partitions_request,
    ),
    (
        DiscoverPartitionsRequest(0x50, "events", (0, 1)),
        h("50000000 06'events' 0000 0100"),
        encode_discover_partitions_request,
        read_discover_partitions_request,
    ),
    # §3.6 response, observed.
    (
        DiscoverPartitionsResponse(0x50, "events", (PartitionRange(1, 6), PartitionRange(1, 20))),
        h("50000000 06'events' 0200 0100000000000000 0600000000000000 0100000000000000 1400000000000000"),
        encode_discover_partitions_response,
        read_discover_partitions_response,
    ),
    # §3.6 response: unknown topic, then each reason (layout).
    (
        DiscoverPartitionsResponse(0x51, "nosuch", ()),
        h("51000000 06'nosuch' 0000"),
        encode_discover_partitions_response,
        read_discover_partitions_response,
    ),
    (
        DiscoverPartitionsResponse(
            0x52,
            "t",
            (
                PartitionRange(0, 0),
                PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.NO_LEADER),
                PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.OTHER_LEADER, Endpoint("10.1.2.3", 80)),
                PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.SYSTEM),
            ),
        ),
        h(
            "52000000 01't' 0400 0000000000000000 0000000000000000"
            " ffffffffffffffff ffffffffffffffff fd"
            " ffffffffffffffff ffffffffffffffff fc 0a010203 5000"
            " ffffffffffffffff ffffffffffffffff fb"
        ),
        encode_discover_partitions_response,
        read_discover_partitions_response,
    ),
    # §3.7 (layout)
    (
        CreateTopicRequest(9, "logs", 2, b"log.segment.bytes=1\n"),
        h("09000000 04'logs' 0200 14 'log.segment.bytes=1' 0a"),
        encode_create_topic_request,
        read_create_topic_request,
    ),
    (
        CreateTopicResponse(9, "logs", CreateTopicStatus.BAD_CONFIG),
        h("09000000 04'logs' 04"),
        encode_create_topic_response,
        read_create_topic_response,
    ),
    # §3.8 (layout)
    (
        ReloadConfRequest(10, "logs", 5),
        h("0a000000 04'logs' 0500"),
        encode_reload_conf_request,
        read_reload_conf_request,
    ),
    (
        ReloadConfResponse(10, "logs", 5, ReloadConfStatus.UNKNOWN_PARTITION),
        h("0a000000 04'logs' 0500 0a"),
        encode_reload_conf_response,
        read_reload_conf_response,
    ),
    # §3.9 request (layout) and response (observed)
    (StatusRequest(0x4D), h("4d000000"), encode_status_request, read_status_request),
    (
        StatusResponse(0x4D, 2, 3, open_partitions=2, startup_ts=0x6B02E7DB, version=400),
        h("4d000000 00 00 02000000 03000000 02000000 00000000 dbe7026b 90010000"),
        encode_status_response,
        read_status_response,
    ),
    # §3.9 cluster-aware (layout)
    (
        StatusResponse(
            1, 4, 8, 1, 2, 3, 400, cluster_aware=True, cluster_flags=0, cluster_name="prod", available_nodes=3
        ),
        h("01000000 00 01 04000000 08000000 00 04'prod' 03000000 01000000 02000000 03000000 90010000"),
        encode_status_response,
        read_status_response,
    ),
    # §3.10 request (layout) and response (observed)
    (DiscoverTopicsRequest(0x4E), h("4e000000 00"), encode_discover_topics_request, read_discover_topics_request),
    (
        DiscoverTopicsResponse(0x4E, (TopicInfo("events", True, 2), TopicInfo("logs", True, 1))),
        h("4e000000 02000000 00 06'events' 01 0200 04'logs' 01 0100"),
        encode_discover_topics_response,
        read_discover_topics_response,
    ),
    (
        DiscoverTopicsResponse(0x4E, (TopicInfo("events", False, 2, 3),), cluster_aware=True),
        h("4e000000 01000000 01 06'events' 00 0200 03"),
        encode_discover_topics_response,
        read_discover_topics_response,
    ),
    # §3.11 request (layout), standalone response (observed) and a cluster one (layout)
    (
        DiscoverTopologyRequest(0x4F),
        h("4f000000 00"),
        encode_discover_topology_request,
        read_discover_topology_request,
    ),
    (
        DiscoverTopologyResponse(0x4F),
        h("4f000000 ffff"),
        encode_discover_topology_response,
        read_discover_topology_response,
    ),
    (
        DiscoverTopologyResponse(
            0x4F,
            "prod",
            (
                TopologyNode(1, NodeFlags.HAS_ENDPOINT | NodeFlags.AVAILABLE, Endpoint("10.0.0.1", 11011), 12),
                TopologyNode(2, NodeFlags.BLOCKED, None, 0),
            ),
        ),
        h("4f000000 0200 04'prod' 0100 03 0a000001 032b 0c00 0200 04 0000"),
        encode_discover_topology_response,
        read_discover_topology_response,
    ),
]


@pytest.mark.parametrize("value, payload, encode, read", SMALL_CASES, ids=lambda v: getattr(v, "__name__", None))
def test_small_messages(value, payload, encode, read):
    assert encode(value) == payload
    assert read(payload) == value


def test_status_response_from_older_brokers():
    # TANK's client reads the open-partition fields and the version as optional; absent means 0.
    full = h("4d000000 00 00 02000000 03000000 02000000 00000000 dbe7026b 90010000")
    assert read_status_response(full[:-4]) == StatusResponse(0x4D, 2, 3, 2, 0, 0x6B02E7DB, version=0)
    assert read_status_response(full[:-16]) == StatusResponse(0x4D, 2, 3, 0, 0, 0, version=0)


def test_peek_request_id():
    assert peek_request_id(MsgType.STATUS, h("4d000000")) == 0x4D
    assert peek_request_id(MsgType.CREATE_TOPIC, h("09000000 ff")) == 9
    assert peek_request_id(MsgType.CONSUME, h("0200 c800")) is None  # too short
    assert peek_request_id(MsgType.PING, b"") is None
    assert peek_request_id(0x77, h("01000000")) is None
