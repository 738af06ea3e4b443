"""Bundles (docs/protocol.md §4): headers, message sets, records, and the encoder's choices."""

import pytest
import snappy
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.hexbytes import h
from tests.protocol.strategies import budget, message_lists, sparse_seqs
from tiered.protocol.bundle import (
    CODEC_NONE,
    CODEC_SNAPPY,
    FLAG_SPARSE,
    SEQ_PREV_PLUS_ONE,
    USE_LAST_TS,
    BundleHeader,
    Message,
    bundle_seq_range,
    choose_codec,
    decode_bundle,
    encode_bundle,
    encode_record,
    maybe_record,
    read_bundle_header,
)
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import encode_varint

TS = h("74985a03a2010000")


def with_seqs(messages, seqs):
    return [Message(m.value, m.key, m.ts_ms, seq) for m, seq in zip(messages, seqs)]


# --- round trips ----------------------------------------------------------------------------------------------------


@budget(150)
@given(message_lists(), st.sampled_from([None, CODEC_NONE, CODEC_SNAPPY]), st.integers(0, 2**63))
def test_plain_round_trip(messages, codec, base_seq):
    bundle = encode_bundle(messages, codec=codec)
    header = read_bundle_header(bundle)
    expected_codec = choose_codec(messages) if codec is None else codec
    assert (header.codec, header.count, header.sparse) == (expected_codec, len(messages), False)
    assert bundle_seq_range(header, base_seq) == (base_seq, base_seq + len(messages) - 1)
    expected = with_seqs(messages, range(base_seq, base_seq + len(messages)))
    assert decode_bundle(bundle, base_seq) == expected
    assert decode_bundle(memoryview(bundle), base_seq) == expected


@budget(150)
@given(st.data(), st.sampled_from([None, CODEC_NONE, CODEC_SNAPPY]))
def test_sparse_round_trip(data, codec):
    messages = data.draw(message_lists())
    seqs = data.draw(sparse_seqs(len(messages)))
    messages = with_seqs(messages, seqs)
    bundle = encode_bundle(messages, codec=codec, sparse=True)
    header = read_bundle_header(bundle)
    assert header.sparse and (header.first_seq, header.last_seq) == (seqs[0], seqs[-1])
    assert bundle_seq_range(header, 12345) == (seqs[0], seqs[-1])
    assert decode_bundle(bundle, base_seq=999) == messages  # a sparse bundle ignores the reader's base


@budget(20)
@given(st.integers(16, 600), st.booleans())
def test_counts_of_16_and_more_use_a_varint(count, sparse):
    messages = [Message(b"%d" % i, None, i // 7, i + 1) for i in range(count)]
    bundle = encode_bundle(messages, sparse=sparse)
    assert bundle[0] & 0x3C == 0
    assert bundle[1 : 1 + len(encode_varint(count))] == encode_varint(count)
    assert read_bundle_header(bundle).count == count
    assert decode_bundle(bundle, 1) == messages


@pytest.mark.parametrize("count", range(1, 16))
def test_counts_below_16_sit_in_the_flags(count):
    bundle = encode_bundle([Message(b"x", None, 5)] * count, codec=CODEC_NONE)
    assert bundle[0] == count << 2
    assert read_bundle_header(bundle).header_len == 1


def test_use_last_specified_ts_compares_with_the_previous_message():
    messages = [Message(b"a", None, 7), Message(b"b", None, 7), Message(b"c", None, 8), Message(b"d", None, 7)]
    bundle = encode_bundle(messages, codec=CODEC_NONE)
    ts7, ts8 = (7).to_bytes(8, "little"), (8).to_bytes(8, "little")
    assert bundle == h("10") + h("00") + ts7 + h("01'a' 02 01'b' 00") + ts8 + h("01'c' 00") + ts7 + h("01'd'")
    assert [m.ts_ms for m in decode_bundle(bundle)] == [7, 7, 8, 7]


def test_sparse_never_sets_prev_plus_one_on_first_or_last():
    messages = [Message(b"a", None, 1, 5), Message(b"b", None, 1, 6), Message(b"c", None, 1, 7)]
    bundle = encode_bundle(messages, codec=CODEC_NONE, sparse=True)
    # first 5, last - first - 1 = 1; the middle message is prev + 1 with the same stamp; the last only reuses it.
    assert bundle == h("4c 0500000000000000 01 00 0100000000000000 01'a' 06 01'b' 02 01'c'")


def test_sparse_single_message_has_no_last_delta():
    bundle = encode_bundle([Message(b"only", b"k", 3, 42)], codec=CODEC_NONE, sparse=True)
    assert bundle == h("44 2a00000000000000 01 0300000000000000 01'k' 04'only'")
    header = read_bundle_header(bundle)
    assert (header.first_seq, header.last_seq, header.header_len) == (42, 42, 9)
    assert decode_bundle(bundle) == [Message(b"only", b"k", 3, 42)]


def test_keys_empty_and_longest():
    messages = [Message(b"v", b"", 1), Message(b"w", b"k" * 255, 1), Message(b"", None, 2)]
    assert decode_bundle(encode_bundle(messages), 10) == with_seqs(messages, [10, 11, 12])
    with pytest.raises(ValueError):
        encode_bundle([Message(b"v", b"k" * 256, 1)])


# --- codec choice ---------------------------------------------------------------------------------------------------


def test_choose_codec_follows_tank_client_thresholds():
    assert choose_codec([Message(b"")] * 512) == CODEC_NONE
    assert choose_codec([Message(b"")] * 513) == CODEC_SNAPPY
    assert choose_codec([Message(b"x" * 1000, b"y" * 24)]) == CODEC_NONE
    assert choose_codec([Message(b"x" * 1000, b"y" * 25)]) == CODEC_SNAPPY
    assert choose_codec([Message(b"x" * 600), Message(b"x" * 425)]) == CODEC_SNAPPY


def test_snappy_bundles_are_raw_snappy_after_the_header():
    messages = [Message(b"hello " * 300, None, 1)]
    bundle = encode_bundle(messages)
    assert bundle[0] == 0x04 | CODEC_SNAPPY
    assert decode_bundle(bundle[:1] + snappy.compress(encode_bundle(messages, codec=CODEC_NONE)[1:])) == with_seqs(
        messages, [0]
    )
    assert snappy.uncompress(bundle[1:]) == encode_bundle(messages, codec=CODEC_NONE)[1:]


# --- records --------------------------------------------------------------------------------------------------------


@budget(50)
@given(st.lists(message_lists(max_size=5), min_size=1, max_size=4))
def test_records_read_whole_and_byte_by_byte(bundles_messages):
    bundles = [encode_bundle(m) for m in bundles_messages]
    log = b"".join(encode_record(b) for b in bundles)
    position, found = 0, []
    while (got := maybe_record(log, position)) is not None:
        found.append(log[got[0] : got[1]])
        position = got[1]
    assert found == bundles and position == len(log)
    # A reader that has only a prefix of the log sees exactly the records that are whole in it.
    for end in range(len(log) + 1):
        position, whole = 0, 0
        while (got := maybe_record(log[:end], position)) is not None:
            position, whole = got[1], whole + 1
        assert whole == sum(1 for b in _record_ends(bundles) if b <= end)


def _record_ends(bundles):
    end = 0
    for b in bundles:
        end += len(encode_record(b))
        yield end


def test_zero_length_record_is_refused():
    with pytest.raises(ProtocolError, match="zero-length"):
        maybe_record(b"\x00\x04")


# --- bad headers and message sets -----------------------------------------------------------------------------------

BAD_HEADERS = [
    (b"", "empty"),
    (h("06"), "codec 2"),
    (h("07"), "codec 3"),
    (h("84 00"), "reserved"),
    (h("00 00"), "no messages"),
    (h("00"), "truncated bundle message count"),
    (h("00 80"), "truncated bundle message count"),
    (h("44 01000000"), "truncated sparse bundle first seq"),
    (h("48 0100000000000000"), "truncated sparse bundle last seq"),
    (h("4c 0100000000000000 00"), "smaller than its message count"),
    (h("44 0000000000000000"), "first seq 0"),
    (h("48 ffffffffffffffff 00"), "exceeds 64 bits"),
]


@pytest.mark.parametrize("bundle, error", BAD_HEADERS)
def test_bad_headers(bundle, error):
    with pytest.raises(ProtocolError, match=error):
        read_bundle_header(bundle)
    with pytest.raises(ProtocolError, match=error):
        decode_bundle(bundle)


BAD_MESSAGE_SETS = [
    (h("04"), "ends after 0 of 1"),
    (h("08 00") + TS + h("00"), "ends after 1 of 2"),
    (h("04 08") + TS + h("00"), "unknown message flags"),
    (h("04 00 0100"), "truncated message timestamp"),
    (h("04 01") + TS, "truncated message key length"),
    (h("04 01") + TS + h("05'ab'"), "truncated message key"),
    (h("04 00") + TS, "truncated message content length"),
    (h("04 00") + TS + h("05'ab'"), "truncated message content"),
    (h("04 00") + TS + h("01'a' 00"), "1 bytes after the last message"),
    (h("05 05 ff"), "bad snappy"),
    (h("05"), "truncated snappy"),
    # Sparse 1..10 with three messages whose middle delta lands on (or past) the last seq.
    (h("4c 0100000000000000 08 00") + TS + h("00 02 08 00 02 00"), "not below its last seq"),
    (h("4c 0100000000000000 08 00") + TS + h("00 02 0a 00 02 00"), "not below its last seq"),
]


@pytest.mark.parametrize("bundle, error", BAD_MESSAGE_SETS)
def test_bad_message_sets(bundle, error):
    with pytest.raises(ProtocolError, match=error):
        decode_bundle(bundle)


def test_sparse_first_and_last_take_the_header_seqs_whatever_their_flags():
    # The broker's reading (foreach_msg): first and last come from the header even when flag 4 is set on them.
    bundle = h("48 0a00000000000000 04 04") + TS + h("01'a' 06 01'b'")
    assert [m.seq for m in decode_bundle(bundle)] == [10, 15]


def test_encoder_refusals():
    with pytest.raises(ValueError):
        encode_bundle([])
    with pytest.raises(ValueError):
        encode_bundle([Message(b"x")], codec=2)
    with pytest.raises(ValueError):
        encode_bundle([Message(b"x", seq=0)], sparse=True)
    with pytest.raises(ValueError):
        encode_bundle([Message(b"x", seq=5), Message(b"y", seq=5)], sparse=True)


def test_header_dataclass_of_a_plain_bundle():
    assert read_bundle_header(encode_bundle([Message(b"x")], codec=CODEC_NONE)) == BundleHeader(
        CODEC_NONE, 1, False, None, None, 1
    )
    assert FLAG_SPARSE == 0x40 and USE_LAST_TS == 2 and SEQ_PREV_PLUS_ONE == 4
