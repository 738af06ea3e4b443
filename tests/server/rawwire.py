"""A raw TANK connection for tests that check exact bytes on the wire (no client logic in between)."""

from __future__ import annotations

import asyncio

from tiered.protocol.frame import FrameBuffer, MsgType, encode_frame


class RawConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.frames = FrameBuffer()

    @classmethod
    async def open(cls, port: int, *, expect_ping: bool = True) -> "RawConnection":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = cls(reader, writer)
        if expect_ping:
            msg_id, payload = await conn.recv()
            assert (msg_id, payload) == (MsgType.PING, b"")
        return conn

    async def send(self, msg_id: int, payload: bytes) -> None:
        self.writer.write(encode_frame(msg_id, payload))
        await self.writer.drain()

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def recv(self, timeout_s: float = 10.0) -> tuple[int, bytes]:
        async def read() -> tuple[int, bytes]:
            while True:
                got = self.frames.next_frame()
                if got is not None:
                    return got
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("closed by the broker")
                self.frames.feed(data)

        return await asyncio.wait_for(read(), timeout_s)

    async def closed_by_peer(self, timeout_s: float = 10.0) -> bool:
        """True once the broker closes the connection (reads EOF), within the timeout."""
        async def wait_eof() -> bool:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return True

        try:
            return await asyncio.wait_for(wait_eof(), timeout_s)
        except ConnectionError:
            return True

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
