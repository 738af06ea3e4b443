"""Replay decoding: records to messages and Arrow batches, exactly filtered, with the broker's bundle code."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, Message, encode_bundle, encode_record
from tiered.protocol.errors import ProtocolError
from tiered.spark.decoding import SCHEMA, decode_records, iter_messages, record_batches
from tiered.spark.planning import SeqRange, TimeRange

T = 1_700_000_000_000


def records() -> tuple[bytes, list[Message]]:
    """Plain seqs 10..12, a snappy bundle 13..612, a sparse bundle 700/705/706, then plain 707..708."""
    plain = [Message(b"a", None, T, 10), Message(b"b", b"key", T + 5, 11), Message(b"c", b"", T + 1, 12)]
    snappy = [Message(b"z%d" % i * 10, b"k%d" % (i % 7) if i % 2 else None, T + 100 + i % 50, 13 + i)
              for i in range(600)]
    sparse = [Message(b"s1", None, T + 900, 700), Message(b"s2", b"q", T + 901, 705), Message(b"s3", None, T + 2, 706)]
    tail = [Message(b"t1", None, T + 950, 707), Message(b"t2", None, T + 951, 708)]
    data = b"".join(
        encode_record(b)
        for b in (
            encode_bundle(plain, codec=CODEC_NONE),
            encode_bundle(snappy, codec=CODEC_SNAPPY),
            encode_bundle(sparse, codec=CODEC_NONE, sparse=True),
            encode_bundle(tail, codec=CODEC_NONE),
        )
    )
    return data, plain + snappy + sparse + tail


def test_every_message_with_its_seq_plain_snappy_and_sparse():
    data, expected = records()
    assert list(iter_messages(data, 10)) == expected


def test_seq_range_keeps_exactly_the_messages_inside_it():
    data, expected = records()
    for first, last in ((11, 11), (12, 14), (600, 705), (706, 800), (613, 699), (1, 9)):
        got = list(iter_messages(data, 10, SeqRange(first, last)))
        assert got == [m for m in expected if first <= m.seq <= last]


def test_time_range_is_start_inclusive_end_exclusive_in_microseconds():
    data, expected = records()
    times = TimeRange((T + 1) * 1000, (T + 100) * 1000)
    assert list(iter_messages(data, 10, times=times)) == [m for m in expected if T + 1 <= m.ts_ms < T + 100]
    assert [m.seq for m in iter_messages(data, 10, times=TimeRange((T + 5) * 1000, (T + 5) * 1000 + 1))] == [11]


def test_bundles_outside_the_seq_range_are_not_decompressed():
    """A corrupt snappy body is never read when its bundle lies wholly outside the wanted seqs."""
    good = encode_bundle([Message(b"x", None, T, 1)], codec=CODEC_NONE)
    bad = bytearray(encode_bundle([Message(b"y" * 100, None, T, 2)] * 600, codec=CODEC_SNAPPY))
    bad[-20:] = b"\xff" * 20
    data = encode_record(good) + encode_record(bytes(bad)) + encode_record(good)
    assert [m.seq for m in iter_messages(data, 1, SeqRange(1, 1))] == [1]
    assert [m.seq for m in iter_messages(data, 1, SeqRange(602, 602))] == [602]
    with pytest.raises(ProtocolError):
        list(iter_messages(data, 1, SeqRange(2, 2)))


def test_truncated_or_damaged_records_raise_protocol_error():
    data, _ = records()
    with pytest.raises(ProtocolError, match="truncated record"):
        list(iter_messages(data[:-3], 10))
    with pytest.raises(ProtocolError):
        list(iter_messages(b"\x05\x80\x00\x00\x00\x00", 10))
    backwards = encode_record(encode_bundle([Message(b"a", None, T, 50)], sparse=True))
    with pytest.raises(ProtocolError, match="go back"):
        list(iter_messages(encode_record(encode_bundle([Message(b"a")] * 3)) + backwards, 49))


def test_record_batches_have_the_schema_and_split_at_batch_rows():
    data, expected = records()
    batches = list(decode_records(data, 10, "events", 3, batch_rows=250))
    assert [b.num_rows for b in batches] == [250, 250, 108]
    table = pa.Table.from_batches(batches)
    assert table.schema == SCHEMA
    assert table.column("topic").to_pylist() == ["events"] * len(expected)
    assert table.column("partition").to_pylist() == [3] * len(expected)
    assert table.column("seq").to_pylist() == [m.seq for m in expected]
    assert table.column("key").to_pylist() == [m.key for m in expected]
    assert table.column("value").to_pylist() == [m.value for m in expected]
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert micros == [m.ts_ms * 1000 for m in expected]


def test_a_timestamp_beyond_spark_range_is_null_and_in_no_time_range():
    huge = (1 << 64) - 1
    messages = [Message(b"a", None, huge, 1), Message(b"b", None, 5, 2)]
    data = encode_record(encode_bundle(messages))
    (batch,) = list(record_batches(iter_messages(data, 1), "t", 0))
    assert batch.column(3).to_pylist()[0] is None
    assert [m.seq for m in iter_messages(data, 1, times=TimeRange(0, None))] == [1, 2]  # unbounded: no filter
    assert [m.seq for m in iter_messages(data, 1, times=TimeRange(1, None))] == [2]


def test_no_messages_make_no_batches():
    assert list(record_batches([], "t", 0)) == []
    with pytest.raises(ValueError):
        list(record_batches([Message(b"a")], "t", 0, batch_rows=0))
