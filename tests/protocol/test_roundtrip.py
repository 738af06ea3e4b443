"""Round trips of every request and response codec: whole, from a memoryview, with trailing bytes, truncated."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.strategies import CODECS, budget, consume_requests
from tiered.protocol.errors import ProtocolError
from tiered.protocol.requests import ConsumeRequest, encode_consume_request, read_consume_request

codecs = pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])


@codecs
@budget(60)
@given(data=st.data())
def test_round_trip(codec, data):
    value, read = data.draw(codec.cases)
    payload = codec.encode(value)
    assert read(payload) == value
    assert read(memoryview(payload)) == value
    # A payload cut out of a larger buffer, as maybe_frame hands it over.
    assert read(memoryview(b"\xff" * 3 + payload + b"\xee")[3:-1]) == value
    assert codec.encode(read(payload)) == payload


@codecs
@budget(30)
@given(data=st.data())
def test_trailing_bytes_are_refused(codec, data):
    value, read = data.draw(codec.cases)
    extra = data.draw(st.binary(min_size=1, max_size=20))
    payload = codec.encode(value) + extra
    if codec.valid_extension(extra):
        assert read(payload) != value  # more of a repeated part (e.g. a longer partition list)
    else:
        with pytest.raises(ProtocolError, match="trailing|runs past|truncated|odd"):
            read(payload)


@codecs
@budget(30)
@given(data=st.data())
def test_every_truncation_is_refused(codec, data):
    value, read = data.draw(codec.cases)
    payload = codec.encode(value)
    valid = codec.valid_prefixes(value, payload)
    for end in range(len(payload)):
        if end in valid:
            # An older or shorter form of the same message: it reads, and what it reads encodes with that prefix.
            assert codec.encode(read(payload[:end])).startswith(payload[:end])
        else:
            with pytest.raises(ProtocolError):
                read(payload[:end])


@budget(50)
@given(consume_requests(), st.integers(1, 0xFF))
def test_consume_request_with_flags_goes_out_as_version_3(request, op_flags):
    request = ConsumeRequest(
        request.request_id, request.max_wait_ms, request.min_bytes, request.topics, 2, op_flags=op_flags
    )
    payload = encode_consume_request(request)
    assert payload[:2] == b"\x03\x00"
    decoded = read_consume_request(payload)
    assert (decoded.client_version, decoded.op_flags) == (3, op_flags)
    assert decoded.topics == request.topics
