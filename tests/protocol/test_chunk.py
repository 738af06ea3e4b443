"""read_chunk and scan_chunk, natively (`_bundlescan.read_chunk`, `scan_chunk`) against their pure-Python references
(`_read_chunk_py`, `_scan_chunk_py`): the same messages, next seq, fetch size asked for and first seq for chunks as a
broker sends them (plain, sparse and snappy bundles; requested seqs and hwmarks inside, before and past them), and
the same ProtocolError (text and position) for every truncation, for lengths and counts past the end, for seqs at
the edge of 64 bits, for mutated and for random bytes.
"""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.bad_bundles import BAD_BUNDLES
from tests.protocol.strategies import budget, bundles, message_lists, mutations
from tiered.protocol import chunk as chunk_module
from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, Message, encode_bundle, encode_record
from tiered.protocol.chunk import ChunkRead, _read_chunk_py, _scan_chunk_py, read_chunk, record_messages, scan_chunk
from tiered.protocol.codes import UINT64_MAX
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import encode_varint


def outcome(read, *args) -> tuple:
    try:
        got = read(*args)
    except ProtocolError as exc:
        return ("error", exc.what, exc.position)
    if isinstance(got, ChunkRead):
        return ("read", got.messages, got.next_seq, got.need_bytes, got.first_seq)
    return ("summary", *got)


def assert_same(chunk: bytes, base_seq, requested_seq: int, hwmark: int) -> tuple:
    """Native and reference agree on `chunk`, read and scanned, from bytes and from a memoryview. Returns the read."""
    args = (chunk, base_seq, requested_seq, hwmark)
    read = outcome(_read_chunk_py, *args)
    assert outcome(read_chunk, *args) == read, chunk.hex()
    assert outcome(read_chunk, memoryview(chunk), *args[1:]) == read
    summary = outcome(_scan_chunk_py, *args)
    assert outcome(scan_chunk, *args) == summary, chunk.hex()
    if read[0] == "read":  # the summary sums up the messages read_chunk returns
        messages = read[1]
        assert summary[1:4] == (len(messages), messages[0].seq if messages else 0, messages[-1].seq if messages else 0)
    return read


def test_the_native_reader_is_built_and_used():
    from tiered.protocol import _bundlescan

    assert chunk_module._native_read is _bundlescan.read_chunk and chunk_module._native_scan is _bundlescan.scan_chunk


def plain(first_value: int, count: int, codec=CODEC_NONE, key=None) -> bytes:
    return encode_record(encode_bundle([Message(b"v%d" % (first_value + i), key, 1000 + first_value + i) for i in range(count)],
                                       codec=codec))


def sparse(seqs: list[int], codec=CODEC_NONE) -> bytes:
    return encode_record(encode_bundle([Message(b"s%d" % s, b"k", s, s) for s in seqs], codec=codec, sparse=True))


# A chunk as a broker sends it: several bundles of a segment, plain and snappy, keyed and not.
SEGMENT = plain(0, 3) + plain(3, 20, CODEC_SNAPPY) + plain(23, 1, key=b"") + plain(24, 600, CODEC_SNAPPY, b"key")
SPARSE = sparse([10, 11, 15]) + sparse([40]) + sparse([41, 42, 43, 90], CODEC_SNAPPY) + sparse([91, 2**32])


@pytest.mark.parametrize("base", [1, 1000, UINT64_MAX - 1000])
def test_segment_chunks_alike_at_every_requested_seq_and_hwmark(base):
    for requested in (0, base, base + 2, base + 3, base + 22, base + 23, base + 300, base + 623, base + 624):
        for hwmark in (base - 1, base, base + 2, base + 23, base + 500, base + 623, UINT64_MAX):
            read = assert_same(SEGMENT, base, requested, hwmark)
            assert read[0] == "read"
    messages = read_chunk(SEGMENT, base, base, UINT64_MAX).messages
    assert [m.seq for m in messages] == list(range(base, base + 624))
    assert messages[3] == Message(b"v3", None, 1003, base + 3) and messages[23].key == b"" and messages[-1].key == b"key"


def test_sparse_chunks_alike():
    for base in (None, 0, 5):
        for requested in (0, 10, 12, 41, 90, 91, 2**32, 2**32 + 1):
            for hwmark in (9, 11, 42, 91, 2**32, UINT64_MAX):
                assert_same(SPARSE, base, requested, hwmark)
    assert [m.seq for m in read_chunk(SPARSE, None, 0, UINT64_MAX).messages] == [10, 11, 15, 40, 41, 42, 43, 90, 91,
                                                                                 2**32]
    assert_same(plain(0, 2), None, 0, UINT64_MAX)  # a plain first bundle with no base: an error alike
    assert_same(SPARSE + plain(0, 2), None, 0, UINT64_MAX)  # plain after sparse continues from the last seq


def test_every_truncation_alike():
    """Every prefix of a chunk: a partial last bundle (whole messages of a plain one, nothing of a snappy one, and
    the fetch size that finishes it), a partial length varint, a header cut short."""
    for chunk, base in ((SEGMENT[:3000], 7), (SPARSE, None)):
        needs = set()
        for end in range(len(chunk) + 1):
            read = assert_same(chunk[:end], base, 0, UINT64_MAX)
            if read[0] == "read":
                needs.add(read[3])
        assert len(needs) > 3


def test_lengths_counts_and_seqs_past_the_end_alike():
    oversized = [
        encode_varint(0xFFFF_FFFF) + SEGMENT[1:],  # a bundle length far past the chunk
        encode_varint(5) + b"\x00",  # a length past the end, with a header that says nothing yet
        b"\x80\x80\x80\x80\x80\x01",  # a varint longer than 5 bytes
        b"\xff\xff\xff\xff\x7f",  # a varint above 32 bits
        b"\x00",  # a zero-length bundle
        encode_varint(7) + b"\x00\xff\xff\xff\xff\x0f\x00",  # a count of 2**32 - 1 in a short bundle
        encode_record(b"\x00\xff\xff\xff\xff\x0f" + b"\x00" * 20),  # the same, whole
    ]
    for chunk in oversized:
        for base in (None, 1, UINT64_MAX):
            assert_same(chunk, base, 0, UINT64_MAX)
    errors = 0
    for _, bundle, _ in BAD_BUNDLES:  # a few are refused only by the produce gate, and read
        errors += assert_same(encode_record(bundle), 1, 0, UINT64_MAX)[0] == "error"
        assert_same(encode_record(bundle)[:-1], 1, 0, UINT64_MAX)
    assert errors > len(BAD_BUNDLES) - 4
    # Seqs at the edge of 64 bits: a plain run ending at 2**64 - 1, one passing it (the reference reads that one),
    # a plain bundle after a sparse one ending there; arguments outside u64.
    edge = plain(0, 3)
    for base in (UINT64_MAX - 2, UINT64_MAX - 1, UINT64_MAX):
        assert_same(edge, base, 0, UINT64_MAX)
    assert [m.seq for m in read_chunk(edge, UINT64_MAX, 0, 2**70).messages] == [UINT64_MAX, 2**64, 2**64 + 1]
    assert_same(sparse([UINT64_MAX - 1, UINT64_MAX]) + edge, None, 0, UINT64_MAX)
    assert_same(SEGMENT, 2**64, 0, 2**65)
    assert_same(SEGMENT, 1, 2**64, 2**65)
    assert_same(SEGMENT, 1, 0, 2**64)


@budget(200)
@given(st.lists(bundles(), min_size=1, max_size=4), st.data())
def test_generated_chunks_alike(records, data):
    chunk = b"".join(encode_record(b) for b in records)
    base = data.draw(st.one_of(st.none(), st.integers(0, 2**41), st.just(UINT64_MAX - 5)))
    requested = data.draw(st.integers(0, 2**41))
    hwmark = data.draw(st.one_of(st.just(UINT64_MAX), st.integers(0, 2**41)))
    assert_same(chunk, base, requested, hwmark)
    assert_same(chunk[:data.draw(st.integers(0, len(chunk)))], base, requested, hwmark)


@budget(300)
@given(st.data())
def test_mutated_chunks_alike(data):
    records = [encode_record(encode_bundle(data.draw(message_lists(max_size=12)), codec=c))
               for c in (CODEC_NONE, CODEC_SNAPPY)]
    assert_same(data.draw(mutations(b"".join(records))), 1, 0, UINT64_MAX)


@budget(300)
@given(st.binary(max_size=200), st.one_of(st.none(), st.integers(0, UINT64_MAX)))
def test_random_bytes_alike(raw, base):
    assert_same(raw, base, 0, UINT64_MAX)


def test_native_reader_survives_a_storm_of_mutations():
    """20,000 seeded byte-level mutations of chunks of plain, sparse and snappy bundles, each read natively and by
    the reference: never a crash, never a difference."""
    rng = random.Random(20261126)
    seeds = [SEGMENT[:4000], SPARSE, plain(0, 40, CODEC_SNAPPY) + plain(40, 5), sparse([3, 4, 9], CODEC_SNAPPY)]
    for _ in range(20_000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            position = rng.randrange(len(data) + 1)
            kind = rng.randrange(3)
            if kind == 0 and position < len(data):
                data[position] = rng.choice([0, 0xFF, 0x80, rng.randrange(256)])
            elif kind == 1:
                data.insert(position, rng.randrange(256))
            elif position < len(data):
                del data[position]
        assert_same(bytes(data), rng.choice([None, 1, 2**40]), rng.choice([0, 3, 50]), UINT64_MAX)


# ------------------------------------------------------------------------------------------------ record_messages


def record_outcome(record: bytes, first_seq: int, native: bool) -> tuple:
    saved = chunk_module._native_read
    if not native:
        chunk_module._native_read = None  # as where the extension is not built: decode_bundle reads the record
    try:
        return ("read", record_messages(record, first_seq))
    except ProtocolError as exc:
        return ("error", exc.what, exc.position)
    finally:
        chunk_module._native_read = saved


def assert_record_same(record: bytes, first_seq: int) -> tuple:
    """record_messages natively and through decode_bundle: the same messages or the same ProtocolError."""
    pure = record_outcome(record, first_seq, False)
    assert record_outcome(record, first_seq, True) == pure, (record.hex(), first_seq)
    return pure


def test_record_messages_are_decode_bundles():
    for record in (plain(0, 3), plain(3, 20, CODEC_SNAPPY), plain(23, 1, key=b""), plain(24, 600, CODEC_SNAPPY, b"k"),
                   sparse([10, 11, 15]), sparse([41, 42, 43, 90], CODEC_SNAPPY), sparse([91, 2**32])):
        for first_seq in (0, 1, 2**40, UINT64_MAX - 2, UINT64_MAX, 2**64 + 5):  # the last two: decode_bundle reads
            read = assert_record_same(record, first_seq)
            assert read[0] == "read" and read[1]
    assert [m.seq for m in record_messages(sparse([10, 11, 15]), 3)] == [10, 11, 15]
    assert [m.seq for m in record_messages(plain(0, 3), UINT64_MAX)] == [UINT64_MAX, 2**64, 2**64 + 1]
    # A record cut short, and one with bytes after it (not what a stored record is: decode_bundle reads its bundle).
    assert assert_record_same(plain(0, 3)[:-1], 1) == ("error", "record is cut short", None)
    assert assert_record_same(plain(0, 3) + b"\x00", 1)[0] == "read"


def test_record_messages_of_bad_truncated_and_random_records_alike():
    errors = 0
    for _, bundle, _ in BAD_BUNDLES:
        errors += assert_record_same(encode_record(bundle), 7)[0] == "error"
    assert errors > len(BAD_BUNDLES) - 4
    record = plain(0, 30, CODEC_SNAPPY)
    for end in range(len(record) + 1):
        assert_record_same(record[:end], 1)
    rng = random.Random(20261127)
    seeds = [plain(0, 12), plain(0, 40, CODEC_SNAPPY), sparse([3, 4, 9]), sparse([3, 4, 9, 200], CODEC_SNAPPY)]
    for _ in range(5000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.choice([0, 0xFF, 0x80, rng.randrange(256)])
        assert_record_same(bytes(data), rng.choice([1, 2**40]))
    for _ in range(2000):
        assert_record_same(rng.randbytes(rng.randrange(40)), 1)


@budget(200)
@given(bundles(), st.integers(0, 2**41))
def test_generated_records_alike(bundle, first_seq):
    assert assert_record_same(encode_record(bundle), first_seq)[0] == "read"
