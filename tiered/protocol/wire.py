"""Primitives shared by the message codecs: a bounds-checked reader over one payload and checked packers.

Every read names what it reads, so that bad bytes surface as one ProtocolError saying what, in which message and at
which byte; no IndexError, struct.error or UnicodeError escapes a reader. Strings on the wire (`str8` = u8 length +
bytes) are decoded and encoded as latin-1, so that any byte sequence round-trips through `str`.
Packers raise ValueError (naming the field) when a value does not fit its wire type.
"""

from __future__ import annotations

import struct
from collections.abc import Sized
from typing import Any, NoReturn

from tiered.protocol.buffers import BytesLike
from tiered.protocol.codes import ENDPOINT, Endpoint, decode_endpoint, encode_endpoint
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import encode_varint, maybe_varint

U8 = struct.Struct("<B")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


class Reader:
    """A cursor over one payload. `context` names the message, e.g. "consume request"."""

    __slots__ = ("view", "position", "context")

    def __init__(self, payload: BytesLike, context: str) -> None:
        view = payload if isinstance(payload, memoryview) else memoryview(payload)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.view = view
        self.position = 0
        self.context = context

    def fail(self, what: str, position: int | None = None) -> NoReturn:
        raise ProtocolError(f"{self.context}: {what}", self.position if position is None else position)

    def remaining(self) -> int:
        return len(self.view) - self.position

    def unpack(self, st: struct.Struct, what: str) -> tuple[Any, ...]:
        """The fields of `st`, in order (typed Any: their types follow the format string, which stubs cannot say)."""
        if self.position + st.size > len(self.view):
            self.fail(f"truncated {what}")
        values = st.unpack_from(self.view, self.position)
        self.position += st.size
        return values

    def u8(self, what: str) -> int:
        if self.position >= len(self.view):
            self.fail(f"truncated {what}")
        value = self.view[self.position]
        self.position += 1
        return value

    def u16(self, what: str) -> int:
        value: int = self.unpack(U16, what)[0]
        return value

    def u32(self, what: str) -> int:
        value: int = self.unpack(U32, what)[0]
        return value

    def u64(self, what: str) -> int:
        value: int = self.unpack(U64, what)[0]
        return value

    def bool8(self, what: str) -> bool:
        value = self.u8(what)
        if value > 1:
            self.fail(f"{what} is {value}, not a bool", self.position - 1)
        return bool(value)

    def take(self, size: int, what: str) -> memoryview:
        """The next `size` bytes as a view of the payload (no copy)."""
        end = self.position + size
        if end > len(self.view):
            self.fail(f"{what} of {size} bytes runs past the end of the payload")
        chunk = self.view[self.position : end]
        self.position = end
        return chunk

    def str8(self, what: str) -> str:
        size = self.u8(f"{what} length")
        return str(self.take(size, what), "latin-1")

    def varint(self, what: str) -> int:
        try:
            got = maybe_varint(self.view, self.position)
        except ProtocolError as exc:
            self.fail(f"{what}: {exc.what}")
        if got is None:
            self.fail(f"truncated {what}")
        value, self.position = got
        return value

    def endpoint(self, what: str) -> Endpoint:
        octets, port = self.unpack(ENDPOINT, what)
        return decode_endpoint(octets, port)

    def finish(self) -> None:
        """The payload must end exactly here."""
        if self.position != len(self.view):
            self.fail(f"{len(self.view) - self.position} trailing bytes")


def pack(st: struct.Struct, what: str, *values: object) -> bytes:
    try:
        return st.pack(*values)
    except struct.error as exc:
        raise ValueError(f"{what} does not fit its wire type: {values!r} ({exc})") from None


def pack_str8(value: str, what: str) -> bytes:
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {value!r} has characters outside latin-1") from None
    if len(raw) > 0xFF:
        raise ValueError(f"{what} is {len(raw)} bytes; at most 255 fit a str8")
    return bytes((len(raw),)) + raw


def pack_count8(items: Sized, what: str) -> bytes:
    """A u8 count of `items` (TANK's produce and consume counts): more than 255 do not fit."""
    if len(items) > 0xFF:
        raise ValueError(f"{len(items)} {what}; at most 255 fit the u8 count")
    return bytes((len(items),))


def pack_varint(value: int, what: str) -> bytes:
    try:
        return encode_varint(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def pack_endpoint(endpoint: Endpoint | None, what: str) -> bytes:
    if endpoint is None:
        raise ValueError(f"{what} needs an endpoint")
    return encode_endpoint(endpoint)
