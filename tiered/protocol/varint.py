"""Unsigned 32-bit LEB128 varints (docs/protocol.md §5).

7 bits per byte, least significant group first, 0x80 marks a continuation; 1 to 5 bytes. TANK's decoder does not
mask the fifth byte; we refuse a value that does not fit in 32 bits instead of wrapping it silently.
"""

from tiered.protocol.buffers import BytesLike
from tiered.protocol.errors import ProtocolError

MAX_VARINT_BYTES = 5
MAX_VARINT = 0xFFFF_FFFF


def encode_varint(value: int) -> bytes:
    if value < 0 or value > MAX_VARINT:
        raise ValueError(f"varint out of range: {value}")
    if value < 0x80:
        return bytes((value,))
    return encode_uvarint(value)


def encode_uvarint(value: int) -> bytes:
    """An unsigned LEB128 varint of any non-negative size: TANK's varints stop at 32 bits (encode_varint), the block
    footer's seq deltas do not."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def maybe_varint(buf: BytesLike, position: int = 0) -> tuple[int, int] | None:
    """Returns (value, position after it), or None when `buf` ends before the varint does."""
    value = 0
    shift = 0
    end = len(buf)
    for i in range(position, min(position + MAX_VARINT_BYTES, end)):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value > MAX_VARINT:
                raise ProtocolError("varint exceeds 32 bits", position)
            return value, i + 1
        shift += 7
    if end - position >= MAX_VARINT_BYTES:
        raise ProtocolError("varint longer than 5 bytes", position)
    return None


def read_varint(buf: BytesLike, position: int = 0, what: str = "varint") -> tuple[int, int]:
    """Like maybe_varint, but a truncated varint is a ProtocolError naming `what`."""
    got = maybe_varint(buf, position)
    if got is None:
        raise ProtocolError(f"truncated {what}", position)
    return got


def varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size
