"""The native decoder (tiered/spark/_decode.c) against the pure one, its reference: the same record batches for every
kind of bundle, seq and time range and batch size, and on damaged bytes the same ProtocolError, never a crash."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
import snappy
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.strategies import budget, message_lists, sparse_seqs
from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, Message, encode_bundle, encode_record
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import encode_varint
from tiered.spark.decoding import (
    DECODER_ENV,
    SCHEMA,
    PieceBytes,
    decode_pieces,
    decode_records,
    native_decode,
    native_module,
)
from tiered.spark.planning import U64_MAX, SeqRange, TimeRange

T = 1_700_000_000_000
FLIPS = 1500  # damaged copies per run of the bit-flip test; tests/test_native_asan.py runs a tenth under ASan
SNAPPY_FAULT = "bad snappy message set:"


def test_the_native_decoder_is_built():
    assert native_decode is not None, "tiered.spark._decode is not built: `pip install -e .` with gcc installed"
    assert native_module("auto") is native_decode


def test_the_decoder_is_chosen_by_argument_then_environment(monkeypatch):
    assert native_module("python") is None
    assert native_module("native") is native_decode
    monkeypatch.setenv(DECODER_ENV, "python")
    assert native_module() is None
    assert native_module("native") is native_decode
    monkeypatch.setenv(DECODER_ENV, "fast")
    with pytest.raises(ValueError, match=DECODER_ENV):
        native_module()


def outcome(data, first_seq=1, seqs=SeqRange(), times=TimeRange(), batch_rows=8192, *, decoder: str):
    """The batches one decoder makes of `data`, or the ProtocolError it raises as (what, position); a snappy fault
    is compared by its prefix, as each snappy implementation names the fault its own way."""
    try:
        batches = list(decode_records(data, first_seq, "topic", 7, seqs, times, batch_rows, decoder=decoder))
    except ProtocolError as exc:
        what = SNAPPY_FAULT if exc.what.startswith(SNAPPY_FAULT) else exc.what
        return "error", what, exc.position
    for batch in batches:
        batch.validate(full=True)
        assert batch.schema == SCHEMA
    return [b.num_rows for b in batches], pa.Table.from_batches(batches, SCHEMA)


def assert_same(data, first_seq=1, seqs=SeqRange(), times=TimeRange(), batch_rows=8192):
    pure = outcome(data, first_seq, seqs, times, batch_rows, decoder="python")
    native = outcome(data, first_seq, seqs, times, batch_rows, decoder="native")
    if pure[0] == "error":
        assert native == pure
    else:
        assert native[0] == pure[0], "batch sizes"
        assert native[1].equals(pure[1]), (native[1].to_pylist()[:3], pure[1].to_pylist()[:3])
    return pure


def mixed_records(rng: random.Random, bundles: int = 12, sizes=(0, 1, 30, 700)) -> tuple[bytes, int]:
    """Plain, snappy and sparse bundles with gaps, keys (some empty), repeated stamps (UseLastSpecifiedTS) and a
    stamp past Spark's range, values of `sizes` bytes; the seq of the first record."""
    out, seq = [], 100
    for i in range(bundles):
        n = 600 if i == 1 else rng.choice([1, 2, 3, 15, 16, 40])
        if i % 4 == 2:
            seqs = sorted(rng.sample(range(seq, seq + 3 * n), n))
            seq = seqs[-1] + 1
        else:
            seqs = list(range(seq, seq + n))
            seq += n
        stamps = [rng.choice([T, T + 1, T + rng.randint(0, 5000), (1 << 64) - 1]) for _ in range(n)]
        messages = [Message(rng.randbytes(rng.choice(sizes)), rng.choice([None, b"", b"k%d" % s]), ts, s)
                    for s, ts in zip(seqs, stamps)]
        codec = rng.choice([CODEC_NONE, CODEC_SNAPPY])
        out.append(encode_record(encode_bundle(messages, codec=codec, sparse=i % 4 == 2)))
    return b"".join(out), 100


# --- the same batches ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_rows", [1, 7, 1000, 8192])
def test_same_batches_for_every_bundle_kind(batch_rows):
    data, first = mixed_records(random.Random(batch_rows))
    rows, _ = assert_same(data, first, batch_rows=batch_rows)
    assert sum(rows) > 700


def test_same_batches_inside_seq_and_time_ranges():
    data, first = mixed_records(random.Random(3))
    pure = outcome(data, first, decoder="python")[1]
    seqs_seen = pure.column("seq").to_pylist()
    rng = random.Random(4)
    for _ in range(40):
        a, b = sorted(rng.sample(seqs_seen, 2))
        assert_same(data, first, SeqRange(a, b), batch_rows=rng.choice([3, 100, 8192]))
        start, end = sorted(rng.sample(range(T - 10, T + 5010), 2))
        assert_same(data, first, times=TimeRange(start * 1000, end * 1000), batch_rows=50)
        assert_same(data, first, SeqRange(a, b), TimeRange(start * 1000, None))
    for seqs in (SeqRange(1, 99), SeqRange(10**9, U64_MAX), SeqRange(5, 4)):
        assert assert_same(data, first, seqs) == ([], pa.Table.from_batches([], SCHEMA))
    assert_same(data, first, times=TimeRange(0, None))  # unbounded: the stamp past Spark's range stays, null
    assert_same(data, first, times=TimeRange(-5, 1))
    assert_same(data, first, times=TimeRange(1 << 70, None))
    assert_same(data, first, SeqRange(-5, 1 << 70), TimeRange(-(1 << 70), 1 << 70))


@budget(60)
@given(st.data())
def test_same_batches_for_generated_bundles(data):
    records, seq = [], data.draw(st.integers(0, 2**40))
    for _ in range(data.draw(st.integers(1, 4))):
        messages = data.draw(message_lists(max_size=20))
        sparse = data.draw(st.booleans())
        if sparse:
            seqs = data.draw(sparse_seqs(len(messages)))
            messages = [Message(m.value, m.key, m.ts_ms, s + seq) for m, s in zip(messages, seqs)]
            seq = messages[-1].seq + 1
        else:
            seq += len(messages)
        codec = data.draw(st.sampled_from([CODEC_NONE, CODEC_SNAPPY]))
        records.append(encode_record(encode_bundle(messages, codec=codec, sparse=sparse)))
    first = data.draw(st.integers(0, 2**40))
    assert_same(b"".join(records), first, batch_rows=data.draw(st.integers(1, 30)))


def test_a_batch_spans_pieces_as_in_the_pure_path():
    rng = random.Random(9)
    pieces = []
    for _ in range(5):
        data, _ = mixed_records(rng, bundles=3)
        pieces.append(PieceBytes(data, 100, SeqRange(rng.randint(100, 200), rng.randint(300, 2000))))
    pure = list(decode_pieces(pieces, "t", 1, batch_rows=333, decoder="python"))
    native = list(decode_pieces(pieces, "t", 1, batch_rows=333, decoder="native"))
    assert [b.num_rows for b in native] == [b.num_rows for b in pure]
    assert pa.Table.from_batches(native).equals(pa.Table.from_batches(pure))


def test_a_seq_past_the_int64_column_is_a_protocol_error_in_both():
    big = encode_record(encode_bundle([Message(b"a", None, T, 1 << 63)], sparse=True))
    assert assert_same(big)[1].startswith("seq 9223372036854775808 exceeds")
    assert assert_same(big, seqs=SeqRange(1, (1 << 63) - 1)) == ([], pa.Table.from_batches([], SCHEMA))
    # A fault later in the same bundle is found first, as the pure path decodes a bundle whole before keeping any.
    two = encode_bundle([Message(b"a", None, T, 1 << 63), Message(b"b", None, T, (1 << 63) + 5)], sparse=True)
    assert assert_same(encode_record(two[:-1] + b"\x05bb"))[1] == "2 bytes after the last message of the bundle"


def test_no_rows_and_bad_batch_sizes():
    assert_same(b"")
    for decoder in ("python", "native"):
        with pytest.raises(ValueError):
            list(decode_records(b"", 1, "t", 0, batch_rows=0, decoder=decoder))


# --- damaged bytes: the same ProtocolError, never a crash ----------------------------------------------------------


def test_every_truncation_raises_the_same_error():
    data, first = mixed_records(random.Random(5), bundles=4)
    cuts = sorted(set(range(0, 64)) | set(range(0, len(data), 97)) | set(range(len(data) - 64, len(data))))
    for cut in cuts:
        assert_same(data[:cut], first)


def test_random_bytes_and_bit_flips_raise_the_same_error():
    rng = random.Random(11)
    data, first = mixed_records(rng, bundles=8, sizes=(0, 1, 2))  # small values: most bytes are structure
    for _ in range(FLIPS):
        damaged = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 8])):
            position = rng.randrange(len(damaged))
            damaged[position] = rng.choice([damaged[position] ^ (1 << rng.randrange(8)), rng.randrange(256), 0, 0xFF])
        assert_same(bytes(damaged), first, batch_rows=rng.choice([5, 8192]))
    for size in (1, 2, 5, 9, 40, 300, 5000):
        for _ in range(40):
            assert_same(rng.randbytes(size), rng.randrange(1 << 64))


def test_oversized_lengths_and_trailing_bytes():
    plain = encode_bundle([Message(b"abc", b"k", T), Message(b"de", None, T)], codec=CODEC_NONE)
    cases = [
        b"\xff\xff\xff\xff\x0f" + plain,  # a record of 2^32 - 1 bytes
        b"\x80\x80\x80\x80\x80\x01",  # a record length longer than 5 bytes
        b"\xff\xff\xff\xff\x1f",  # a record length past 32 bits
        encode_record(plain + b"\x00"),  # a byte after the last message
        encode_record(plain) + b"\x00",  # a zero-length record
        encode_record(plain[:-2] + b"\xff\xff\xff\xff\x0f"),  # a content length past the message set
        encode_record(b"\x08" + b"\x01\x00" + b"\xff" * 7),  # the message set ends before a key length
        encode_record(b"\x80\x01\x00"),  # the reserved flag
        encode_record(b"\x03\x01\x00"),  # an unknown codec
        encode_record(b"\x00\x00"),  # a count of 0
        encode_record(b"\x44" + b"\x00" * 8 + b"\x00"),  # a sparse first seq of 0
        encode_record(b"\x48" + b"\xff" * 8 + b"\x05"),  # a sparse last seq past 64 bits
        encode_record(b"\x04\x08"),  # unknown message flags
    ]
    snappy_body = snappy.compress(bytes(encode_bundle([Message(b"x" * 500, None, T)] * 4, codec=CODEC_NONE)[1:]))
    header = bytes([CODEC_SNAPPY | (4 << 2)])
    cases += [
        encode_record(header + b"\xff\xff\xff\xff\x0f" + snappy_body[5:]),  # claims 4 GiB
        encode_record(header + b"\xe8\x07" + snappy_body[2:]),  # claims fewer bytes than it holds
        encode_record(header + snappy_body[:-1]),  # cut short
        encode_record(header + snappy_body + b"\x00"),  # an element after the last byte
        encode_record(header + b"\x80"),  # a cut length
        encode_record(header),  # nothing after the header
    ]
    for case in cases:
        pure = assert_same(case)
        assert pure[0] == "error", case


@budget(300)
@given(st.binary(max_size=600))
def test_snappy_blocks_decompress_as_python_snappy_does(block):
    """The decoder's own raw snappy reader against python-snappy on random blocks and on real blocks with a byte
    changed: the same bytes or both refused."""
    for body in (block, _damaged(snappy.compress(block), block)):
        try:
            expected = snappy.uncompress(body) if _plausible_length(body) else ProtocolError
        except snappy.UncompressError:
            expected = ProtocolError
        if expected is ProtocolError:
            with pytest.raises(ProtocolError):
                native_decode.snappy_message_set(body)
        else:
            assert native_decode.snappy_message_set(body) == expected


def test_snappy_copies_of_every_period_and_length():
    """Repeats of period 1 to 70 (overlapping copies) between random and long literals, and a 4-byte offset."""
    rng = random.Random(13)
    for period in range(1, 71):
        pattern = rng.randbytes(period)
        data = b"".join(rng.choice([pattern * rng.randint(1, 40), rng.randbytes(rng.randint(1, 90))])
                        for _ in range(60))
        assert native_decode.snappy_message_set(snappy.compress(data)) == data
    # Compressors cut input into 64 KiB blocks and never copy across: a 4-byte offset made by hand.
    literal = rng.randbytes(70_000)
    body = (encode_varint(70_064) + bytes([62 << 2]) + (len(literal) - 1).to_bytes(3, "little") + literal
            + bytes([(64 - 1) << 2 | 3]) + (70_000).to_bytes(4, "little"))
    assert native_decode.snappy_message_set(body) == snappy.uncompress(body) == literal + literal[:64]


def _damaged(body: bytes, seed: bytes) -> bytes:
    rng = random.Random(seed)
    if not body:
        return body
    damaged = bytearray(body)
    damaged[rng.randrange(len(damaged))] = rng.randrange(256)
    return bytes(damaged)


def _plausible_length(body: bytes) -> bool:
    """Whether the claimed length passes the limits both decoders apply before decompressing."""
    from tiered.protocol.bundle import MAX_MESSAGE_SET_BYTES, SNAPPY_MAX_EXPANSION
    from tiered.protocol.varint import maybe_varint

    try:
        got = maybe_varint(body, 0)
    except ProtocolError:
        return False
    return got is not None and got[0] <= min(MAX_MESSAGE_SET_BYTES, SNAPPY_MAX_EXPANSION * len(body))
