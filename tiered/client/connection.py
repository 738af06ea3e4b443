"""One connection to one broker: requests pipelined and matched to responses by request id.

A long-poll consume may be answered after later requests, so answers are matched by id, not by order. The broker's
PING (sent once on accept, docs/protocol.md §1) is skipped. When the connection ends, every request waiting on it fails
with the reason; `call` on an ended connection raises NotSent, since nothing was written.

The connection is an asyncio.BufferedProtocol, as the broker's (tiered/server/connection.py): bytes are received
straight into a buffer of ours, small frames are cut from it, and a frame of BIG_FRAME_BYTES or more (a consume
answer of history) is received straight into a buffer of its own, which becomes the payload without another copy.
Through a StreamReader a 16 MiB answer was copied three more times and its buffer grown by reallocation: about 1 s
of CPU per GiB received, most of what a bulk reader spent. The client trusts the broker it asked, so a big frame's
buffer is allocated whole when its header arrives (frames are at most 256 MiB), and a big frame's payload is a
memoryview of it.

Big buffers are used again (SPARES per connection, up to SPARE_MAX_BYTES each): a fresh 16 MiB bytearray is
zero-filled and faulted in page by page, which cost a bulk reader more CPU than receiving the bytes. A buffer is
taken again only when nothing but the connection refers to it: every payload view, and every view cut from one
(a consume chunk, a ChunkResult), holds a reference to it, so a payload still held anywhere is never overwritten.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import sys

from tiered.cancellation import within
from tiered.client.errors import CertificateRefused
from tiered.protocol.codes import Endpoint
from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import FRAME_HEADER, MsgType, cut_frames, encode_frame

READ_BYTES = 256 * 1024  # the buffer small frames are received into
BIG_FRAME_BYTES = 64 * 1024  # a frame this large is received into a buffer of its own
SPARES = 2  # big buffers kept for later frames: a reader holding its last answer while it asks again leaves one free
SPARE_MAX_BYTES = 64 << 20  # a bigger buffer is not kept
CLOSE_WAIT_S = 5.0  # close() waits at most this long for the transport to report the connection lost


X509_HOSTNAME_MISMATCH, X509_IP_MISMATCH = 62, 64  # OpenSSL's X509_V_ERR_*: the certificate names someone else
TLS_REFUSED = ("TLS refused by the broker (does it require a client certificate, or not accept this one? "
               "--tls-cert/--tls-key)")


class NotSent(ConnectionError):
    """The request was not written: the connection could not be opened, or had ended before the write."""


class _Frames(asyncio.BufferedProtocol):
    """Cuts the bytes received into frames for `conn`; pauses its writers while the transport's buffer is full."""

    def __init__(self, conn: "Connection") -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(READ_BYTES)
        self._start = self._end = 0  # the bytes of _buf not yet cut into frames
        self._big: memoryview | None = None  # the payload of a big frame, filled up to _big_filled
        self._big_msg_id = self._big_filled = 0
        self._spares: list[bytearray] = []
        self._writable: asyncio.Future | None = None  # set while writing is paused
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return memoryview(self._big)[self._big_filled:]
        return memoryview(self._buf)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._big is not None:
            self._big_filled += nbytes
            if self._big_filled == len(self._big):
                payload, self._big = self._big, None
                self.conn._frame(self._big_msg_id, payload)
            return
        self._end += nbytes
        try:
            self._cut()
        except ProtocolError as exc:
            self.conn._fail_all(exc)
            assert self.transport is not None
            self.transport.abort()

    def _cut(self) -> None:
        buf, end = self._buf, self._end
        cut = cut_frames(buf, self._start, end, BIG_FRAME_BYTES)
        for msg_id, payload_start, payload_end in cut.frames:
            self.conn._frame(msg_id, bytes(buf[payload_start:payload_end]))
        if cut.error is not None:  # refused before waiting for (and buffering) it
            raise cut.error
        start = cut.rest
        if cut.big is not None:
            msg_id, length = cut.big
            at = start + FRAME_HEADER.size
            self._big = memoryview(self._big_buffer(length))[:length]
            self._big[:end - at] = buf[at:end]
            self._big_msg_id, self._big_filled = msg_id, end - at
            start = end
        if start == end:
            start = end = 0
        elif start and end == len(buf):  # a small frame's head at the end of the buffer: move it to the front
            buf[:end - start] = buf[start:end]
            start, end = 0, end - start
        self._start, self._end = start, end

    def _big_buffer(self, length: int) -> bytearray:
        """A buffer of at least `length` bytes that nothing else refers to."""
        for spare in self._spares:
            # The list, `spare` and getrefcount's argument: no payload view of it is alive anywhere.
            if len(spare) >= length and sys.getrefcount(spare) == 3:
                return spare
        fresh = bytearray(length)
        if length <= SPARE_MAX_BYTES:
            if len(self._spares) < SPARES:
                self._spares.append(fresh)
            else:  # in place of the smallest spare
                self._spares[min(range(SPARES), key=lambda i: len(self._spares[i]))] = fresh
        return fresh

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost says why

    def connection_lost(self, exc: Exception | None) -> None:
        if (exc is None or isinstance(exc, ConnectionResetError)) and self.conn.tls and not self.conn.greeted:
            # The broker sends PING once its side of the handshake is done: a TLS session that ends before it was
            # refused by the broker (under TLS 1.3 the client's handshake completes before the broker checks ours;
            # its refusal arrives as a close or, racing our first write, as a reset).
            exc = ConnectionError(TLS_REFUSED)
        self.conn._fail_all(exc or ConnectionError("the broker closed the connection"))
        self.resume_writing()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            if not self._writable.done():
                self._writable.set_result(None)
            self._writable = None

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable


class Connection:
    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint  # as the caller named it (a host name or an address)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}  # by request id
        self._closed_exc: BaseException | None = None
        self._frames = _Frames(self)
        self.tls = False  # over TLS
        self.greeted = False  # the broker's PING arrived

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout_s: float, ssl_context: ssl.SSLContext | None = None,
                   server_name: str = "") -> "Connection":
        """Raises NotSent (with the OSError or TimeoutError as its cause, CertificateRefused for a certificate that
        did not verify) when no connection is made. Over TLS when `ssl_context` is given: the broker's certificate
        is checked against `server_name`, else the host or address as named."""
        conn = cls(endpoint)
        conn.tls = ssl_context is not None
        name = server_name or endpoint.addr
        tls = {"ssl": ssl_context, "server_hostname": name} if ssl_context is not None else {}
        opening = asyncio.get_running_loop().create_connection(lambda: conn._frames, endpoint.addr, endpoint.port,
                                                               **tls)
        try:
            await within(opening, timeout_s)
        except TimeoutError as exc:  # before OSError, which it is
            raise NotSent(f"{endpoint}: no connection within {timeout_s:g} s") from exc
        except ssl.SSLCertVerificationError as exc:  # before OSError, which it is
            refused = CertificateRefused(str(endpoint), name, exc.verify_message or str(exc),
                                         mismatch=exc.verify_code in (X509_HOSTNAME_MISMATCH, X509_IP_MISMATCH))
            raise NotSent(str(refused)) from refused
        except OSError as exc:
            raise NotSent(f"{endpoint}: {reason(exc)}") from exc
        return conn

    @property
    def alive(self) -> bool:
        """False once the connection ended, also when the broker's close arrived but was not handled yet (a request
        written then would be lost with it, its outcome unknown)."""
        transport = self._frames.transport
        return self._closed_exc is None and transport is not None and not transport.is_closing()

    @property
    def server_name(self) -> str | None:
        """The name the broker's certificate was verified by, as the TLS session holds it; None without TLS."""
        transport = self._frames.transport
        sslobj = transport.get_extra_info("ssl_object") if transport is not None else None
        return sslobj.server_hostname if sslobj is not None else None

    def request_id(self) -> int:
        return next(self._ids)

    def abort(self) -> None:
        """Closes without waiting (the connection is dead already, or no longer wanted). Every request still waiting
        has failed by then, so bytes not yet sent are dropped (transport.abort): a close that waited for them to
        flush to a broker that does not read could wait forever (a Ctrl-C during a long poll must end the CLI)."""
        self._fail_all(ConnectionError("client closed"))
        if self._frames.transport is not None:
            self._frames.transport.abort()

    async def close(self) -> None:
        self.abort()
        try:
            await within(asyncio.shield(self._frames.closed), CLOSE_WAIT_S)
        except (ConnectionError, OSError, TimeoutError):
            pass

    async def call(self, msg_id: int, request_id: int, payload: bytes, timeout_s: float | None = None) -> bytes:
        """The answer's payload (a memoryview for a big frame). Raises NotSent before the write; once written, the
        connection's end (a ConnectionError) or asyncio.TimeoutError after `timeout_s` (a late answer is then
        dropped)."""
        if not self.alive:
            why = self._closed_exc or (TLS_REFUSED if self.tls and not self.greeted else "closed by the broker")
            raise NotSent(f"{self.endpoint}: the connection had ended ({why})")
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        assert self._frames.transport is not None
        self._frames.transport.write(encode_frame(msg_id, payload))
        await self._frames.drain()
        if timeout_s is None:
            return await future
        return await within(future, timeout_s)

    def _frame(self, msg_id: int, payload: bytes | memoryview) -> None:
        if msg_id == MsgType.PING:
            self.greeted = True
            return
        try:
            self._deliver(msg_id, payload)
        except ConnectionError as exc:  # every waiter learns why the connection ended
            self._fail_all(exc)
            if self._frames.transport is not None:
                self._frames.transport.abort()

    def _deliver(self, msg_id: int, payload) -> None:
        request_id = int.from_bytes(payload[4:8] if msg_id == MsgType.CONSUME else payload[0:4], "little")
        future = self._pending.pop(request_id, None)
        if future is None:
            raise ConnectionError(f"response to unknown request {request_id} (message 0x{msg_id:02x})")
        if not future.done():
            future.set_result(payload)

    def _fail_all(self, exc: BaseException) -> None:
        if self._closed_exc is None:
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
    if isinstance(exc, ssl.SSLError):
        why = (exc.reason or str(exc)).lower().replace("_", " ")
        if "certificate required" in why or "handshake failure" in why:
            why += " (does the broker require a client certificate? --tls-cert/--tls-key)"
        return f"TLS refused: {why}"
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
