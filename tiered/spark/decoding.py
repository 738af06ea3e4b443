"""Replay decoding: the bytes of a segment range or a block run in, messages and Arrow record batches out. Pure.

The bytes are whole `{varint bundle_len, bundle}` records (PROTOCOL.md §4, §7), decoded by tiered.protocol.bundle,
the broker's own code: plain and snappy message sets, sparse bundles. A non-sparse bundle's messages continue from
the seq after the previous bundle's last (the first record's seq is known from the catalog or the index); a sparse
bundle carries its own first and last seq. Bundles wholly outside the wanted seqs are skipped from their header,
without decompressing them; the messages kept are exactly those inside the seq and time ranges.

Columns (SCHEMA) follow Spark's Kafka source where they mean the same thing: topic, partition, seq, timestamp (a Spark
timestamp: microseconds, UTC), key, value. A timestamp too large for a microsecond int64 (after year 294,000; only a
producer's garbage looks like that) is null rather than wrapped around, and inside no time range.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

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
) -> Iterator[pa.RecordBatch]:
    """Whole records `data` as record batches, keeping exactly the messages inside `seqs` and `times`."""
    return record_batches(iter_messages(data, first_seq, seqs, times), topic, partition, batch_rows)
