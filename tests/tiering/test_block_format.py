"""Block objects: the byte layout, round trips, the footer from the tail alone, and bad bytes refused."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered.protocol.bundle import Message, decode_bundle, encode_bundle, encode_record, maybe_record
from tiered.protocol.errors import ProtocolError
from tiered.catalog.blocks import RunMeta, RunRow
from tiered.tiering.blocks.block_format import (
    FOOTER_TRAILER_BYTES,
    MAGIC,
    INDEX_EVERY_BYTES,
    RUN_ENTRY,
    RUN_ENTRY_V1,
    RunIndex,
    block_tail_bytes,
    decode_block,
    encode_block,
    encode_block_pieces,
    read_block_footer,
    read_block_indexes,
    run_index_of,
)


def records(first_ts: int, *values: bytes) -> bytes:
    """One record per value, each a one-message bundle, as they sit in a segment file."""
    return b"".join(encode_record(encode_bundle([Message(v, ts_ms=first_ts + i)])) for i, v in enumerate(values))


def meta(topic: str, partition: int, first: int, last: int, messages: int, min_ts: int, max_ts: int, *,
         from_seq: int | None = None, epoch: int = 0) -> RunMeta:
    return RunMeta(topic, partition, first if from_seq is None else from_seq, first, last, messages, min_ts, max_ts,
                   epoch)


def sample_runs() -> list[tuple[RunMeta, bytes]]:
    return [
        (meta("orders", 0, 100, 102, 3, 1000, 1002), records(1000, b"a", b"bb", b"ccc")),
        (meta("orders", 7, 5, 5, 1, 2000, 2000), records(2000, b"x" * 300)),
        (meta("audit-log_2", 65535, 2**64 - 2, 2**64 - 1, 2, 0, 2**64 - 1), records(0, b"", b"k")),
        (meta("big", 1, 0, 1, 2, 5, 6), records(5, random.Random(1).randbytes(20_000), b"y" * 200)),
    ]


# One record as the block format sees it: a varint length (3) and that many bytes. The format checks framing only;
# what is inside a bundle is protocol/bundle.py's business.
RECORD4 = b"\x03abc"


def footer_entry(topic: bytes, *fields: int) -> bytes:
    """A version 1 entry (forge's default): partition, first, last, position, length, messages, min ts, max ts."""
    return bytes([len(topic)]) + topic + RUN_ENTRY_V1.pack(*fields)


def forge(run_bytes: bytes, footer: bytes, *, version: int = 1, magic: bytes = MAGIC, crc: int | None = None) -> bytes:
    """A block with a hand-made footer and a valid (or chosen) CRC: reaches the checks behind the CRC."""
    crc = zlib.crc32(footer) if crc is None else crc
    return run_bytes + footer + struct.pack("<IIB", len(footer), crc, version) + magic


def test_the_byte_layout_is_exactly_as_documented():
    hello, world = records(1700000000000, b"hello"), records(1700000000001, b"world")
    run = hello + world
    m = meta("t", 1, 10, 300, 2, 1700000000000, 1700000000001, from_seq=7, epoch=4)
    data, rows = encode_block([(m, run)], indexes=[[(300, len(hello))]])
    footer = (
        struct.pack("<I", 1)  # run_count
        + b"\x01t"  # topic str8
        + struct.pack("<HQQQQQIQQQ", 1, 7, 10, 300, 0, len(run), 2, 1700000000000, 1700000000001, 4)
        + b"\x01"  # index_count
        + b"\xa2\x02" + bytes([len(hello)])  # seq delta 290 (a two-byte varint), position delta
    )
    assert data == run + footer + struct.pack("<II", len(footer), zlib.crc32(footer)) + b"\x03" + b"TIEREDB1"
    assert FOOTER_TRAILER_BYTES == 17
    assert rows == [RunRow("t", 1, 7, 10, 300, 2, 1700000000000, 1700000000001, 4, 0, len(run))]
    [(row, index)] = read_block_indexes(data, len(data))
    assert index == RunIndex((10, 300), (0, len(hello)), len(run))


def test_version_2_blocks_still_read_without_a_bundle_index():
    run = records(1700000000000, b"hello")
    footer = (struct.pack("<I", 1) + b"\x01t"
              + struct.pack("<HQQQQQIQQQ", 1, 7, 10, 10, 0, len(run), 1, 1700000000000, 1700000000000, 4))
    block = forge(run, footer, version=2)
    assert read_block_indexes(block, len(block)) == [
        (RunRow("t", 1, 7, 10, 10, 1, 1700000000000, 1700000000000, 4, 0, len(run)), None)]
    [(row, data)] = decode_block(block)
    assert bytes(data) == run


def test_version_1_blocks_still_read_answering_from_their_first_seq():
    """Blocks written before from_seq and epochs were recorded: a run answers from its first seq, epoch 0."""
    run = records(1700000000000, b"hello")
    footer = struct.pack("<I", 1) + footer_entry(b"t", 1, 10, 10, 0, len(run), 1, 1700000000000, 1700000000000)
    [(row, data)] = decode_block(forge(run, footer, version=1))
    assert row == RunRow("t", 1, 10, 10, 10, 1, 1700000000000, 1700000000000, 0, 0, len(run))
    assert bytes(data) == run


def test_a_partition_may_have_several_runs_in_seq_order():
    first, second = records(0, b"a"), records(0, b"b")
    data, rows = encode_block([(meta("t", 0, 1, 1, 1, 0, 0), first), (meta("t", 0, 2, 2, 1, 0, 0), second)])
    assert [(r.first_seq, r.position) for r in read_block_footer(data, len(data))] == [(1, 0), (2, len(first))]
    with pytest.raises(ValueError):
        encode_block([(meta("t", 0, 2, 2, 1, 0, 0), first), (meta("t", 0, 1, 1, 1, 0, 0), second)])


def test_round_trip_runs_are_contiguous_and_byte_for_byte():
    runs = sample_runs()
    data, infos = encode_block(runs)
    position = 0
    for (meta, run_bytes), info in zip(runs, infos, strict=True):
        assert (info.topic, info.partition, info.first_seq, info.last_seq) == (
            meta.topic, meta.partition, meta.first_seq, meta.last_seq,
        )  # fmt: skip
        assert (info.messages, info.min_ts_ms, info.max_ts_ms) == (meta.messages, meta.min_ts_ms, meta.max_ts_ms)
        assert (info.position, info.length_bytes) == (position, len(run_bytes))
        assert data[info.position : info.position + info.length_bytes] == run_bytes  # a range GET of the run
        position += len(run_bytes)
    decoded = decode_block(data)
    assert [info for info, _ in decoded] == infos
    assert [bytes(view) for _, view in decoded] == [run_bytes for _, run_bytes in runs]
    # A run is a valid consume chunk: whole records whose bundles decode.
    first_run = decoded[0][1]
    start, end = maybe_record(first_run, 0)
    assert decode_bundle(first_run[start:end], 100)[0].value == b"a"
    assert read_block_footer(data, len(data)) == infos


def test_the_footer_is_read_from_the_tail_alone():
    data, infos = encode_block(sample_runs())
    size = len(data)
    trailer = data[-FOOTER_TRAILER_BYTES:]  # the first GET: just the trailer
    needed = block_tail_bytes(trailer)
    assert FOOTER_TRAILER_BYTES < needed < size
    assert read_block_footer(data[-needed:], size) == infos  # the second GET: exactly the footer
    assert read_block_footer(data[-needed - 5 :], size) == infos  # a generous first guess works too
    assert block_tail_bytes(data[-needed:]) == needed
    with pytest.raises(ProtocolError, match="too short"):
        read_block_footer(data[-needed + 1 :], size)
    with pytest.raises(ProtocolError):
        read_block_footer(data[-needed:], needed - 1)  # tail longer than the object claims


async def test_the_footer_from_a_stored_object_with_two_range_gets(tmp_path):
    from tiered.tiering.objects.local_store import LocalObjectStore

    data, infos = encode_block(sample_runs())
    store = LocalObjectStore(tmp_path)
    await store.put("b.blk", data)
    size = (await store.head("b.blk")).size_bytes
    trailer = await store.get_range("b.blk", size - FOOTER_TRAILER_BYTES, size)
    needed = block_tail_bytes(trailer)
    assert read_block_footer(await store.get_range("b.blk", size - needed, size), size) == infos
    assert store.counters.get_bytes == FOOTER_TRAILER_BYTES + needed


def test_corrupt_trailers_are_refused():
    data, _ = encode_block(sample_runs())
    bad_magic = data[:-1] + b"X"
    with pytest.raises(ProtocolError, match="magic"):
        decode_block(bad_magic)
    bad_version = data[:-9] + b"\x04" + data[-8:]
    with pytest.raises(ProtocolError, match="version"):
        decode_block(bad_version)
    footer_len_at = len(data) - FOOTER_TRAILER_BYTES
    oversized = data[:footer_len_at] + struct.pack("<I", 2**32 - 1) + data[footer_len_at + 4 :]
    with pytest.raises(ProtocolError, match="exceeds"):
        decode_block(oversized)
    undersized = data[:footer_len_at] + struct.pack("<I", 3) + data[footer_len_at + 4 :]
    with pytest.raises(ProtocolError, match="too small"):
        decode_block(undersized)
    for short in (b"", MAGIC, data[-FOOTER_TRAILER_BYTES + 1 :]):
        with pytest.raises(ProtocolError, match="trailer"):
            decode_block(short)


def test_a_damaged_footer_fails_its_crc():
    data, infos = encode_block(sample_runs())
    footer_start = infos[-1].position + infos[-1].length_bytes
    for at in (footer_start, footer_start + 6, len(data) - FOOTER_TRAILER_BYTES - 1):
        damaged = bytearray(data)
        damaged[at] ^= 0x01
        with pytest.raises(ProtocolError, match="CRC") as caught:
            decode_block(bytes(damaged))
        assert caught.value.position == footer_start


def test_truncated_blocks_are_refused():
    data, _ = encode_block(sample_runs())
    for cut in (1, 8, FOOTER_TRAILER_BYTES, len(data) // 2, len(data) - 1):
        with pytest.raises(ProtocolError):
            decode_block(data[:-cut])
        with pytest.raises(ProtocolError):
            decode_block(data[cut:])  # head cut off: the footer's positions no longer add up


def test_runs_that_are_not_whole_records_are_refused():
    run = records(0, b"abc")
    footer = struct.pack("<I", 1) + footer_entry(b"t", 0, 0, 0, 0, len(run) - 1, 1, 0, 0)
    with pytest.raises(ProtocolError, match="truncated record"):
        decode_block(forge(run[:-1], footer))
    for bad_run in (b"\x80", b"\xff\x01" + b"x" * 10, b"\x03abc\x83\x80"):  # varint or bundle cut short
        footer = struct.pack("<I", 1) + footer_entry(b"t", 0, 0, 0, 0, len(bad_run), 1, 0, 0)
        with pytest.raises(ProtocolError, match="truncated record"):
            decode_block(forge(bad_run, footer))
    zero_length = b"\x00"
    footer = struct.pack("<I", 1) + footer_entry(b"t", 0, 0, 0, 0, 1, 1, 0, 0)
    with pytest.raises(ProtocolError, match="zero-length"):
        decode_block(forge(zero_length, footer))


@pytest.mark.parametrize(
    "entries, run_count, match",
    [
        ([], 0, "no runs"),
        ([(b"t", 0, 0, 0, 0, 4, 1, 0, 0)], 2, "too short for 2 runs"),
        ([(b"t", 0, 0, 0, 1, 4, 1, 0, 0)], 1, "position 1, expected 0"),
        ([(b"t", 0, 1, 1, 0, 2, 1, 0, 0), (b"t", 0, 1, 1, 2, 2, 1, 0, 0)], 2, "overlaps"),
        ([(b"t", 0, 5, 4, 0, 4, 1, 0, 0)], 1, "out of order"),
        ([(b"t", 0, 0, 0, 0, 4, 0, 0, 0)], 1, "0 messages"),
        ([(b"t", 0, 0, 1, 0, 4, 3, 0, 0)], 1, "3 messages"),
        ([(b"t", 0, 0, 0, 0, 4, 1, 9, 8)], 1, "min timestamp"),
        ([(b"t", 0, 0, 0, 0, 0, 1, 0, 0), (b"u", 0, 0, 0, 0, 4, 1, 0, 0)], 2, "empty run"),
        ([(b"t", 0, 0, 0, 0, 3, 1, 0, 0)], 1, "runs end at 3"),
        ([(b"t", 0, 0, 0, 0, 5, 1, 0, 0)], 1, "runs end at 5"),  # a run reaching into the footer
        ([(b"-t", 0, 0, 0, 0, 4, 1, 0, 0)], 1, "invalid topic"),
        ([(b"t\xff", 0, 0, 0, 0, 4, 1, 0, 0)], 1, "invalid topic"),
    ],
)
def test_footers_that_pass_the_crc_but_lie_are_refused(entries, run_count, match):
    run_bytes = RECORD4
    footer = struct.pack("<I", run_count) + b"".join(footer_entry(t, *fields) for t, *fields in entries)
    with pytest.raises(ProtocolError, match=match):
        decode_block(forge(run_bytes, footer))


def test_stray_footer_bytes_and_truncated_entries_are_refused():
    entry = footer_entry(b"t", 0, 0, 0, 0, 4, 1, 0, 0)
    with pytest.raises(ProtocolError, match="stray"):
        decode_block(forge(RECORD4, struct.pack("<I", 1) + entry + b"\x00"))
    two = struct.pack("<I", 2) + entry + b"\x28" + b"u" * 40 + b"\x00" * (RUN_ENTRY_V1.size - 1)
    with pytest.raises(ProtocolError, match="truncated entry of run 1"):
        decode_block(forge(RECORD4 + RECORD4, two))


@pytest.mark.parametrize(
    "runs, error",
    [
        ([], ValueError),
        ([(meta("t", 0, 0, 0, 1, 0, 0), records(0, b"a"))] * 2, ValueError),  # one partition's seqs twice
        ([(meta("t", 0, 5, 5, 1, 0, 0, from_seq=6), records(0, b"a"))], ValueError),  # from past first
        ([(meta("-t", 0, 0, 0, 1, 0, 0), records(0, b"a"))], ValueError),
        ([(meta("tö", 0, 0, 0, 1, 0, 0), records(0, b"a"))], ValueError),
        ([(meta("t", 65536, 0, 0, 1, 0, 0), records(0, b"a"))], ValueError),
        ([(meta("t", 0, 3, 2, 1, 0, 0), records(0, b"a"))], ValueError),
        ([(meta("t", 0, 0, 1, 3, 0, 0), records(0, b"a"))], ValueError),
        ([(meta("t", 0, 0, 0, 0, 0, 0), records(0, b"a"))], ValueError),
        ([(meta("t", 0, 0, 0, 1, 5, 4), records(0, b"a"))], ValueError),
        ([(meta("t", 0, 0, 0, 1, 0, 0), b"")], ProtocolError),
        ([(meta("t", 0, 0, 0, 1, 0, 0), records(0, b"a")[:-1])], ProtocolError),
    ],
)
def test_encode_refuses_what_it_could_not_read_back(runs, error):
    with pytest.raises(error):
        encode_block(runs)


run_metas = st.builds(
    lambda partition, first, span, messages, ts, ts_span: meta(
        "topic", partition, first, first + span, min(messages, span + 1), ts, ts + ts_span
    ),
    st.integers(0, 0xFFFF),
    st.integers(0, 2**63),
    st.integers(0, 1000),
    st.integers(1, 2000),
    st.integers(0, 2**62),
    st.integers(0, 2**20),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(run_metas, st.lists(st.binary(max_size=40), min_size=1, max_size=4)), min_size=1, max_size=6))
def test_round_trip_property(runs):
    unique = list({meta.partition: (meta, records(0, *values)) for meta, values in runs}.values())
    data, infos = encode_block(unique)
    size = len(data)
    assert read_block_footer(data[-block_tail_bytes(data[-FOOTER_TRAILER_BYTES:]) :], size) == infos
    assert [(i, bytes(v)) for i, v in decode_block(data)] == [(i, r) for i, (_, r) in zip(infos, unique, strict=True)]


def _only_protocol_errors(data: bytes) -> None:
    try:
        decoded = decode_block(data)
    except ProtocolError:
        return
    assert decoded  # whatever is accepted has runs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_raise_protocol_error_only(data):
    _only_protocol_errors(data)
    _only_protocol_errors(data + MAGIC)
    _only_protocol_errors(data + struct.pack("<IIB", min(len(data), 2**32 - 1), zlib.crc32(data), 1) + MAGIC)


_VALID, _ = encode_block(sample_runs())


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(_VALID) - 1), st.integers(1, 255), st.integers(0, len(_VALID)))
def test_damaged_valid_blocks_raise_protocol_error_only(at, xor, cut):
    damaged = bytearray(_VALID)
    damaged[at] ^= xor
    _only_protocol_errors(bytes(damaged))
    _only_protocol_errors(_VALID[:cut])
    _only_protocol_errors(_VALID[cut:])


# -- version 3: the bundle index ---------------------------------------------------------------------------------------

def big_run(first_seq: int, sizes: list[int], per_bundle: int = 1) -> tuple[RunMeta, bytes]:
    """A run of bundles of `per_bundle` messages whose values have the given sizes."""
    rng = random.Random(len(sizes))
    out, seq = [], first_seq
    for size in sizes:
        out.append(encode_record(encode_bundle([Message(rng.randbytes(size), ts_ms=seq)] * per_bundle)))
        seq += per_bundle
    return meta("t", 0, first_seq, seq - 1, seq - first_seq, first_seq, seq - 1), b"".join(out)


def test_the_index_has_an_entry_every_interval_at_bundle_boundaries():
    m, run = big_run(5, [3000 + i * 37 for i in range(200)], per_bundle=3)
    data, [row] = encode_block([(m, run)])
    [(_, index)] = read_block_indexes(data, len(data))
    starts, seq, position, longest = {}, 5, 0, 0  # bundle position -> its first seq
    while position < len(run):
        starts[position] = seq
        end = maybe_record(run, position)[1]
        position, seq, longest = end, seq + 3, max(longest, end - position)
    assert index.seqs[0] == 5 and index.positions[0] == 0
    assert len(index.seqs) > 5
    for seq, position in zip(index.seqs, index.positions):
        assert starts[position] == seq
    gaps = [b - a for a, b in zip(index.positions, index.positions[1:])]
    assert all(INDEX_EVERY_BYTES <= gap < INDEX_EVERY_BYTES + longest for gap in gaps)
    assert len(run) - index.positions[-1] < INDEX_EVERY_BYTES + longest
    assert list(zip(index.seqs[1:], index.positions[1:])) == run_index_of(run, 5)
    decode_block(data)  # every entry at a record boundary
    footer_bytes = block_tail_bytes(data[-FOOTER_TRAILER_BYTES:]) - FOOTER_TRAILER_BYTES
    assert footer_bytes < 2 + 4 + RUN_ENTRY.size + 1 + 5 * len(index.seqs)  # a few bytes an entry


def test_sparse_bundles_are_indexed_at_their_own_first_seq():
    rng = random.Random(2)
    out, seqs = [], []
    seq = 100
    for _ in range(40):
        bundle = encode_bundle([Message(rng.randbytes(5000), ts_ms=1, seq=seq), Message(b"", ts_ms=1, seq=seq + 1000)],
                               sparse=True)
        out.append(encode_record(bundle))
        seqs.append(seq)
        seq += 1000 + rng.randint(1, 2**40)  # jumps wider than 32 bits
    run = b"".join(out)
    m = meta("t", 0, 100, seqs[-1] + 1000, 80, 1, 1)
    data, _ = encode_block([(m, run)])
    [(_, index)] = read_block_indexes(data, len(data))
    assert len(index.seqs) > 2 and set(index.seqs) <= set(seqs)


@pytest.mark.parametrize("entries", [
    [(10, 0)],  # the run's start is implicit
    [(11, 5), (11, 9)],  # seqs must increase
    [(11, 9), (12, 5)],  # positions must increase
    [(9, 5)],  # below first_seq
    [(21, 5)],  # past last_seq
    [(11, 10**6)],  # past the run
])
def test_encode_refuses_bad_index_entries(entries):
    m, run = big_run(10, [10] * 11)
    with pytest.raises(ValueError):
        encode_block([(m, run)], indexes=[entries])


def test_encode_refuses_an_index_entry_inside_a_record():
    m, run = big_run(10, [10] * 11)
    first_end = maybe_record(run)[1]
    encode_block([(m, run)], indexes=[[(11, first_end)]])
    with pytest.raises(ProtocolError):
        encode_block([(m, run)], indexes=[[(11, first_end + 1)]])


def v3_forge(run_bytes: bytes, row_fields: tuple, index: bytes) -> bytes:
    footer = struct.pack("<I", 1) + b"\x01t" + RUN_ENTRY.pack(*row_fields) + index
    return forge(run_bytes, footer, version=3)


@pytest.mark.parametrize("index, error", [
    (b"", "too short"),
    (b"\x01", "do not fit"),
    (b"\x01\x01", "do not fit"),
    (b"\x02\x01\x05\x01", "do not fit"),
    (b"\x01\x00\x05", "does not follow"),  # seq delta 0
    (b"\x01\x01\x00", "does not follow"),  # position delta 0
    (b"\x01\x0b\x05", "does not follow"),  # past last_seq
    (b"\x01\x01\x8f\x01", "does not follow"),  # past the run (143 bytes)
    (b"\x01\x01\x02", "inside a record"),  # not at a boundary
    (b"\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x05", "varint"),  # over 64 bits
    (b"\x01\x01\x05\x00", "stray"),
])
def test_decode_refuses_bad_indexes(index, error):
    run = records(0, *[b"x"] * 11)  # 11 records of 13 bytes
    block = v3_forge(run, (0, 10, 10, 20, 0, len(run), 11, 0, 10, 0), index)
    with pytest.raises(ProtocolError, match=error):
        decode_block(block)


def test_decode_reads_a_hand_made_index():
    run = records(0, *[b"x"] * 11)
    one = len(run) // 11
    block = v3_forge(run, (0, 10, 10, 20, 0, len(run), 11, 0, 10, 0), b"\x02\x02" + bytes([2 * one]) + b"\x03"
                     + bytes([3 * one]))
    [(_, index)] = read_block_indexes(block, len(block))
    assert index == RunIndex((10, 12, 15), (0, 2 * one, 5 * one), len(run))


_BIG_VALID, _ = encode_block([big_run(1, [9000] * 30), big_run(500, [700] * 200)])


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(_BIG_VALID) - 1), st.integers(1, 255), st.integers(0, len(_BIG_VALID)))
def test_damaged_indexed_blocks_raise_protocol_error_only(at, xor, cut):
    damaged = bytearray(_BIG_VALID)
    damaged[at] ^= xor
    _only_protocol_errors(bytes(damaged))
    _only_protocol_errors(_BIG_VALID[:cut])
    _only_protocol_errors(_BIG_VALID[cut:])


def test_damaged_index_bytes_raise_protocol_error_only():
    """Every byte of the footer's indexes, seeded-random damage and oversized footers: ProtocolError or a valid read."""
    size = block_tail_bytes(_BIG_VALID[-FOOTER_TRAILER_BYTES:])
    rng = random.Random(14)
    footer_at = len(_BIG_VALID) - size
    for _ in range(400):
        damaged = bytearray(_BIG_VALID)
        at = rng.randrange(footer_at, len(_BIG_VALID) - FOOTER_TRAILER_BYTES)
        damaged[at] = rng.randrange(256)
        footer = bytes(damaged[footer_at : len(_BIG_VALID) - FOOTER_TRAILER_BYTES])
        _only_protocol_errors(forge(bytes(damaged[:footer_at]), footer, version=3))  # CRC made valid
        _only_protocol_errors(forge(bytes(damaged[:footer_at]), footer + rng.randbytes(rng.randint(1, 30)), version=3))


def _pieces_of(run: bytes) -> list[bytes]:
    """A run cut into its records, as the block builder holds it."""
    out, position = [], 0
    while position < len(run):
        start, end = maybe_record(run, position)
        out.append(run[position:end])
        position = end
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(run_metas, st.lists(st.binary(max_size=300), min_size=1, max_size=4)), min_size=1, max_size=6))
def test_pieces_concatenate_to_the_joined_block(runs):
    """The upload writes encode_block_pieces without joining them: the same bytes and rows as encode_block."""
    unique = list({meta.partition: (meta, records(0, *values)) for meta, values in runs}.values())
    pieces, rows = encode_block_pieces([(meta, _pieces_of(run)) for meta, run in unique])
    assert (b"".join(pieces), rows) == encode_block(unique)


def test_pieces_that_are_not_whole_records_are_refused():
    good = records(0, b"x" * 150)  # a two-byte length
    assert encode_block_pieces([(meta("t", 0, 0, 0, 1, 0, 0), [good])])[1][0].length_bytes == len(good)
    for bad in (
        b"",                              # nothing
        b"\x00",                          # a zero-length bundle
        b"\x03ab",                        # cut short
        bytes([0xC7]) + b"y" * 199,       # a first byte equal to the length - 1 but with the continuation bit
        b"\x03abc\x83",                   # a whole record, then a cut varint
        good[:-1],                        # a two-byte length, cut short
    ):  # fmt: skip
        with pytest.raises(ProtocolError):
            encode_block_pieces([(meta("t", 0, 0, 0, 1, 0, 0), [RECORD4, bad])])
    with pytest.raises(ProtocolError, match="no records"):
        encode_block_pieces([(meta("t", 0, 0, 0, 1, 0, 0), [])])
    two_in_one = RECORD4 + RECORD4  # a piece may hold several whole records
    assert encode_block_pieces([(meta("t", 0, 0, 1, 2, 0, 0), [two_in_one])])[1][0].length_bytes == 8


def test_pieces_with_a_bundle_index_match_the_joined_block_and_check_its_boundaries():
    run = records(0, *(random.Random(i).randbytes(10_000) for i in range(20)))  # 200 KB: entries every 64 KiB
    pieces = _pieces_of(run)
    run_meta = meta("t", 0, 1, 20, 20, 0, 19)
    entries = run_index_of(run, 1)
    assert entries
    assert b"".join(encode_block_pieces([(run_meta, pieces)], [entries])[0]) == encode_block([(run_meta, run)])[0]
    seq, position = entries[0]
    with pytest.raises(ProtocolError, match="inside a record"):
        encode_block_pieces([(run_meta, pieces)], [[(seq, position + 1)]])
    with pytest.raises(ProtocolError, match="inside a record"):  # a multi-record piece goes through _check_records
        encode_block_pieces([(run_meta, [run])], [[(seq, position + 1)]])
