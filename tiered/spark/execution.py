"""Reading one split: range GETs of its pieces, decoded into messages or Arrow record batches.

What a Spark task runs (and `tiered replay`, split after split). The GETs of a split's pieces run a few at a time
ahead of decoding (a run split may hold hundreds of small runs, each one GET), in piece order, so messages come out
in seq order. A segment piece fetches its `.index` first only when it needs one (planning.SegmentPiece.needs_index).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

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
    load_segment_index,
    resolve_segment_range,
)
from tiered.tiering.store import StoreError

PREFETCH_PIECES = 4


def fetch_piece(reader: RangeReader, piece: Piece) -> PieceBytes | None:
    """The bytes of one piece (None when a segment window holds no record to read)."""
    seqs = SeqRange(piece.min_seq, piece.max_seq)
    if isinstance(piece, RunPiece):
        data = _exact_range(reader, piece.object_key, piece.position, piece.position + piece.length_bytes)
        return PieceBytes(data, piece.first_seq, seqs)
    index = load_segment_index(reader.get(piece.index_object_key), piece) if piece.needs_index else None
    found = resolve_segment_range(piece, index)
    if found is None:
        return None
    return PieceBytes(_exact_range(reader, piece.object_key, found.start, found.end), found.first_seq, seqs)


def _exact_range(reader: RangeReader, object_key: str, start: int, end: int) -> bytes:
    data = reader.get_range(object_key, start, end)
    if len(data) != end - start:
        raise StoreError(f"{object_key}: read {len(data)} bytes at {start}, the catalog says {end - start}")
    return data


def iter_pieces(reader: RangeReader, split: Split, prefetch: int = PREFETCH_PIECES) -> Iterator[PieceBytes]:
    """The split's pieces in order, fetched up to `prefetch` at a time."""
    if prefetch <= 1 or len(split.pieces) == 1:
        for piece in split.pieces:
            got = fetch_piece(reader, piece)
            if got is not None:
                yield got
        return
    with ThreadPoolExecutor(max_workers=prefetch, thread_name_prefix="tiered-replay-get") as pool:
        pending: deque[Future] = deque()
        pieces = iter(split.pieces)
        try:
            for piece in pieces:
                pending.append(pool.submit(fetch_piece, reader, piece))
                if len(pending) >= prefetch:
                    break
            while pending:
                got = pending.popleft().result()
                for piece in pieces:
                    pending.append(pool.submit(fetch_piece, reader, piece))
                    break
                if got is not None:
                    yield got
        finally:
            for future in pending:
                future.cancel()


def split_messages(reader: RangeReader, split: Split, times: TimeRange = TimeRange()) -> Iterator[Message]:
    """Exactly the split's messages inside its seq windows and `times`, in seq order."""
    for got in iter_pieces(reader, split):
        yield from iter_messages(got.data, got.first_seq, got.seqs, times)


def split_batches(
    reader: RangeReader, split: Split, times: TimeRange = TimeRange(), batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    return decode_pieces(iter_pieces(reader, split), split.topic, split.partition, times, batch_rows)
