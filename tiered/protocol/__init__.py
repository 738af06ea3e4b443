"""TANK's wire format: pure codecs, bytes in and values out (no asyncio, no sockets, no files)."""

from tiered.protocol.errors import ProtocolError

__all__ = ["ProtocolError"]
