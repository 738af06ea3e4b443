"""Reading a consume chunk as TANK's client does (docs/protocol.md §9, `process_consume`).

A chunk is `{bundle_len:varint, bundle}` repeated; its first non-sparse bundle starts at the response's base seq,
later non-sparse bundles continue from the previous bundle's last seq + 1, sparse bundles carry their own range.
The last bundle may be partial: an uncompressed one yields its whole messages, a compressed one yields nothing and
asks for a fetch size that covers it. Messages below the requested seq are dropped; reading stops above hwmark.

`scan_chunk` reads a chunk as read_chunk does, every message checked the same way, but answers only what a bulk
reader needs (how many messages, their first and last seq, their value bytes, whether the seqs ascend), without a
Message per message.

`record_messages` reads one whole stored record as `decode_bundle` does, through the native read_chunk: the decoding
of a compaction pass, which reads every record of its range twice.

`read_chunk` and `scan_chunk` run natively (`_bundlescan.read_chunk`, built by `pip install`) when the extension is there: about
ten times less CPU per message, which is most of what a consumer spends. `_read_chunk_py` is its pure-Python
reference and fallback (and reads the rare chunk whose seqs pass 64 bits), `_scan_chunk_py` is built on it; the
tests hold each pair to the same results and the same errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from tiered.protocol.buffers import BytesLike
from tiered.protocol.bundle import (
    CODEC_NONE,
    Message,
    bundle_seq_range,
    decode_bundle,
    decode_message_set,
    maybe_record,
    message_set,
    read_bundle_header,
)
from tiered.protocol.codes import UINT64_MAX
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import maybe_varint

# TANK's client asks for this much past the start of a bundle it could not read whole.
PARTIAL_SLACK_BYTES = 256
INITIAL_NEED_BYTES = 1024


@dataclass
class ChunkRead:
    messages: list[Message] = field(default_factory=list)
    next_seq: int = 0  # the seq to ask for next (last message read + 1), 0 when nothing was read
    need_bytes: int = 0  # when non-zero: the fetch size the next request needs to make progress
    first_seq: int = 0  # the first seq of the chunk's first bundle


class ChunkSummary(NamedTuple):
    """What read_chunk would return, without the messages."""

    messages: int  # how many messages read_chunk would return
    first: int  # the first one's seq (0 when there are none)
    last: int  # the last one's seq (0 when there are none)
    value_bytes: int  # their values' bytes, summed
    ascending: bool  # each seq above the one before it: with last - first + 1 == messages, every seq once, in order
    next_seq: int  # as ChunkRead
    need_bytes: int
    first_seq: int


def scan_chunk(chunk: BytesLike, base_seq: int | None, requested_seq: int, hwmark: int) -> ChunkSummary:
    """read_chunk's reading of a chunk (every message read and checked, the same ProtocolError), summed up."""
    if _native_scan is not None:
        got = _native_scan(chunk, base_seq, requested_seq, hwmark)
        if got is not None:
            first_seq, need_bytes, count, first, last, value_bytes, ascending = got
            return ChunkSummary(count, first, last, value_bytes, ascending, last + 1 if count else 0, need_bytes,
                                first_seq)
    return _scan_chunk_py(chunk, base_seq, requested_seq, hwmark)


def _scan_chunk_py(chunk: BytesLike, base_seq: int | None, requested_seq: int, hwmark: int) -> ChunkSummary:
    """The reference of scan_chunk: read_chunk's reference, summed up."""
    read = _read_chunk_py(chunk, base_seq, requested_seq, hwmark)
    seqs = [m.seq for m in read.messages]
    return ChunkSummary(len(seqs), seqs[0] if seqs else 0, seqs[-1] if seqs else 0,
                        sum(len(m.value) for m in read.messages), all(a < b for a, b in zip(seqs, seqs[1:])),
                        read.next_seq, read.need_bytes, read.first_seq)


def read_chunk(chunk: BytesLike, base_seq: int | None, requested_seq: int, hwmark: int) -> ChunkRead:
    """Messages of a chunk from `requested_seq` up to `hwmark`. `base_seq` is None when the first bundle is sparse.
    Raises ProtocolError for a chunk that does not read."""
    if _native_read is not None:
        got = _native_read(chunk, base_seq, requested_seq, hwmark)
        if got is not None:
            messages, first_seq, need_bytes = got
            return ChunkRead(messages, messages[-1].seq + 1 if messages else 0, need_bytes, first_seq)
    return _read_chunk_py(chunk, base_seq, requested_seq, hwmark)


def record_messages(record: BytesLike, first_seq: int) -> list[Message]:
    """Every message of one whole stored record (`{bundle_len varint, bundle}`, nothing after it) whose bundle, if
    not sparse, starts at `first_seq`: `decode_bundle`'s messages and ProtocolError. Natively, it is read_chunk of a
    chunk of that one record with nothing dropped (requested seq 0, hwmark the last u64), which walks the bundle as
    decode_bundle does (not strict, the same header, snappy and message checks and texts). A record that is not
    exactly one whole record, or whose seqs pass 64 bits, is read by decode_bundle itself."""
    got = maybe_record(record)
    if got is None:
        raise ProtocolError("record is cut short")
    start, end = got
    if _native_read is not None and end == len(record):
        read = _native_read(record, first_seq, 0, UINT64_MAX)
        if read is not None:
            return read[0]
    return decode_bundle(record[start:end], first_seq)


def _read_chunk_py(chunk: BytesLike, base_seq: int | None, requested_seq: int, hwmark: int) -> ChunkRead:
    """The reference of read_chunk, and its fallback when the extension is not built."""
    out = ChunkRead()
    position = 0
    end = len(chunk)
    next_seq = base_seq or 0
    while position < end:
        got = maybe_varint(chunk, position)
        if got is None:
            out.need_bytes = max(out.need_bytes, end - position + INITIAL_NEED_BYTES)
            break
        size, start = got
        if size == 0:
            raise ProtocolError("zero-length bundle in chunk", position)
        stop = start + size
        bundle = chunk[start:min(stop, end)]
        header = read_bundle_header(bundle)
        if not header.sparse and base_seq is None and next_seq == 0:
            raise ProtocolError("a non-sparse bundle with no base seq to start from", position)
        first, last = bundle_seq_range(header, next_seq)
        next_seq = last + 1
        out.first_seq = out.first_seq or first
        if first > hwmark:
            break
        if stop <= end:
            if last >= requested_seq:
                _keep(out, decode_message_set(message_set(bundle, header), header, first), requested_seq, hwmark)
        elif header.codec == CODEC_NONE:
            # A partial uncompressed bundle: whole messages are usable; ask for enough to finish it.
            messages = decode_message_set(bytes(bundle[header.header_len:]), header, first, partial=True)
            _keep(out, messages, requested_seq, hwmark)
            out.need_bytes = stop - position + PARTIAL_SLACK_BYTES
        else:
            out.need_bytes = stop - position
        position = stop
    if out.messages:
        out.next_seq = out.messages[-1].seq + 1
    return out


def _keep(out: ChunkRead, messages: list[Message], requested_seq: int, hwmark: int) -> None:
    for m in messages:
        if m.seq < requested_seq:
            continue
        if m.seq > hwmark:
            break
        out.messages.append(m)


_native_read: Callable[[BytesLike, int | None, int, int], tuple[list[Message], int, int] | None] | None
_native_scan: Callable[[BytesLike, int | None, int, int], tuple[int, int, int, int, int, int, bool] | None] | None
try:
    from tiered.protocol import _bundlescan
except ImportError:  # the extension is not built: the references do the work
    _native_read = _native_scan = None
else:
    _bundlescan.register_message(Message)
    _native_read = _bundlescan.read_chunk
    _native_scan = _bundlescan.scan_chunk
