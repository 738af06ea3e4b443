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
from tiered.tiering.block_format import (
    FOOTER_TRAILER_BYTES,
    MAGIC,
    RUN_ENTRY_V1,
    block_tail_bytes,
    decode_block,
    encode_block,
    encode_block_pieces,
    read_block_footer,
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
    run = records(1700000000000, b"hello")
    data, rows = encode_block([(meta("t", 1, 10, 10, 1, 1700000000000, 1700000000000, from_seq=7, epoch=4), run)])
    footer = (
        struct.pack("<I", 1)  # run_count
        + b"\x01t"  # topic str8
        + struct.pack("<HQQQQQIQQQ", 1, 7, 10, 10, 0, len(run), 1, 1700000000000, 1700000000000, 4)
    )
    assert data == run + footer + struct.pack("<II", len(footer), zlib.crc32(footer)) + b"\x02" + b"TIEREDB1"
    assert FOOTER_TRAILER_BYTES == 17
    assert rows == [RunRow("t", 1, 7, 10, 10, 1, 1700000000000, 1700000000000, 4, 0, len(run))]


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
    from tiered.tiering.local_store import LocalObjectStore

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
    bad_version = data[:-9] + b"\x03" + data[-8:]
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
