"""Bundles: TANK's batches of messages, identical on the wire and on disk (docs/protocol.md §4).

Bundle layout:

    flags          u8       bits 0-1 codec (0 none, 1 snappy), bits 2-5 message count if 1..15,
                            bit 6 SPARSE, bit 7 reserved (never set)
    [msg_count     varint]  iff the count bits are 0
    [first_seq     u64]     iff SPARSE
    [last-first-1  varint]  iff SPARSE and msg_count != 1
    message set             the rest; raw-snappy compressed as a whole iff codec == 1

Message layout (inside the possibly decompressed message set):

    flags          u8       HAVE_KEY 1, USE_LAST_TS 2, SEQ_PREV_PLUS_ONE 4
    [seq delta     varint]  iff SPARSE, not first, not last, and not SEQ_PREV_PLUS_ONE: seq = prev + delta + 1
    [ts            u64]     iff not USE_LAST_TS; milliseconds since the epoch
    [key_len u8, key]       iff HAVE_KEY
    content_len    varint
    content

A non-sparse bundle's messages take consecutive seqs from the seq the reader already knows (the chunk's base, or
the previous bundle's end). Sparse bundles carry their own first and last seq. Encoders never set
SEQ_PREV_PLUS_ONE on the first or last message, because TANK's client and broker disagree on its precedence there.

Readers of stored bundles (`decode_bundle`, `decode_message_set`, `bundle_facts`, `timestamp_bounds`) follow TANK's
broker where TANK is lenient. `validate_bundle` is the gate a produced bundle passes before anything of its request
is appended: it reads the whole bundle as the decoders do and also refuses what TANK's readers would read
differently (SEQ_PREV_PLUS_ONE on a sparse bundle's first or last message), so that every bundle in a log decodes,
with one meaning, for every reader. Both run natively (`_bundlescan.c`, built by `pip install`) when the extension
is there; `_validate_bundle_py` is their pure-Python reference and fallback, and the tests hold the two to the same
results and the same errors.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import snappy

from tiered.protocol.buffers import BytesLike
from tiered.protocol.codes import UINT64_MAX
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import encode_varint, maybe_varint, read_varint

CODEC_NONE = 0
CODEC_SNAPPY = 1
CODEC_MASK = 0x03
COUNT_SHIFT = 2
COUNT_MASK = 0x0F
FLAG_SPARSE = 0x40
FLAG_RESERVED = 0x80

HAVE_KEY = 0x01
USE_LAST_TS = 0x02
SEQ_PREV_PLUS_ONE = 0x04
MESSAGE_FLAGS_KNOWN = HAVE_KEY | USE_LAST_TS | SEQ_PREV_PLUS_ONE

# TANK's client compresses a bundle with snappy when it has more than this many messages ...
SNAPPY_MIN_MESSAGES = 512
# ... or when the running sum of key and content bytes exceeds this many bytes.
SNAPPY_MIN_BYTES = 1024
# A decompressed message set larger than this is refused rather than allocated (frames are capped at 256 MiB).
MAX_MESSAGE_SET_BYTES = 512 * 1024 * 1024
# No snappy element yields more than 64 bytes from fewer than 3 (a 2-byte-offset copy), so a raw snappy block
# expands at most ~21x: a claimed length beyond 32x its compressed size is a lie, refused before allocating it.
SNAPPY_MAX_EXPANSION = 32

U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Message:
    value: bytes
    key: bytes | None = None
    ts_ms: int = 0
    seq: int = 0  # set by decoders; for encoders only read by sparse bundles


@dataclass(frozen=True, slots=True)
class BundleHeader:
    codec: int
    count: int
    sparse: bool
    first_seq: int | None  # only for sparse bundles
    last_seq: int | None  # only for sparse bundles
    header_len: int  # bytes before the message set


def read_bundle_header(bundle: BytesLike) -> BundleHeader:
    """Parses and validates the uncompressed header of one bundle (without its length prefix)."""
    if len(bundle) < 1:
        raise ProtocolError("empty bundle")
    flags = bundle[0]
    codec = flags & CODEC_MASK
    if codec > CODEC_SNAPPY:
        raise ProtocolError(f"unknown bundle codec {codec}", 0)
    if flags & FLAG_RESERVED:
        raise ProtocolError("reserved bundle flag bit 7 is set", 0)
    count = (flags >> COUNT_SHIFT) & COUNT_MASK
    position = 1
    if count == 0:
        count, position = read_varint(bundle, position, "bundle message count")
        if count == 0:
            raise ProtocolError("bundle with no messages", 1)
    sparse = bool(flags & FLAG_SPARSE)
    first_seq: int | None = None
    last_seq: int | None = None
    if sparse:
        if len(bundle) < position + 8:
            raise ProtocolError("truncated sparse bundle first seq", position)
        (first_seq,) = U64.unpack_from(bundle, position)
        position += 8
        if count == 1:
            last_seq = first_seq
        else:
            gap, position = read_varint(bundle, position, "sparse bundle last seq")
            last_seq = first_seq + gap + 1
            if last_seq > UINT64_MAX:
                raise ProtocolError("sparse bundle last seq exceeds 64 bits", position)
            if last_seq - first_seq + 1 < count:
                raise ProtocolError("sparse bundle seq range is smaller than its message count", position)
        if first_seq == 0:
            raise ProtocolError("sparse bundle with first seq 0", position)
    return BundleHeader(codec, count, sparse, first_seq, last_seq, position)


class BundleFacts(NamedTuple):
    """A bundle's header fields and what the complete walk of its message set found (min and max over every
    message's timestamp). A NamedTuple, not a frozen dataclass: one is built per produced bundle (natively, when
    the extension is built), and a tuple is built ten times faster. The message count is `messages` (BundleHeader's
    `count`): a tuple field named `count` would hide the method tuple.count."""

    codec: int
    messages: int
    sparse: bool
    first_seq: int | None  # only for sparse bundles
    last_seq: int | None  # only for sparse bundles
    header_len: int
    min_ts_ms: int
    max_ts_ms: int


def message_set(bundle: BytesLike, header: BundleHeader | None = None) -> bytes:
    """The bundle's message set, decompressed when the bundle is snappy-compressed."""
    header = header or read_bundle_header(bundle)
    if header.codec == CODEC_NONE:
        return bytes(bundle[header.header_len :])
    body = memoryview(bundle)[header.header_len :]
    # Raw snappy starts with the uncompressed length as a varint: refuse absurd sizes before allocating.
    claimed = maybe_varint(body, 0)
    if claimed is None:
        raise ProtocolError("truncated snappy message set", header.header_len)
    if claimed[0] > MAX_MESSAGE_SET_BYTES or claimed[0] > SNAPPY_MAX_EXPANSION * len(body):
        raise ProtocolError(f"snappy message set of {len(body)} bytes claims {claimed[0]} bytes", header.header_len)
    try:
        data: bytes = snappy.uncompress(body)  # python-snappy has no type information
        return data
    except Exception as exc:  # python-snappy's UncompressError says nothing; the codec's own error says why
        raise ProtocolError(f"bad snappy message set: {exc.__cause__ or exc}") from None


def decode_bundle(bundle: BytesLike, base_seq: int = 0) -> list[Message]:
    """All messages of one bundle with their seqs. `base_seq` is the seq of the first message of a non-sparse bundle."""
    header = read_bundle_header(bundle)
    data = message_set(bundle, header)
    return decode_message_set(data, header, base_seq)


def decode_message_set(data: BytesLike, header: BundleHeader, base_seq: int = 0, *,
                       partial: bool = False) -> list[Message]:
    """The messages of a message set. With `partial`, a message set cut short (the last bundle of a consume chunk
    may be partial) yields the whole messages before the cut instead of raising."""
    messages: list[Message] = []
    try:
        _walk_messages(data, header, base_seq, messages, strict=False)
    except ProtocolError:
        if not partial:
            raise
    return messages


def validate_bundle(bundle: BytesLike) -> BundleFacts:
    """Validates one bundle completely and returns its facts; raises ProtocolError naming the first fault.

    Complete: the header; the snappy block (decompressed); every message (flags, sparse seq deltas inside
    first..last and increasing, timestamp, key, content) within the message set; exactly `count` messages and no
    byte after the last. A bundle that passes decodes whole, with the same seqs for every reader.
    """
    return _scan_bundle(bundle, True)


def bundle_facts(bundle: BytesLike) -> BundleFacts:
    """The facts of a bundle already stored (in a log, a block or a remote segment), read as the decoders read it:
    validate_bundle without the refusal that is the produce gate's alone (older bundles may hold what the gate now
    refuses and must still be copied and indexed). ProtocolError if it does not decode whole."""
    return _scan_bundle(bundle, False)


def _validate_bundle_py(bundle: BytesLike, strict: bool = True) -> BundleFacts:
    """The reference of validate_bundle (`strict`) and bundle_facts, and their fallback when the extension is not
    built: the same checks, in Python."""
    header = read_bundle_header(bundle)
    low, high = _walk_messages(message_set(bundle, header), header, 0, None, strict=strict)
    return BundleFacts(header.codec, header.count, header.sparse, header.first_seq, header.last_seq,
                       header.header_len, low, high)


def timestamp_bounds(bundle: BytesLike) -> tuple[int, int]:
    """(min, max) message timestamp of one stored bundle (bundle_facts: ProtocolError if it does not decode whole).

    The segment copier and the catalog rebuild record these per segment, so that time-range replays can skip
    objects before reading them.
    """
    facts = bundle_facts(bundle)
    return facts.min_ts_ms, facts.max_ts_ms


def _walk_messages(data: BytesLike, header: BundleHeader, base_seq: int, messages: list[Message] | None, *,
                   strict: bool) -> tuple[int, int]:
    """Walks a whole message set: appends each message to `messages` (when a list is given) and returns the (min,
    max) timestamp. `strict` also refuses SEQ_PREV_PLUS_ONE on a sparse bundle's first or last message."""
    position = 0
    first, last = bundle_seq_range(header, base_seq)
    seq = first
    last_ts = 0
    low, high = UINT64_MAX, 0
    end = len(data)
    count = header.count
    for i in range(count):
        if position >= end:
            raise ProtocolError(f"message set ends after {i} of {count} messages", position)
        flags = data[position]
        position += 1
        if flags & ~MESSAGE_FLAGS_KNOWN:
            raise ProtocolError(f"unknown message flags 0x{flags:02x}", position - 1)
        if header.sparse:
            if strict and flags & SEQ_PREV_PLUS_ONE and (i == 0 or i == count - 1):
                raise ProtocolError(f"sparse bundle message {i} sets SEQ_PREV_PLUS_ONE, which TANK's readers "
                                    "disagree on for a first or last message", position - 1)
            if i == 0:
                seq = first
            elif i == count - 1:
                seq = last
            elif flags & SEQ_PREV_PLUS_ONE:
                seq += 1
            else:
                delta, position = read_varint(data, position, "message seq delta")
                seq += delta + 1
            if 0 < i < count - 1 and seq >= last:
                raise ProtocolError(f"sparse bundle message {i} has seq {seq}, not below its last seq", position)
        elif i:
            seq += 1
        if not flags & USE_LAST_TS:
            if position + 8 > end:
                raise ProtocolError("truncated message timestamp", position)
            (last_ts,) = U64.unpack_from(data, position)
            position += 8
        if last_ts < low:
            low = last_ts
        if last_ts > high:
            high = last_ts
        key = None
        if flags & HAVE_KEY:
            if position >= end:
                raise ProtocolError("truncated message key length", position)
            key_len = data[position]
            position += 1
            if position + key_len > end:
                raise ProtocolError("truncated message key", position)
            if messages is not None:
                key = bytes(data[position : position + key_len])
            position += key_len
        size, position = read_varint(data, position, "message content length")
        if position + size > end:
            raise ProtocolError("truncated message content", position)
        if messages is not None:
            messages.append(Message(bytes(data[position : position + size]), key, last_ts, seq))
        position += size
    if position != end:
        raise ProtocolError(f"{end - position} bytes after the last message of the bundle", position)
    return low, high


def choose_codec(messages: Sequence[Message]) -> int:
    """TANK client's choose_compression_codec(): snappy for >512 messages or >1 KiB of keys and content."""
    if len(messages) > SNAPPY_MIN_MESSAGES:
        return CODEC_SNAPPY
    total = 0
    for m in messages:
        total += len(m.value) + (len(m.key) if m.key else 0)
        if total > SNAPPY_MIN_BYTES:
            return CODEC_SNAPPY
    return CODEC_NONE


def encode_bundle(messages: Sequence[Message], *, codec: int | None = None, sparse: bool = False) -> bytes:
    """Encodes messages as one bundle. A sparse bundle takes each message's `seq` (strictly increasing)."""
    count = len(messages)
    if count == 0:
        raise ValueError("a bundle needs at least one message")
    if codec is None:
        codec = choose_codec(messages)
    if codec not in (CODEC_NONE, CODEC_SNAPPY):
        raise ValueError(f"unknown codec {codec}")
    head = bytearray()
    flags = codec | (FLAG_SPARSE if sparse else 0)
    if count < 16:
        head.append(flags | (count << COUNT_SHIFT))
    else:
        head.append(flags)
        head += encode_varint(count)
    if sparse:
        first, last = messages[0].seq, messages[-1].seq
        if first <= 0 or any(b.seq <= a.seq for a, b in zip(messages, messages[1:])):
            raise ValueError("a sparse bundle needs strictly increasing seqs above 0")
        head += U64.pack(first)
        if count != 1:
            head += encode_varint(last - first - 1)
    body = bytearray()
    prev_ts = prev_seq = 0  # only read from the second message on
    for i, m in enumerate(messages):
        flags = 0
        delta = None
        if sparse and 0 < i < count - 1:
            if m.seq == prev_seq + 1:
                flags |= SEQ_PREV_PLUS_ONE
            else:
                delta = m.seq - prev_seq - 1
        if i and m.ts_ms == prev_ts:
            flags |= USE_LAST_TS
        if m.key is not None:
            if len(m.key) > 255:
                raise ValueError("message keys are at most 255 bytes")
            flags |= HAVE_KEY
        body.append(flags)
        if delta is not None:
            body += encode_varint(delta)
        if not flags & USE_LAST_TS:
            body += U64.pack(m.ts_ms)
        if m.key is not None:
            body.append(len(m.key))
            body += m.key
        body += encode_varint(len(m.value))
        body += m.value
        prev_ts, prev_seq = m.ts_ms, m.seq
    if codec == CODEC_SNAPPY:
        body = snappy.compress(bytes(body))
    return bytes(head) + bytes(body)


def maybe_record(buf: BytesLike, position: int = 0) -> tuple[int, int] | None:
    """One `{bundle_len:varint, bundle}` record at `position`: (bundle start, bundle end), or None if incomplete."""
    got = maybe_varint(buf, position)
    if got is None:
        return None
    size, start = got
    if size == 0:
        raise ProtocolError("zero-length bundle", position)
    if start + size > len(buf):
        return None
    return start, start + size


def encode_record(bundle: bytes) -> bytes:
    """A bundle with its varint length prefix, as it sits in a segment file and in a consume chunk."""
    return encode_varint(len(bundle)) + bundle


def bundle_seq_range(header: BundleHeader, next_seq: int) -> tuple[int, int]:
    """(first, last) seq of a bundle whose non-sparse messages start at `next_seq`."""
    if header.first_seq is not None and header.last_seq is not None:  # set iff the bundle is sparse
        return header.first_seq, header.last_seq
    return next_seq, next_seq + header.count - 1


_scan_bundle: Callable[[BytesLike, bool], BundleFacts]  # (bundle, strict)
try:
    from tiered.protocol import _bundlescan
except ImportError:  # the extension is not built (no C compiler at install time): the reference does the work
    _scan_bundle = _validate_bundle_py
    NATIVE_SCAN = False
else:
    _bundlescan.register(BundleFacts)
    _scan_bundle = _bundlescan.scan_bundle
    NATIVE_SCAN = True  # reported as the tiered_native_bundle_scan gauge
