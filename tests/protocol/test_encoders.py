"""Encoders refuse values that cannot go on the wire, with a ValueError, instead of writing bytes TANK would misread."""

import pytest
from hypothesis import assume, given

from tests.protocol.strategies import budget, produce_responses

from tiered.protocol.codes import (
    UINT64_MAX,
    ConsumeStatus,
    DiscoverReason,
    Endpoint,
    NodeFlags,
    ProduceStatus,
    encode_endpoint,
)
from tiered.protocol.requests import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    CreateTopicRequest,
    DiscoverPartitionsRequest,
    DiscoverTopicsRequest,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    ReloadConfRequest,
    encode_consume_request,
    encode_create_topic_request,
    encode_discover_partitions_request,
    encode_discover_topics_request,
    encode_produce_request,
    encode_reload_conf_request,
)
from tiered.protocol.responses import (
    ConsumePartitionResult,
    ConsumeResponse,
    ConsumeTopicResult,
    CreateTopicResponse,
    DiscoverPartitionsResponse,
    DiscoverTopicsResponse,
    DiscoverTopologyResponse,
    PartitionRange,
    PartitionStatus,
    ProduceResponse,
    ProduceTopicResult,
    ReloadConfResponse,
    StatusResponse,
    TopicInfo,
    TopologyNode,
    encode_consume_head,
    encode_consume_response,
    encode_create_topic_response,
    encode_discover_partitions_response,
    encode_discover_topics_response,
    encode_discover_topology_response,
    encode_produce_codes,
    encode_produce_response,
    encode_reload_conf_response,
    encode_status_response,
    read_consume_response,
)

LEADER = Endpoint("10.0.0.1", 11011)


def produce(topics, **kw):
    return ProduceRequest(1, tuple(topics), **kw)


def ptopic(name="t", n=1, base_seq=None):
    return ProduceTopic(name, tuple(ProducePartition(i, b"x", base_seq) for i in range(n)))


def ctopic(name="t", n=1):
    return ConsumeTopic(name, tuple(ConsumePartition(i, 0, 100) for i in range(n)))


def test_u8_counts_hold_255():
    encode_produce_request(produce([ptopic()] * 255))
    encode_produce_request(produce([ptopic(n=255)]))
    encode_consume_request(ConsumeRequest(1, 0, 0, (ctopic(),) * 255))
    encode_consume_request(ConsumeRequest(1, 0, 0, (ctopic(n=255),)))


@pytest.mark.parametrize(
    "encode",
    [
        lambda: encode_produce_request(produce([ptopic()] * 256)),
        lambda: encode_produce_request(produce([ptopic(n=256)])),
        lambda: encode_consume_request(ConsumeRequest(1, 0, 0, (ctopic(),) * 256)),
        lambda: encode_consume_request(ConsumeRequest(1, 0, 0, (ctopic(n=256),))),
        lambda: encode_consume_head(1, (ConsumeTopicResult("t", None, 1),) * 256),
    ],
    ids=["produce topics", "produce partitions", "consume topics", "consume partitions", "consume response topics"],
)
def test_u8_counts_refuse_256(encode):
    with pytest.raises(ValueError, match="at most 255"):
        encode()


@pytest.mark.parametrize(
    "name, error",
    [("x" * 256, "at most 255"), ("naïve", None), ("\u20ac", "latin-1")],
)
def test_names_are_latin1_str8(name, error):
    request = ReloadConfRequest(1, name, 0)
    if error is None:
        assert encode_reload_conf_request(request)[4:] == b"\x05na\xefve\x00\x00"
    else:
        with pytest.raises(ValueError, match=error):
            encode_reload_conf_request(request)


@pytest.mark.parametrize(
    "request_",
    [
        produce([ptopic()], with_seqnum=True),  # no base_seq
        produce([ptopic(base_seq=5)]),  # base_seq on a plain produce
        produce([ProduceTopic("t", (ProducePartition(0x10000, b"x"),))]),
        produce([ptopic()], client_id="\u0100"),
        produce([ptopic()], required_acks=256),
        ProduceRequest(2**32, ()),
    ],
)
def test_produce_request_refusals(request_):
    with pytest.raises(ValueError):
        encode_produce_request(request_)


@pytest.mark.parametrize(
    "encode",
    [
        lambda: encode_consume_request(ConsumeRequest(1, 2**64, 0, ())),
        lambda: encode_consume_request(ConsumeRequest(1, 0, 0, (ConsumeTopic("t", (ConsumePartition(0, -1, 0),)),))),
        lambda: encode_consume_request(ConsumeRequest(1, 0, 0, (), op_flags=256)),
        lambda: encode_discover_partitions_request(DiscoverPartitionsRequest(1, "t", ())),
        lambda: encode_discover_partitions_request(DiscoverPartitionsRequest(1, "t", (70000,))),
        lambda: encode_create_topic_request(CreateTopicRequest(1, "t", 0x10000, b"")),
        lambda: encode_discover_topics_request(DiscoverTopicsRequest(1, 256)),
    ],
)
def test_other_request_refusals(encode):
    with pytest.raises(ValueError):
        encode()


def test_consume_version_3_without_flags_still_carries_the_byte():
    payload = encode_consume_request(ConsumeRequest(1, 0, 0, (), client_version=3))
    assert payload == bytes.fromhex("0300 01000000 00 0000000000000000 00000000 00 00")


@pytest.mark.parametrize(
    "endpoint",
    [Endpoint("10.0.0", 1), Endpoint("10.0.0.256", 1), Endpoint("::1", 1), Endpoint("10.0.0.1", 65536)],
)
def test_bad_endpoints(endpoint):
    with pytest.raises(ValueError):
        encode_endpoint(endpoint)


PRODUCE_RESPONSE_REFUSALS = [
    ProduceTopicResult("t", ProduceStatus.OK, ()),  # not a topic-level status
    ProduceTopicResult("t", ProduceStatus.UNKNOWN_TOPIC, (PartitionStatus(0),)),
    ProduceTopicResult("t", None, (PartitionStatus(ProduceStatus.UNKNOWN_TOPIC),)),  # topic-level code per partition
    ProduceTopicResult("t", None, (PartitionStatus(0x05),)),
    ProduceTopicResult("t", None, (PartitionStatus(ProduceStatus.OTHER_LEADER),)),  # no leader given
    ProduceTopicResult("t", None, (PartitionStatus(ProduceStatus.OK, LEADER),)),
]


@pytest.mark.parametrize("topic", PRODUCE_RESPONSE_REFUSALS)
def test_produce_response_refusals(topic):
    with pytest.raises(ValueError):
        encode_produce_response(ProduceResponse(1, (topic,)))


UNKNOWN_T = ProduceTopicResult("t", ProduceStatus.UNKNOWN_TOPIC, ())


@pytest.mark.parametrize(
    "run",
    [
        (UNKNOWN_T, ProduceTopicResult("t", None, (PartitionStatus(0),))),
        (UNKNOWN_T, ProduceTopicResult("t", ProduceStatus.READ_ONLY, ())),
    ],
)
def test_produce_response_run_with_mixed_statuses(run):
    # Consecutive results with one name are one run on the wire: it is all topic-level (one status) or all partitions.
    with pytest.raises(ValueError, match="one topic-level"):
        encode_produce_response(ProduceResponse(1, run))


def as_codes(topics) -> list:
    """encode_produce_codes' form of ProduceTopicResults (None for an OTHER_LEADER, which it does not take)."""
    out = []
    for t in topics:
        if any(p.leader is not None or p.code == ProduceStatus.OTHER_LEADER for p in t.partitions):
            return None
        out.append((t.name, t.status, bytearray(p.code for p in t.partitions) if t.status is None else None))
    return out


@budget(300)
@given(produce_responses())
def test_produce_codes_encode_as_the_response_encoder(case):
    resp, _ = case
    codes = as_codes(resp.topics)
    assume(codes is not None)
    assert encode_produce_codes(resp.request_id, codes) == encode_produce_response(resp)


@pytest.mark.parametrize("topics", [[t] for t in PRODUCE_RESPONSE_REFUSALS if as_codes([t]) is not None]
                         + [list(run) for run in [(UNKNOWN_T, ProduceTopicResult("t", None, (PartitionStatus(0),))),
                                                  (UNKNOWN_T, ProduceTopicResult("t", ProduceStatus.READ_ONLY, ()))]])
def test_produce_codes_refuse_what_the_response_encoder_refuses(topics):
    with pytest.raises(ValueError):
        encode_produce_response(ProduceResponse(1, tuple(topics)))
    with pytest.raises(ValueError):
        encode_produce_codes(1, [(t.name, t.status, bytearray(p.code for p in t.partitions)) for t in topics])


CONSUME_REFUSALS = [
    ConsumeTopicResult("t", (ConsumePartitionResult(0, ConsumeStatus.OK),), 2),
    ConsumeTopicResult("t", (ConsumePartitionResult(0xFFFF, ConsumeStatus.OK),), 1),
    ConsumeTopicResult("t", (ConsumePartitionResult(0, 0x02),), 1),  # TANK's client aborts on 0x02..0xfa
    ConsumeTopicResult("t", (ConsumePartitionResult(0, ConsumeStatus.SPARSE, base_seq=5),), 1),
    ConsumeTopicResult("t", (ConsumePartitionResult(0, ConsumeStatus.BOUNDARY, chunk_len=5),), 1),
    ConsumeTopicResult("t", (ConsumePartitionResult(0, ConsumeStatus.OTHER_LEADER),), 1),
    ConsumeTopicResult("t", (ConsumePartitionResult(0, ConsumeStatus.NO_LEADER, hwmark=3),), 1),
    ConsumeTopicResult("t", (ConsumePartitionResult(0, ConsumeStatus.OK, leader=LEADER),), 1),
    ConsumeTopicResult("t", None, 256),
]


@pytest.mark.parametrize("topic", CONSUME_REFUSALS)
def test_consume_response_refusals(topic):
    with pytest.raises(ValueError):
        encode_consume_head(1, (topic,))


def test_consume_response_empty_known_topic():
    # A request topic with no partitions gets a count of 0 and nothing else, as from TANK's broker...
    empty = ConsumeTopicResult("e", (), 0)
    after = ConsumeTopicResult("t", None, 1)
    payload = encode_consume_response(ConsumeResponse(1, (empty, after), ()))
    assert payload == bytes.fromhex("0d000000 01000000 02 0165 00 0174 01 ffff")
    assert read_consume_response(payload) == ConsumeResponse(1, (empty, after), ())
    # ... unless the next topic's name would read as the unknown-topic marker that readers look for after any count.
    with pytest.raises(ValueError, match="unknown-topic marker"):
        encode_consume_head(1, (empty, ConsumeTopicResult("\xff" * 255, None, 1)))
    encode_consume_head(1, (empty, ConsumeTopicResult("\xff" * 254, None, 1)))


def test_consume_head_refuses_a_frame_past_256_mib():
    big = ConsumePartitionResult(0, ConsumeStatus.OK, 1, 1, chunk_len=200 * 1024 * 1024)
    with pytest.raises(ValueError, match="frame limit"):
        encode_consume_head(1, (ConsumeTopicResult("t", (big, big), 2),))


def test_consume_response_chunks_must_match_the_header():
    topic = ConsumeTopicResult("t", (ConsumePartitionResult(0, ConsumeStatus.OK, 1, 1, chunk_len=3),), 1)
    assert encode_consume_response(ConsumeResponse(1, (topic,), (b"abc",))).endswith(b"abc")
    for chunks in [(), (b"ab",), (b"abc", b"")]:
        with pytest.raises(ValueError, match="chunk sizes"):
            encode_consume_response(ConsumeResponse(1, (topic,), chunks))


@pytest.mark.parametrize(
    "partition",
    [
        PartitionRange(UINT64_MAX, UINT64_MAX),  # needs a reason
        PartitionRange(UINT64_MAX, UINT64_MAX, 0x01),
        PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.OTHER_LEADER),  # needs a leader
        PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.NO_LEADER, LEADER),
        PartitionRange(1, 5, DiscoverReason.NO_LEADER),
        PartitionRange(1, 5, None, LEADER),
    ],
)
def test_discover_partitions_response_refusals(partition):
    with pytest.raises(ValueError):
        encode_discover_partitions_response(DiscoverPartitionsResponse(1, "t", (partition,)))


@pytest.mark.parametrize(
    "encode",
    [
        lambda: encode_create_topic_response(CreateTopicResponse(1, "t", 3)),
        lambda: encode_reload_conf_response(ReloadConfResponse(1, "t", 0, 1)),
        lambda: encode_status_response(StatusResponse(1, 0, 0, cluster_name="c")),
        lambda: encode_status_response(StatusResponse(1, 2**32, 0)),
        lambda: encode_discover_topics_response(DiscoverTopicsResponse(1, (TopicInfo("t", True, 1, 3),))),
        lambda: encode_discover_topics_response(DiscoverTopicsResponse(1, (TopicInfo("t", True, 1),), True)),
        lambda: encode_discover_topology_response(DiscoverTopologyResponse(1, None, (TopologyNode(1, 0, None, 0),))),
        lambda: encode_discover_topology_response(DiscoverTopologyResponse(1, "c", (TopologyNode(1, 0, LEADER, 0),))),
        lambda: encode_discover_topology_response(
            DiscoverTopologyResponse(1, "c", (TopologyNode(1, NodeFlags.HAS_ENDPOINT, None, 0),))
        ),
        lambda: encode_discover_topology_response(
            DiscoverTopologyResponse(1, "c", (TopologyNode(1, 0, None, 0),) * 0xFFFF)
        ),
    ],
)
def test_small_response_refusals(encode):
    with pytest.raises(ValueError):
        encode()


# -- produce_codes_frame: the commonest answer's whole frame, natively (_bundlescan) against its reference ----------

from tiered.protocol import responses as responses_module  # noqa: E402
from tiered.protocol.frame import MsgType, encode_frame  # noqa: E402

CODES_FRAME = [responses_module._produce_codes_frame_py,
               *([responses_module._produce_codes_frame_native] if responses_module._produce_codes_frame_native
                 else [])]


@budget(300)
@given(produce_responses())
def test_produce_codes_frame_is_the_framed_answer_or_none(case):
    """A one-topic answer per partition with plain codes: exactly encode_frame(PRODUCE, encode_produce_codes(...));
    anything else: None, for the reference encoder to encode or refuse."""
    resp, _ = case
    codes = as_codes(resp.topics)
    simple = codes is not None and len(codes) == 1 and codes[0][1] is None
    for frame_of in CODES_FRAME:
        given_codes = codes[0][2] if simple else bytes(p.code for t in resp.topics for p in t.partitions or ())
        got = frame_of(resp.request_id, given_codes)
        if simple and len(given_codes) <= 255:
            assert got == encode_frame(MsgType.PRODUCE, encode_produce_codes(resp.request_id, codes))
        elif got is not None:  # several topics' codes read as one: still the frame of those codes as one topic
            assert got == encode_frame(MsgType.PRODUCE, encode_produce_codes(resp.request_id,
                                                                             [("t", None, given_codes)]))


@pytest.mark.parametrize("frame_of", CODES_FRAME)
def test_produce_codes_frame_takes_only_plain_codes_and_a_u32_id(frame_of):
    plain = set(responses_module._PLAIN_PARTITION_STATUSES)
    for code in range(256):  # every byte: the native list of plain codes is the reference's
        got = frame_of(7, bytes([0, code]))
        assert (got is not None) == (code in plain)
    for request_id in (-1, 2**32, 2**64):
        assert frame_of(request_id, b"\x00") is None
    assert frame_of(2**32 - 1, bytearray(b"\x00" * 255)) is not None and frame_of(1, b"\x00" * 256) is None
    assert frame_of(1, memoryview(b"\x00\xfd")) == encode_frame(MsgType.PRODUCE, b"\x01\x00\x00\x00\x00\xfd")


@pytest.mark.skipif(responses_module._produce_codes_frame_native is None, reason="the native module is not built")
def test_native_produce_codes_frame_refuses_bad_arguments():
    native = responses_module._produce_codes_frame_native
    with pytest.raises(TypeError):
        native(1)
    with pytest.raises(TypeError):
        native("1", b"")
    with pytest.raises(TypeError):
        native(1, "codes")
