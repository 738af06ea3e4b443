"""One connection to one broker: requests pipelined and matched to responses by request id.

A long-poll consume may be answered after later requests, so answers are matched by id, not by order. The broker's
PING (sent once on accept, docs/protocol.md §1) is skipped. When the connection ends, every request waiting on it fails
with the reason; `call` on an ended connection raises NotSent, since nothing was written.
"""

from __future__ import annotations

import asyncio
import itertools

from tiered.protocol.codes import Endpoint
from tiered.protocol.frame import FrameBuffer, MsgType, encode_frame

READ_BYTES = 256 * 1024


class NotSent(ConnectionError):
    """The request was not written: the connection could not be opened, or had ended before the write."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, endpoint: Endpoint):
        self.endpoint = endpoint  # as the caller named it (a host name or an address)
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}  # by request id
        self._closed_exc: BaseException | None = None
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout_s: float) -> "Connection":
        """Raises NotSent (with the OSError or TimeoutError as its cause) when no connection is made."""
        opening = asyncio.open_connection(endpoint.addr, endpoint.port, limit=1 << 20)
        try:
            reader, writer = await asyncio.wait_for(opening, timeout_s)
        except asyncio.TimeoutError as exc:  # before OSError, which it is
            raise NotSent(f"{endpoint}: no connection within {timeout_s:g} s") from exc
        except OSError as exc:
            raise NotSent(f"{endpoint}: {reason(exc)}") from exc
        return cls(reader, writer, endpoint)

    @property
    def alive(self) -> bool:
        """False once the connection ended, also when the broker's close arrived but the read loop has not run since
        (a request written then would be lost with it, its outcome unknown)."""
        return self._closed_exc is None and not self._reader.at_eof()

    def request_id(self) -> int:
        return next(self._ids)

    def abort(self) -> None:
        """Closes without waiting (the connection is dead already, or no longer wanted)."""
        self._read_task.cancel()
        self._writer.close()

    async def close(self) -> None:
        self._read_task.cancel()
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def call(self, msg_id: int, request_id: int, payload: bytes, timeout_s: float | None = None) -> bytes:
        """The answer's payload. Raises NotSent before the write; once written, the connection's end (a
        ConnectionError) or asyncio.TimeoutError after `timeout_s` (a late answer is then dropped)."""
        if not self.alive:
            raise NotSent(f"{self.endpoint}: the connection had ended ({self._closed_exc or 'closed by the broker'})")
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._writer.write(encode_frame(msg_id, payload))
        await self._writer.drain()
        if timeout_s is None:
            return await future
        return await asyncio.wait_for(future, timeout_s)

    async def _read_loop(self) -> None:
        frames = FrameBuffer()
        try:
            while True:
                got = frames.next_frame()
                if got is None:
                    data = await self._reader.read(READ_BYTES)
                    if not data:
                        raise ConnectionError("the broker closed the connection")
                    frames.feed(data)
                    continue
                msg_id, payload = got
                if msg_id != MsgType.PING:
                    self._deliver(msg_id, payload)
        except asyncio.CancelledError:
            self._fail_all(ConnectionError("client closed"))
            raise
        except BaseException as exc:  # every waiter learns why the connection ended
            self._fail_all(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))

    def _deliver(self, msg_id: int, payload: bytes) -> None:
        request_id = int.from_bytes(payload[4:8] if msg_id == MsgType.CONSUME else payload[0:4], "little")
        future = self._pending.pop(request_id, None)
        if future is None:
            raise ConnectionError(f"response to unknown request {request_id} (message 0x{msg_id:02x})")
        if not future.done():
            future.set_result(payload)

    def _fail_all(self, exc: BaseException) -> None:
        self._closed_exc = exc
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
        self._pending.clear()


def reason(exc: BaseException) -> str:
    """Why a connection could not be made or was lost, in a few words."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer in time"
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
