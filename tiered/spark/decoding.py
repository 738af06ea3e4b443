"""Replay decoding: the bytes of a segment range or a block run in, messages and Arrow record batches out. Pure.

The bytes are whole `{varint bundle_len, bundle}` records (docs/protocol.md §4, §7), decoded by tiered.protocol.bundle,
the broker's own code: plain and snappy message sets, sparse bundles. A non-sparse bundle's messages continue from
the seq after the previous bundle's last (the first record's seq is known from the catalog or the index); a sparse
bundle carries its own first and last seq. Bundles wholly outside the wanted seqs are skipped from their header,
without decompressing them; the messages kept are exactly those inside the seq and time ranges.

Columns (SCHEMA) follow Spark's Kafka source where they mean the same thing: topic, partition, seq, timestamp (a Spark
timestamp: microseconds, UTC), key, value. A timestamp too large for a microsecond int64 (after year 294,000; only a
producer's garbage looks like that) is null rather than wrapped around, and inside no time range. A kept seq past
the int64 seq column (a sparse bundle may name seqs up to 2^64 - 1) is a ProtocolError.

Two decoders produce the same batches. The pure one here (iter_messages, record_batches) is the reference and the
fallback: a Python step per message. The native one (tiered/spark/_decode.c, built by `pip install` when a C
compiler is there) walks the records and builds the seq, timestamp, key and value buffers in C, a batch at a time,
and pyarrow wraps those buffers without copying. The environment variable TIERED_SPARK_DECODER picks one: `native`
(fail if it is not built), `python`, or `auto` (the default: native when built).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType

import pyarrow as pa

from tiered.protocol.bundle import (
    Message,
    bundle_seq_range,
    decode_message_set,
    maybe_record,
    message_set,
    read_bundle_header,
)
from tiered.protocol.errors import ProtocolError
from tiered.spark.planning import MAX_TIMESTAMP_MS, SeqRange, TimeRange

# Every field nullable, as Spark's DDL columns are (Spark compares the two exactly); only key and timestamp ever
# hold nulls.
SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("seq", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
    ]
)
# The same columns as a Spark DDL string (DataSource.schema()).
SCHEMA_DDL = "topic string, partition int, seq long, timestamp timestamp, key binary, value binary"
DEFAULT_BATCH_ROWS = 8192
INT64_MAX = (1 << 63) - 1
U128_MAX = (1 << 128) - 1
DECODER_ENV = "TIERED_SPARK_DECODER"
DECODERS = ("auto", "native", "python")

try:
    from tiered.spark import _decode as native_decode
except ImportError:  # built without a C compiler: the pure path decodes
    native_decode = None


@dataclass(frozen=True, slots=True)
class PieceBytes:
    """The bytes of one range GET of a split: whole records, the seq of the first, and the seqs to keep."""

    data: bytes
    first_seq: int
    seqs: SeqRange


def iter_messages(
    data, first_seq: int, seqs: SeqRange = SeqRange(), times: TimeRange = TimeRange()
) -> Iterator[Message]:
    """The messages of whole records `data` (the first holding seq `first_seq`) inside `seqs` and `times`, in order.

    Raises ProtocolError on bytes that are not whole, valid records.
    """
    view = memoryview(data)
    position, next_seq, end = 0, first_seq, len(view)
    check_time = not times.unbounded
    while position < end:
        got = maybe_record(view, position)
        if got is None:
            raise ProtocolError("truncated record", position)
        bundle_start, bundle_end = got
        bundle = view[bundle_start:bundle_end]
        header = read_bundle_header(bundle)
        first, last = bundle_seq_range(header, next_seq)
        if first < next_seq and position:
            raise ProtocolError(f"bundle seqs {first}..{last} go back below {next_seq}", position)
        next_seq = last + 1
        position = bundle_end
        if last < seqs.first:
            continue
        if first > seqs.last:
            return  # records are in seq order: nothing further is wanted
        for message in decode_message_set(message_set(bundle, header), header, first):
            if seqs.first <= message.seq <= seqs.last and (not check_time or times.contains_ms(message.ts_ms)):
                yield message


def record_batches(
    messages: Iterable[Message], topic: str, partition: int, batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """`messages` as record batches of SCHEMA, at most `batch_rows` rows each; no empty batch."""
    if batch_rows < 1:
        raise ValueError("batch_rows must be at least 1")
    seqs: list[int] = []
    stamps: list[int | None] = []
    keys: list[bytes | None] = []
    values: list[bytes] = []
    for m in messages:
        if m.seq > INT64_MAX:
            raise ProtocolError(f"seq {m.seq} exceeds the int64 seq column")
        seqs.append(m.seq)
        stamps.append(m.ts_ms * 1000 if m.ts_ms <= MAX_TIMESTAMP_MS else None)
        keys.append(m.key)
        values.append(m.value)
        if len(seqs) >= batch_rows:
            yield _batch(topic, partition, seqs, stamps, keys, values)
            seqs, stamps, keys, values = [], [], [], []
    if seqs:
        yield _batch(topic, partition, seqs, stamps, keys, values)


def _batch(topic: str, partition: int, seqs, stamps, keys, values) -> pa.RecordBatch:
    rows = len(seqs)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * rows, pa.string()),
            pa.array([partition] * rows, pa.int32()),
            pa.array(seqs, pa.int64()),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
        ],
        schema=SCHEMA,
    )


def decode_records(
    data,
    first_seq: int,
    topic: str,
    partition: int,
    seqs: SeqRange = SeqRange(),
    times: TimeRange = TimeRange(),
    batch_rows: int = DEFAULT_BATCH_ROWS,
    decoder: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Whole records `data` as record batches, keeping exactly the messages inside `seqs` and `times`."""
    return decode_pieces([PieceBytes(data, first_seq, seqs)], topic, partition, times, batch_rows, decoder)


def decode_pieces(
    pieces: Iterable[PieceBytes],
    topic: str,
    partition: int,
    times: TimeRange = TimeRange(),
    batch_rows: int = DEFAULT_BATCH_ROWS,
    decoder: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """The pieces' wanted messages as record batches of `batch_rows` rows (the last one fewer); a batch spans pieces.

    `decoder`: one of DECODERS, None for TIERED_SPARK_DECODER (else auto).
    """
    native = native_module(decoder)
    if native is None:
        messages = (m for p in pieces for m in iter_messages(p.data, p.first_seq, p.seqs, times))
        return record_batches(messages, topic, partition, batch_rows)
    return _native_batches(native, pieces, topic, partition, times, batch_rows)


def native_module(decoder: str | None = None) -> ModuleType | None:
    """The native decoder module for `decoder` (see decode_pieces), or None for the pure path."""
    name = (decoder or os.environ.get(DECODER_ENV) or "auto").strip().lower()
    if name not in DECODERS:
        raise ValueError(f"{DECODER_ENV} must be one of {', '.join(DECODERS)}, not {name!r}")
    if name == "native" and native_decode is None:
        raise RuntimeError("the native Spark decoder (tiered.spark._decode) is not built: reinstall with a C compiler")
    return None if name == "python" else native_decode


def _native_batches(
    native: ModuleType, pieces: Iterable[PieceBytes], topic: str, partition: int, times: TimeRange, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    if batch_rows < 1:
        raise ValueError("batch_rows must be at least 1")
    # The decoder keeps seqs in [seq_first, seq_end) and takes no time filter when start_us is None. Clamping keeps
    # the meaning: seqs are never negative, and no timestamp reaches the int64 ends.
    if times.unbounded:
        start_us = end_us = None
    else:
        start_us = _clamp(times.start_us, -INT64_MAX - 1, INT64_MAX)
        end_us = None if times.end_us is None else _clamp(times.end_us, -INT64_MAX - 1, INT64_MAX)
    builder = native.Builder()
    for piece in pieces:
        seq_first = _clamp(piece.seqs.first, 0, U128_MAX)
        seq_end = _clamp(piece.seqs.last + 1, 0, U128_MAX)
        decoder = native.Decoder(piece.data, piece.first_seq, seq_first, seq_end, start_us, end_us)
        while decoder.fill(builder, batch_rows):
            yield _native_batch(builder.take(), topic, partition)
    if builder.rows:
        yield _native_batch(builder.take(), topic, partition)


def _clamp(value: int, low: int, high: int) -> int:
    return low if value < low else high if value > high else value


def _native_batch(parts: tuple, topic: str, partition: int) -> pa.RecordBatch:
    """A record batch around the buffers of Builder.take(), without copying them."""
    rows, seqs, stamps, stamp_valid, stamp_nulls, key_offsets, keys, key_valid, key_nulls, offsets, values = parts
    buffer = pa.py_buffer
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), rows),
            pa.repeat(pa.scalar(partition, pa.int32()), rows),
            pa.Array.from_buffers(pa.int64(), rows, [None, buffer(seqs)], null_count=0),
            pa.Array.from_buffers(
                SCHEMA.field("timestamp").type, rows,
                [None if stamp_valid is None else buffer(stamp_valid), buffer(stamps)], null_count=stamp_nulls,
            ),
            pa.Array.from_buffers(
                pa.binary(), rows, [None if key_valid is None else buffer(key_valid), buffer(key_offsets), buffer(keys)],
                null_count=key_nulls,
            ),
            pa.Array.from_buffers(pa.binary(), rows, [None, buffer(offsets), buffer(values)], null_count=0),
        ],
        schema=SCHEMA,
    )  # fmt: skip
