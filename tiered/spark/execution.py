"""Reading one split: range GETs of its pieces, decoded into messages or Arrow record batches.

What a Spark task runs (and `tiered replay`, split after split). A piece becomes one or more range GETs: a segment
range longer than 2 x PART_BYTES is cut at its index entries into parts of about PART_BYTES (planning.
cut_segment_range), each whole records whose first seq the index names, so a task decodes the first part while the
next ones are in flight, and holds a few parts rather than a whole window. A segment piece fetches its `.index`
only when it needs one to skip records (planning.SegmentPiece.needs_index) or to cut the range into parts. GETs run
ahead of decoding, in order, up to GET_THREADS at a time and READ_AHEAD_BYTES fetched but not yet decoded (at
least one GET is always in flight), so messages come out in seq order and a task's memory stays bounded whatever
the split size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from tiered.protocol.bundle import Message
from tiered.spark.decoding import DEFAULT_BATCH_ROWS, PieceBytes, decode_pieces, iter_messages
from tiered.spark.objects import RangeReader
from tiered.spark.planning import (
    Piece,
    RunPiece,
    SeqRange,
    Split,
    TimeRange,
    cut_segment_range,
    load_segment_index,
    resolve_segment_range,
)
from tiered.tiering.objects.store import StoreError

PART_BYTES = 8 << 20  # one range GET of a long segment range
READ_AHEAD_BYTES = 32 << 20  # GETs in flight or fetched ahead of decoding, per task
GET_THREADS = 4


@dataclass(frozen=True, slots=True)
class RangeGet:
    """One range GET: bytes [start, end) of an object, whole records, the first holding seq `first_seq`."""

    object_key: str
    start: int
    end: int
    first_seq: int
    seqs: SeqRange  # the seqs to keep

    @property
    def size(self) -> int:
        return self.end - self.start


def piece_gets(reader: RangeReader, piece: Piece, part_bytes: int = PART_BYTES) -> list[RangeGet]:
    """The range GETs that read one piece, in order (none when a segment window holds no record to read)."""
    seqs = SeqRange(piece.min_seq, piece.max_seq)
    if isinstance(piece, RunPiece):
        return [RangeGet(piece.object_key, piece.position, piece.position + piece.length_bytes, piece.first_seq, seqs)]
    index = None
    if piece.needs_index or piece.planned_bytes > 2 * part_bytes:
        index = load_segment_index(reader.get(piece.index_object_key), piece)
    found = resolve_segment_range(piece, index)
    if found is None:
        return []
    return [RangeGet(piece.object_key, part.start, part.end, part.first_seq, seqs)
            for part in cut_segment_range(found, index, piece.base_seq, part_bytes)]


def fetch(reader: RangeReader, get: RangeGet) -> PieceBytes:
    data = reader.get_range(get.object_key, get.start, get.end)
    if len(data) != get.size:
        raise StoreError(f"{get.object_key}: read {len(data)} bytes at {get.start}, the catalog says {get.size}")
    return PieceBytes(data, get.first_seq, get.seqs)


def iter_pieces(
    reader: RangeReader, split: Split, read_ahead: int = READ_AHEAD_BYTES, part_bytes: int = PART_BYTES
) -> Iterator[PieceBytes]:
    """The bytes of the split's range GETs in order, fetched ahead of the caller as the module docstring says."""
    gets = (get for piece in split.pieces for get in piece_gets(reader, piece, part_bytes))
    with ThreadPoolExecutor(max_workers=GET_THREADS, thread_name_prefix="tiered-replay-get") as pool:
        pending: deque[tuple[int, Future]] = deque()
        ahead = 0  # bytes of the pending GETs
        try:
            while True:
                while not pending or (len(pending) < GET_THREADS and ahead < read_ahead):
                    get = next(gets, None)
                    if get is None:
                        break
                    pending.append((get.size, pool.submit(fetch, reader, get)))
                    ahead += get.size
                if not pending:
                    return
                size, future = pending.popleft()
                got = future.result()
                ahead -= size
                yield got
        finally:
            for _, future in pending:
                future.cancel()


def split_messages(reader: RangeReader, split: Split, times: TimeRange = TimeRange()) -> Iterator[Message]:
    """Exactly the split's messages inside its seq windows and `times`, in seq order."""
    for got in iter_pieces(reader, split):
        yield from iter_messages(got.data, got.first_seq, got.seqs, times)


def split_batches(
    reader: RangeReader, split: Split, times: TimeRange = TimeRange(), batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    return decode_pieces(iter_pieces(reader, split), split.topic, split.partition, times, batch_rows)
