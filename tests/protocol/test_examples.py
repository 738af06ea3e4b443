"""The hex examples of docs/protocol.md for frames, varints, bundles, produce and consume, byte for byte, both ways.

The small admin messages are in test_examples_admin.py.

Examples marked "(observed on a running TANK broker)" in docs/protocol.md are copied verbatim. Requests for which
docs/protocol.md gives a layout but no capture are written out field by field from that layout.
"""

import pytest

from tests.protocol.hexbytes import h
from tiered.protocol.bundle import Message, decode_bundle, encode_bundle, encode_record, maybe_record
from tiered.protocol.codes import ConsumeFlags, ConsumeStatus, Endpoint, ProduceStatus
from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import MsgType, encode_frame, maybe_frame
from tiered.protocol.requests import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    encode_consume_request,
    encode_produce_request,
    peek_request_id,
    read_consume_request,
    read_produce_request,
)
from tiered.protocol.responses import (
    ConsumePartitionResult,
    ConsumeResponse,
    ConsumeTopicResult,
    PartitionStatus,
    ProduceResponse,
    ProduceTopicResult,
    encode_consume_head,
    encode_consume_response,
    encode_produce_response,
    read_consume_response,
    read_produce_response,
)
from tiered.protocol.varint import encode_varint, read_varint

UINT64_MAX = 2**64 - 1

# §4.2, observed: the first two records of events/0/1_1795352546.log.
HELLO_RECORD = h('16 04 00 fbcd5903a2010000 0b "hello world"')
KEYED_RECORD = h("1e 0c 01 06ce5903a2010000 02'k1' 02'v1' 03 02'k2' 02'v2' 03 02'k1' 02'v3'")
HELLO_TS = 0x01A20359CDFB
KEYED_TS = 0x01A20359CE06

# §4.2: a sparse bundle from a 0x05 produce, seqs 1000, 1001, 1005, 1006. docs/protocol.md leaves the stamp as <ts>.
SPARSE_TS = 0x01A2035A9874
SPARSE_BUNDLE = h(
    "50 e803000000000000 05 | 00 74985a03a2010000 05'm1000' | 06 05'm1001' | 02 03 05'm1005' | 02 05'm1006'"
)


def test_ping_frame():
    assert encode_frame(MsgType.PING, b"") == h("03 00000000")
    msg_id, payload, end = maybe_frame(h("03 00000000"))
    assert (msg_id, bytes(payload), end) == (MsgType.PING, b"", 5)


def test_varint_examples():
    assert encode_varint(188) == h("bc01")
    assert encode_varint(1868) == h("cc0e")
    assert read_varint(h("bc01")) == (188, 2)
    assert read_varint(h("cc0e")) == (1868, 2)


# --- §4.2 bundles ---------------------------------------------------------------------------------------------------


def test_disk_bundles():
    log = HELLO_RECORD + KEYED_RECORD
    start, end = maybe_record(log, 0)
    assert (start, end) == (1, 23)
    assert decode_bundle(log[start:end], base_seq=1) == [Message(b"hello world", None, HELLO_TS, 1)]
    start, end = maybe_record(log, end)
    assert end == len(log)
    keyed = [
        Message(b"v1", b"k1", KEYED_TS, 2),
        Message(b"v2", b"k2", KEYED_TS, 3),
        Message(b"v3", b"k1", KEYED_TS, 4),
    ]
    assert decode_bundle(log[start:end], base_seq=2) == keyed
    assert encode_record(encode_bundle([Message(b"hello world", None, HELLO_TS)])) == HELLO_RECORD
    assert encode_record(encode_bundle(keyed)) == KEYED_RECORD


def test_sparse_bundle():
    messages = [Message(b"m%d" % seq, None, SPARSE_TS, seq) for seq in (1000, 1001, 1005, 1006)]
    assert decode_bundle(SPARSE_BUNDLE) == messages
    assert encode_bundle(messages, sparse=True) == SPARSE_BUNDLE


# --- §3.1, §3.2 produce ---------------------------------------------------------------------------------------------

PRODUCE = ProduceRequest(
    0x64, (ProduceTopic("events", (ProducePartition(0, HELLO_RECORD[1:]),)),), required_acks=0, ack_timeout_ms=0
)
PRODUCE_BYTES = h("0200 64000000 03'c++' 00 00000000 01 06'events' 01 0000 16") + HELLO_RECORD[1:]

PRODUCE_WITH_SEQNUM = ProduceRequest(
    0x65, (ProduceTopic("events", (ProducePartition(3, SPARSE_BUNDLE, 1000),)),), with_seqnum=True
)
PRODUCE_WITH_SEQNUM_BYTES = (
    h("0200 65000000 03'c++' 00 00000000 01 06'events' 01 0300")
    + encode_varint(len(SPARSE_BUNDLE))
    + h("e803000000000000")
    + SPARSE_BUNDLE
)


@pytest.mark.parametrize(
    "request_, payload",
    [(PRODUCE, PRODUCE_BYTES), (PRODUCE_WITH_SEQNUM, PRODUCE_WITH_SEQNUM_BYTES)],
    ids=["produce", "produce_with_seqnum"],
)
def test_produce_request(request_, payload):
    assert encode_produce_request(request_) == payload
    assert read_produce_request(payload, with_seqnum=request_.with_seqnum) == request_
    assert peek_request_id(MsgType.PRODUCE_WITH_SEQNUM if request_.with_seqnum else MsgType.PRODUCE, payload) == (
        request_.request_id
    )


def test_produce_response_groups_runs_of_one_topic():
    # §3.2, observed: request pyt:[0,1,9], nosuch:[0,1], pyt:[2]; partition 9 does not exist.
    def topic(name, partitions):
        return ProduceTopic(name, tuple(ProducePartition(p, HELLO_RECORD[1:]) for p in partitions))

    request = ProduceRequest(
        0x64, (topic("pyt", [0, 1]), topic("pyt", [9]), topic("nosuch", [0, 1]), topic("pyt", [2]))
    )
    response = ProduceResponse(
        0x64,
        (
            ProduceTopicResult("pyt", None, (PartitionStatus(0), PartitionStatus(0), PartitionStatus(1))),
            ProduceTopicResult("nosuch", ProduceStatus.UNKNOWN_TOPIC, ()),
            ProduceTopicResult("pyt", None, (PartitionStatus(0),)),
        ),
    )
    payload = h("64000000 00 00 01 ff 00")
    assert encode_produce_response(response) == payload
    assert read_produce_response(payload, request) == response


def test_produce_response_from_one_result_per_request_topic():
    # A broker may answer each request topic on its own: consecutive results for one name still make one run.
    def topic(name, partitions):
        return ProduceTopic(name, tuple(ProducePartition(p, b"x") for p in partitions))

    request = ProduceRequest(
        0x64, (topic("pyt", [0, 1]), topic("pyt", [9]), topic("nosuch", [0]), topic("nosuch", [1]), topic("pyt", [2]))
    )
    per_topic = ProduceResponse(
        0x64,
        (
            ProduceTopicResult("pyt", None, (PartitionStatus(0), PartitionStatus(0))),
            ProduceTopicResult("pyt", None, (PartitionStatus(1),)),
            ProduceTopicResult("nosuch", ProduceStatus.UNKNOWN_TOPIC, ()),
            ProduceTopicResult("nosuch", ProduceStatus.UNKNOWN_TOPIC, ()),
            ProduceTopicResult("pyt", None, (PartitionStatus(0),)),
        ),
    )
    payload = h("64000000 00 00 01 ff 00")
    assert encode_produce_response(per_topic) == payload
    assert read_produce_response(payload, request) == ProduceResponse(
        0x64,
        (
            ProduceTopicResult("pyt", None, (PartitionStatus(0), PartitionStatus(0), PartitionStatus(1))),
            ProduceTopicResult("nosuch", ProduceStatus.UNKNOWN_TOPIC, ()),
            ProduceTopicResult("pyt", None, (PartitionStatus(0),)),
        ),
    )


def test_produce_response_other_leader_and_read_only():
    request = ProduceRequest(
        7,
        (
            ProduceTopic("a", (ProducePartition(0, b"x"), ProducePartition(1, b"x"))),
            ProduceTopic("ro", (ProducePartition(0, b"x"),)),
        ),
    )
    response = ProduceResponse(
        7,
        (
            ProduceTopicResult(
                "a",
                None,
                (PartitionStatus(ProduceStatus.OTHER_LEADER, Endpoint("10.0.0.2", 11011)), PartitionStatus(0x0A)),
            ),
            ProduceTopicResult("ro", ProduceStatus.READ_ONLY, ()),
        ),
    )
    payload = h("07000000 fc 0a000002 032b 0a fe")
    assert encode_produce_response(response) == payload
    assert read_produce_response(payload, request) == response


# --- §3.3, §3.4 consume ---------------------------------------------------------------------------------------------

CONSUME = ConsumeRequest(
    0xC8,
    0,
    0,
    (ConsumeTopic("pyt", (ConsumePartition(0, 0, 1000), ConsumePartition(1, 1, 1000), ConsumePartition(2, 2, 1000))),),
)
CONSUME_BYTES = h(
    "0200 c8000000 00 0000000000000000 00000000 01 03'pyt' 03"
    "  0000 0000000000000000 e8030000  0100 0100000000000000 e8030000  0200 0200000000000000 e8030000"
)
CONSUME_V3 = ConsumeRequest(
    0xC9, 1000, 60, (ConsumeTopic("pyt", (ConsumePartition(0, UINT64_MAX, 4096),)),), op_flags=ConsumeFlags.PREFER_LOCAL
)
CONSUME_V3_BYTES = h("0300 c9000000 00 e803000000000000 3c000000 01 01 03'pyt' 01 0000 ffffffffffffffff 00100000")


@pytest.mark.parametrize(
    "request_, payload", [(CONSUME, CONSUME_BYTES), (CONSUME_V3, CONSUME_V3_BYTES)], ids=["v2", "v3_prefer_local"]
)
def test_consume_request(request_, payload):
    assert encode_consume_request(request_) == payload
    decoded = read_consume_request(payload)
    assert decoded == ConsumeRequest(
        request_.request_id,
        request_.max_wait_ms,
        request_.min_bytes,
        request_.topics,
        3 if request_.op_flags else 2,
        "",
        request_.op_flags,
    )
    assert peek_request_id(MsgType.CONSUME, payload) == request_.request_id



def test_a_consume_request_for_partition_0xffff_is_refused_with_the_reason():
    # In a consume response 0xffff after a partition count means "unknown topic": an answer could not be read back.
    payload = h("0200 01000000 00 e803000000000000 3c000000 01 03'pyt' 01 ffff 0000000000000000 00100000")
    with pytest.raises(ProtocolError, match="partition id 0xffff of topic 'pyt' cannot be answered"):
        read_consume_request(payload)

P0_CHUNK = h("210c00 74985a03a2010000 02'a1' 03 03'key' 02'a2' 00 75985a03a2010000 02'a3'")
P1_CHUNK = h("0d0400 74985a03a2010000 02'b1'")
CONSUME_RESPONSE = ConsumeResponse(
    0xC8,
    (
        ConsumeTopicResult(
            "pyt",
            (
                ConsumePartitionResult(0, ConsumeStatus.OK, base_seq=1, hwmark=3, chunk_len=34),
                ConsumePartitionResult(1, ConsumeStatus.OK, base_seq=1, hwmark=1, chunk_len=14),
                ConsumePartitionResult(2, ConsumeStatus.OK, base_seq=1, hwmark=1, chunk_len=0),
            ),
            3,
        ),
    ),
    (P0_CHUNK, P1_CHUNK, b""),
)
CONSUME_RESPONSE_BYTES = (
    h(
        "4f000000 c8000000 01 03'pyt' 03"
        "  0000 00 0100000000000000 0300000000000000 22000000"
        "  0100 00 0100000000000000 0100000000000000 0e000000"
        "  0200 00 0100000000000000 0100000000000000 00000000"
    )
    + P0_CHUNK
    + P1_CHUNK
)
UNKNOWN_RESPONSE = ConsumeResponse(
    0xCA,
    (
        ConsumeTopicResult("nosuch", None, 2),
        ConsumeTopicResult("pyt", (ConsumePartitionResult(7, ConsumeStatus.UNKNOWN_PARTITION),), 1),
    ),
    (),
)
UNKNOWN_RESPONSE_BYTES = h("17000000 | ca000000 02 06'nosuch' 02 ffff 03'pyt' 01 0700 ff")
BOUNDARY_RESPONSE = ConsumeResponse(
    0xC9,
    (
        ConsumeTopicResult(
            "pyt", (ConsumePartitionResult(0, ConsumeStatus.BOUNDARY, 0, hwmark=3, first_available=1),), 1
        ),
    ),
    (),
)
BOUNDARY_RESPONSE_BYTES = h(
    "29000000 | c9000000 01 03'pyt' 01 0000 01 0000000000000000 0300000000000000 00000000 0100000000000000"
)


@pytest.mark.parametrize(
    "response, payload",
    [
        (CONSUME_RESPONSE, CONSUME_RESPONSE_BYTES),
        (UNKNOWN_RESPONSE, UNKNOWN_RESPONSE_BYTES),
        (BOUNDARY_RESPONSE, BOUNDARY_RESPONSE_BYTES),
    ],
    ids=["three_partitions", "unknown_topic_and_partition", "boundary"],
)
def test_consume_response(response, payload):
    assert read_consume_response(payload) == response
    assert encode_consume_response(response) == payload
    head = encode_consume_head(response.request_id, response.topics)
    chunk_bytes = sum(len(c) for c in response.chunks)
    assert head == encode_frame(MsgType.CONSUME, payload)[: len(payload) + 5 - chunk_bytes]
    assert maybe_frame(head + b"".join(response.chunks))[1] == payload


def test_consume_response_chunks_are_the_bundles():
    chunks = read_consume_response(CONSUME_RESPONSE_BYTES).chunks
    start, end = maybe_record(chunks[0], 0)
    assert decode_bundle(chunks[0][start:end], base_seq=1) == [
        Message(b"a1", None, 0x01A2035A9874, 1),
        Message(b"a2", b"key", 0x01A2035A9874, 2),
        Message(b"a3", None, 0x01A2035A9875, 3),
    ]
    assert end == len(chunks[0])
    start, end = maybe_record(chunks[1], 0)
    assert decode_bundle(chunks[1][start:end], base_seq=1) == [Message(b"b1", None, 0x01A2035A9874, 1)]


def test_consume_response_redirect_and_sparse():
    response = ConsumeResponse(
        5,
        (
            ConsumeTopicResult(
                "t",
                (
                    ConsumePartitionResult(0, ConsumeStatus.OTHER_LEADER, leader=Endpoint("192.168.1.7", 11011)),
                    ConsumePartitionResult(1, ConsumeStatus.SPARSE, hwmark=1006, chunk_len=len(SPARSE_BUNDLE) + 1),
                    ConsumePartitionResult(2, ConsumeStatus.SYSTEM),
                    ConsumePartitionResult(3, ConsumeStatus.NO_LEADER),
                ),
                4,
            ),
        ),
        (encode_record(SPARSE_BUNDLE),),
    )
    # The sparse partition's chunk is one 48-byte record: 0x30 = varint 47 + the 47-byte bundle.
    header = h("05000000 01 01't' 04 0000 fc c0a80107 032b 0100 fe ee03000000000000 30000000 0200 fb 0300 fd")
    payload = h("26000000") + header + encode_record(SPARSE_BUNDLE)
    assert encode_consume_response(response) == payload
    assert read_consume_response(payload) == response
