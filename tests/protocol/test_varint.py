"""Unsigned 32-bit LEB128 varints (docs/protocol.md §5)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.strategies import budget

from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import MAX_VARINT, encode_varint, maybe_varint, read_varint, varint_size

BOUNDARIES = [
    (0, "00"),
    (1, "01"),
    (0x7F, "7f"),
    (0x80, "8001"),
    (188, "bc01"),
    (1868, "cc0e"),
    (2**14 - 1, "ff7f"),
    (2**14, "808001"),
    (2**21 - 1, "ffff7f"),
    (2**21, "80808001"),
    (2**28 - 1, "ffffff7f"),
    (2**28, "8080808001"),
    (MAX_VARINT, "ffffffff0f"),
]


@pytest.mark.parametrize("value, encoded", BOUNDARIES)
def test_boundaries(value, encoded):
    raw = bytes.fromhex(encoded)
    assert encode_varint(value) == raw
    assert varint_size(value) == len(raw)
    assert maybe_varint(raw) == (value, len(raw))
    assert read_varint(b"\xaa" + raw + b"\xbb", 1) == (value, len(raw) + 1)
    assert maybe_varint(memoryview(raw)) == (value, len(raw))


@pytest.mark.parametrize("value", [-1, MAX_VARINT + 1, 2**64])
def test_encode_refuses_values_outside_32_bits(value):
    with pytest.raises(ValueError):
        encode_varint(value)


@budget(300)
@given(st.integers(0, MAX_VARINT), st.binary(max_size=4))
def test_round_trip_and_every_truncation(value, after):
    raw = encode_varint(value)
    assert maybe_varint(raw + after) == (value, len(raw))
    for end in range(len(raw)):
        assert maybe_varint(raw[:end]) is None
        with pytest.raises(ProtocolError, match="truncated seq delta"):
            read_varint(raw[:end], 0, "seq delta")


def test_over_32_bits_is_refused_not_wrapped():
    # TANK's decoder does not mask the fifth byte; we refuse instead of returning a wrapped value.
    with pytest.raises(ProtocolError, match="32 bits"):
        maybe_varint(bytes.fromhex("ffffffff10"))
    with pytest.raises(ProtocolError, match="32 bits"):
        maybe_varint(bytes.fromhex("808080807f"))


def test_more_than_five_bytes_is_refused():
    with pytest.raises(ProtocolError, match="longer than 5"):
        maybe_varint(bytes.fromhex("8080808080"))
    with pytest.raises(ProtocolError, match="longer than 5"):
        maybe_varint(bytes.fromhex("808080808000"))
    assert maybe_varint(bytes.fromhex("80808080")) is None  # four continuation bytes may still end well


def test_overlong_zero_is_accepted_like_tank():
    # A non-canonical encoding decodes to its value (TANK's UnpackUInt32 does the same).
    assert maybe_varint(bytes.fromhex("8000")) == (0, 2)


def test_position_past_the_end_is_incomplete():
    assert maybe_varint(b"\x01", 1) is None
    assert maybe_varint(b"", 0) is None


@budget(300)
@given(st.binary(max_size=8), st.integers(0, 8))
def test_random_bytes(raw, position):
    try:
        got = maybe_varint(raw, position)
    except ProtocolError:
        return
    if got is not None:
        value, end = got
        assert 0 <= value <= MAX_VARINT
        assert position < end <= min(len(raw), position + 5)
        assert raw[end - 1] < 0x80
