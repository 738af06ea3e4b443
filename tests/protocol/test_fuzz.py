"""Fuzzing every decoder: random bytes, mutated and truncated valid encodings, absurd lengths.

Whatever the input, a decoder returns a value, returns None (`maybe_...` needing more bytes) or raises
ProtocolError: no IndexError, struct.error, UnicodeError, MemoryError or snappy error may escape.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.hexbytes import h
from tests.protocol.strategies import CODECS, budget, bundles, mutations, produce_requests
from tiered.protocol.bundle import decode_bundle, maybe_record, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import maybe_frame
from tiered.protocol.requests import (
    read_consume_request,
    read_create_topic_request,
    read_discover_partitions_request,
    read_discover_topics_request,
    read_produce_request,
)
from tiered.protocol.responses import (
    read_consume_response,
    read_discover_partitions_response,
    read_discover_topics_response,
    read_discover_topology_response,
    read_produce_response,
    read_status_response,
)
from tiered.protocol.varint import encode_varint, maybe_varint

codecs = pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])


def survives(decode, *args):
    """Runs a decoder; anything but a value, None or ProtocolError fails the test."""
    try:
        return decode(*args)
    except ProtocolError:
        return ProtocolError


# --- requests and responses -----------------------------------------------------------------------------------------


@codecs
@budget(100)
@given(data=st.data(), raw=st.binary(max_size=300))
def test_random_payloads(codec, data, raw):
    _, read = data.draw(codec.cases)  # a reader bound to its context (the produce request, for produce responses)
    survives(read, raw)


@codecs
@budget(100)
@given(data=st.data())
def test_mutated_encodings(codec, data):
    value, read = data.draw(codec.cases)
    survives(read, data.draw(mutations(codec.encode(value))))


@budget(100)
@given(produce_requests(), st.binary(max_size=64))
def test_produce_response_for_any_request(request, raw):
    survives(read_produce_response, b"\x01\x00\x00\x00" + raw, request)


ABSURD_LENGTHS = [
    # A str8 longer than what is left.
    (read_discover_topics_request, h("01000000")),
    (read_create_topic_request, h("01000000 ff 'abc'")),
    # A bundle_len varint of 2**32 - 1 with a one-byte bundle, and a varint that never ends.
    (lambda p: read_produce_request(p, False), h("0200 01000000 00 00 00000000 01 01't' 01 0000 ffffffff0f 00")),
    (lambda p: read_produce_request(p, False), h("0200 01000000 00 00 00000000 01 01't' 01 0000 ffffffffff")),
    (lambda p: read_produce_request(p, True), h("0200 01000000 00 00 00000000 01 01't' 01 0000 01 ffff")),
    # A config_len of 2**32 - 1.
    (read_create_topic_request, h("01000000 01't' 0100 ffffffff0f 'x'")),
    # Counts far beyond the bytes that follow.
    (read_consume_request, h("0200 01000000 00 0000000000000000 00000000 ff 01't' ff 0000")),
    (read_discover_topics_response, h("01000000 ffffffff 00 01't' 01 0100")),
    (read_discover_partitions_response, h("01000000 01't' ffff 0100000000000000")),
    (read_discover_topology_response, h("01000000 feff 00 0100 00")),
    # A consume header_len of 2**32 - 1, a chunk_len of 2**32 - 1, and a header ending inside a partition.
    (read_consume_response, h("ffffffff 01000000 00")),
    (read_consume_response, h("18000000 01000000 01 01't' 01 0000 00 0100000000000000 0100000000000000 ffffffff")),
    (read_consume_response, h("0a000000 01000000 01 01't' 01 0000 00")),
    # Bools that are neither 0 nor 1; an unknown consume status; an odd partition list.
    (read_status_response, h("01000000 00 02 00000000 00000000")),
    (read_discover_topics_response, h("01000000 01000000 00 01't' 07 0100")),
    (read_consume_response, h("0b000000 01000000 01 01't' 01 0000 02")),
    (read_discover_partitions_request, h("01000000 01't' 000001")),
]


@pytest.mark.parametrize("read, payload", ABSURD_LENGTHS)
def test_absurd_lengths_and_values(read, payload):
    with pytest.raises(ProtocolError):
        read(payload)


def test_errors_say_what_and_where():
    with pytest.raises(ProtocolError) as info:
        read_produce_request(h("0200 01000000 00 00 00000000 01 01't' 01 0000 05 'ab'"), False)
    assert "produce request" in str(info.value) and "bundle of t/0" in str(info.value)
    assert info.value.position == 19  # where the bundle starts
    with pytest.raises(ProtocolError) as info:
        read_consume_response(h("0b000000 01000000 01 01't' 01 0000 02"))
    assert "unknown consume status 0x02" in str(info.value) and info.value.position == 14


# --- frames, varints, records, bundles -----------------------------------------------------------------------------


@budget(300)
@given(st.binary(max_size=40), st.integers(0, 40))
def test_maybe_frame_random(raw, position):
    got = survives(maybe_frame, raw, position)
    if got not in (None, ProtocolError):
        msg_id, payload, end = got
        assert end == position + 5 + len(payload) <= len(raw)


@budget(300)
@given(st.binary(max_size=12), st.integers(0, 12))
def test_maybe_varint_and_maybe_record_random(raw, position):
    survives(maybe_varint, raw, position)
    got = survives(maybe_record, raw, position)
    if got not in (None, ProtocolError):
        start, end = got
        assert position < start < end <= len(raw)


@budget(300)
@given(st.binary(max_size=80))
def test_bundle_decoders_random(raw):
    survives(read_bundle_header, raw)
    survives(decode_bundle, raw, 1)


@budget(200)
@given(st.data())
def test_bundle_decoders_mutated(data):
    bundle = data.draw(bundles())
    mutated = data.draw(mutations(bundle))
    survives(read_bundle_header, mutated)
    survives(decode_bundle, mutated, 1)


@budget(60)
@given(bundles())
def test_every_truncated_bundle_is_refused(bundle):
    for end in range(len(bundle)):
        with pytest.raises(ProtocolError):
            decode_bundle(bundle[:end], 1)


@pytest.mark.parametrize(
    "bundle",
    [
        # 2**32 - 1 messages claimed by a varint count, one present.
        h("00 ffffffff0f 00 0000000000000000 01'a'"),
        # A snappy message set claiming 512 MiB, and one claiming 2**32 - 1 bytes from three bytes.
        h("05") + encode_varint(512 * 1024 * 1024) + h("00"),
        h("05 ffffffff0f 0061"),
        # A sparse seq delta that overflows past the last seq, and one that is a truncated varint.
        h("4c 0100000000000000 ffffffff0f 00 0000000000000000 01'a' 00 ffffffff0f 01'b' 02 01'c'"),
        h("4c 0100000000000000 05 00 0000000000000000 01'a' 00 ff"),
    ],
)
def test_absurd_bundles(bundle):
    with pytest.raises(ProtocolError):
        decode_bundle(bundle, 1)
