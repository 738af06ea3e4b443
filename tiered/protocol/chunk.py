"""Reading a consume chunk as TANK's client does (docs/protocol.md §9, `process_consume`).

A chunk is `{bundle_len:varint, bundle}` repeated; its first non-sparse bundle starts at the response's base seq,
later non-sparse bundles continue from the previous bundle's last seq + 1, sparse bundles carry their own range.
The last bundle may be partial: an uncompressed one yields its whole messages, a compressed one yields nothing and
asks for a fetch size that covers it. Messages below the requested seq are dropped; reading stops above hwmark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tiered.protocol.buffers import BytesLike
from tiered.protocol.bundle import (
    CODEC_NONE,
    Message,
    bundle_seq_range,
    decode_message_set,
    message_set,
    read_bundle_header,
)
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


def read_chunk(chunk: BytesLike, base_seq: int | None, requested_seq: int, hwmark: int) -> ChunkRead:
    """Messages of a chunk from `requested_seq` up to `hwmark`. `base_seq` is None when the first bundle is sparse."""
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
