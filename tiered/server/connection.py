"""One client connection: frames in, requests dispatched in order, responses out.

Invariants:
- A malformed frame, an oversized frame (> 256 MiB), an unknown message id or a payload that does not decode closes
  this connection only; nothing has been applied for that request (produce validates before appending). Requests
  before it on the connection are processed and answered first.
- Requests are processed in the order they arrive, by one task per connection. A long-poll consume or a produce
  waiting for its durable ack runs as a task of its own, so later requests on the connection are not held up by it.
- A response is written whole under the write lock (frame head, then chunks with sendfile), so concurrent
  responses never interleave. Responses queued in one turn of the event loop go out in one write.
- A connection with nothing in flight that sends nothing for 16 s is closed, as TANK's idle_connection_ttl; one
  whose frame takes longer than REQUEST_DEADLINE_S from its first byte to its last is closed too.
- Big frames draw on the broker's receive budget while they arrive and until they are handled; a connection past
  the budget, or past the connection limit at accept, is closed (tiered.server.limits).

The connection is an asyncio.BufferedProtocol rather than a stream pair: bytes are received straight into its
buffer (a frame of BIG_FRAME_BYTES or more straight into a buffer of its own, which becomes the request payload
without another copy), and frames are cut there, so a request costs no StreamReader buffering, no intermediate
copies and no future per read. Buffers grow with the bytes received, never ahead of them. While more than
MAX_QUEUED_BYTES of whole frames wait for the request task, reading pauses.

A payload is never written once its frame is queued: a small frame's is a copy cut from the receive buffer, a big
frame's buffer is dropped by the connection when it is queued, and neither is handed to a read again. The produce
path depends on it: a record the log appends is a read-only view of its payload (ProducePartition.record), kept
until its block is uploaded, long after the connection went on to later frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any

from tiered.acl import ANONYMOUS, principal_of
from tiered.protocol import requests as rq
from tiered.protocol.buffers import receive_buffer
from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import FRAME_HEADER, MsgType, cut_payloads, encode_frame

from tiered.server.fetch import Chunk, FileChunk, StreamChunk, release
from tiered.server.limits import REQUEST_DEADLINE_S

log = logging.getLogger("tiered.server")

IDLE_TIMEOUT_S = 16.0
MIN_READ_BYTES = 16 * 1024  # the receive buffer starts this large, and doubles while reads fill it ...
READ_BYTES = 256 * 1024  # ... up to this
BIG_FRAME_BYTES = 64 * 1024  # a frame this large is received into a buffer of its own, grown as its bytes arrive
MAX_QUEUED_BYTES = 4 << 20  # whole frames waiting for the request task; past this, reading pauses
WRITE_BUFFER_HIGH_BYTES = 1 << 20  # past this much unsent, a sender waits for the client to read
TLS_COPY_BYTES = 256 * 1024  # over TLS a file chunk is read and written in pieces of this size
# The produce ids, read per request: an Enum member read costs a call through Python 3.11's EnumType.__getattr__.
_PRODUCE, _PRODUCE_WITH_SEQNUM = MsgType.PRODUCE, MsgType.PRODUCE_WITH_SEQNUM


class CloseConnection(Exception):
    """Raised by a handler to close the connection after a request that must not be answered."""


def _grown(data: bytearray, start: int, filled: int, capacity: int) -> bytearray:
    """A new buffer of `capacity` bytes holding data[start:start + filled]. Its bytes past those are not set
    (receive_buffer): they are received into before anything reads them, since frames are cut from received bytes
    only and a big frame is queued once its buffer is full."""
    grown = receive_buffer(capacity)
    with memoryview(data) as source:
        grown[:filled] = source[start : start + filled]
    return grown


def bind_listener(host: str, port: int) -> socket.socket:
    """The TANK listener's socket, bound and listening (connections wait in the backlog until `serve`): bound first,
    so that the broker knows the address it advertises before it joins the service."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY on accepted sockets only when their proto says TCP (see
    # Connection.connection_made, which also sets it).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def no_delay(transport) -> None:
    """Turns Nagle's algorithm off: a consume answer is the frame head written, then the segment's bytes by sendfile,
    and with Nagle on the second send waits for the client's delayed ACK of the first (about 40 ms per answer on
    Linux). TLS transports are checked too: their socket is the TCP one underneath."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):  # the peer may already be gone
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def advertised_endpoint(configured: str, bound_host: str, bound_port: int) -> str:
    """`--advertise` as given (a host name is resolved to its IPv4 address), else the listener's own address; an
    any-address listener advertises this host's address."""
    text = configured.strip()
    if text:
        host, _, port = text.rpartition(":")
        return f"{socket.gethostbyname(host or '127.0.0.1')}:{int(port or bound_port)}"
    host = bound_host
    if host in ("", "0.0.0.0", "::"):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    return f"{host}:{bound_port}"


async def serve(broker, sock: socket.socket, ssl_context=None) -> asyncio.AbstractServer:
    """The TANK listener: one Connection per accepted socket; over TLS when `ssl_context` is given. A client that does
    not finish its handshake (a plaintext client on a TLS listener) is closed after HANDSHAKE_TIMEOUT_S, and a failed
    handshake closes only its own connection: no Connection exists before the handshake succeeds."""
    loop = asyncio.get_running_loop()
    if ssl_context is None:
        return await loop.create_server(lambda: Connection(broker), sock=sock)
    from tiered.tls import HANDSHAKE_TIMEOUT_S, SHUTDOWN_TIMEOUT_S

    return await loop.create_server(lambda: Connection(broker), sock=sock, ssl=ssl_context,
                                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
                                    ssl_shutdown_timeout=SHUTDOWN_TIMEOUT_S)


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker):
        self.broker = broker
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = None
        self.principal = ANONYMOUS  # who the access rules see (tiered.acl): set from the client certificate
        self.plaintext = True  # not TLS: redirects name the leader's plaintext endpoint (tiered.server.leaders)
        self.write_lock = asyncio.Lock()
        self.tasks: set[asyncio.Task] = set()
        self.closed = False
        self.idle_timeout_s = broker.idle_timeout_s
        self._pending: list[bytes] = []  # responses queued for the next flush
        self._flush_scheduled = False
        # Receiving: frames are cut from _buf[_start:_end]; a big frame of _big_length bytes fills _big, _big_filled
        # bytes so far. Memory follows what was received: no buffer is sized from a length the client announced.
        self._buf = bytearray(MIN_READ_BYTES)
        self._start = self._end = 0
        self._big: bytearray | None = None
        self._big_msg_id = 0
        self._big_length = 0
        self._big_filled = 0
        self._frames: deque[tuple[int, bytes | bytearray]] = deque()
        # Why the connection is to be closed once the frames before it are handled (a frame refused as it arrived);
        # set once, and nothing is received after it (_refused).
        self._error: ProtocolError | None = None
        self._budget = broker.receive_budget
        self._budget_held = 0  # bytes of big frames, received or arriving, drawn from the broker's receive budget
        self._refused = False  # past the budget, or a frame refused: what arrives is dropped until it closes
        self._partial_since: float | None = None  # when the first byte of a frame not yet whole arrived
        self._queued_bytes = 0
        self._reading_paused = False
        self._eof = False
        self._frames_ready: asyncio.Future | None = None  # the request task waits on it for frames
        # Writing: paused by the transport above WRITE_BUFFER_HIGH_BYTES unsent.
        self._writing_paused = False
        self._drained: list[asyncio.Future] = []
        self._lost = self.loop.create_future()
        self._busy = False  # the request task is in a request (which may wait on admission or a lock)
        self._last_activity = self.loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._runner: asyncio.Task | None = None

    @property
    def receive_buffer_bytes(self) -> int:
        """Memory held for bytes received and not yet cut into whole frames (capacity, not content)."""
        return len(self._buf) + (len(self._big) if self._big is not None else 0)

    @property
    def reading_paused(self) -> bool:
        """Whether reading is paused because whole frames wait for the request task (or a frame was refused)."""
        return self._reading_paused

    # -- asyncio.BufferedProtocol -------------------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        self.principal = principal_of(transport.get_extra_info("peercert"))  # None on a plaintext transport
        self.plaintext = transport.get_extra_info("sslcontext") is None
        if self.broker.stopping:
            self.closed = True
            transport.close()
            return
        if len(self.broker.connections) >= self.broker.max_connections:
            self.closed = True
            self.broker.connections_refused.count_one(limit=self.broker.max_connections)
            transport.abort()
            return
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        no_delay(transport)
        self.broker.connections.add(self)
        self._idle_timer = self.loop.call_later(self.idle_timeout_s, self._check_idle)
        self._runner = self.loop.create_task(self.run())

    def get_buffer(self, sizehint: int) -> memoryview:
        # No view of a buffer is alive here (asyncio drops the previous one after buffer_updated), but buffers are
        # replaced rather than resized all the same: a BufferError would kill the transport.
        if self._refused:
            return memoryview(self._buf)  # dropped: the connection is closing
        big = self._big
        if big is not None:
            if self._big_filled == len(big):
                capacity = min(2 * len(big), self._big_length)
                if not self._draw(capacity - len(big)):
                    return memoryview(self._buf)
                self._big = big = _grown(big, 0, self._big_filled, capacity)
            return memoryview(big)[self._big_filled :]  # never past the end of the big frame
        if self._end == len(self._buf):
            self._make_room()
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        now = self._last_activity = self.loop.time()
        if self._refused:
            return
        if self._big is not None:
            self._big_filled += nbytes
            if self._big_filled == self._big_length:
                self._queue_frame(self._big_msg_id, self._big)
                self._big = None
                self._partial_since = None
                self._wake()
            return
        self._end += nbytes
        self._cut_frames()
        if self._big is not None or self._start != self._end:
            if self._partial_since is None:
                self._partial_since = now
        else:
            self._partial_since = None
        self._wake()

    def _draw(self, n: int) -> bool:
        """Takes `n` bytes of the broker's receive budget for a big frame; when they do not fit, the connection is
        refused: what it sends is dropped, and its request task closes it with the reason."""
        if self._budget.reserve(n):
            self._budget_held += n
            return True
        self._big = None
        self._refuse(ProtocolError(f"the broker's buffer budget for requests being received is spent "
                                   f"({self._budget.limit} bytes across connections)", 0))
        self._wake()
        return False

    def _refuse(self, error: ProtocolError) -> None:
        """Nothing more is received: the request task handles the frames already queued, then closes with `error`."""
        self._refused = True
        self._error = error
        self._pause_reading()

    def _return_budget(self, n: int) -> None:
        n = min(n, self._budget_held)
        self._budget_held -= n
        self._budget.release(n)

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # Half-closed: the requests already received are still answered, then the task closes it. TLS has no
        # half-close (asyncio closes the transport whatever we answer), so there the answer is False.
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self.closed = True
        if not self._lost.done():
            self._lost.set_result(None)
        for waiter in self._drained:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("connection lost"))
        self._drained.clear()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drained:
            if not waiter.done():
                waiter.set_result(None)
        self._drained.clear()

    # -- frames ----------------------------------------------------------------------------------------------------

    def _cut_frames(self) -> None:
        """Every whole frame received is queued, its payload copied out as bytes, in one native pass (cut_payloads)
        and one extend of the queue."""
        buf, end = self._buf, self._end
        frames, start, payload_bytes, big, error = cut_payloads(buf, self._start, end, BIG_FRAME_BYTES)
        if frames:
            self._frames.extend(frames)
            self._queued_bytes += payload_bytes
            if self._queued_bytes > MAX_QUEUED_BYTES:
                self._pause_reading()
        if error is not None:
            # Refused as soon as its header is here, rather than buffering a quarter gigabyte.
            self._refuse(error)
            start = end
        elif big is not None:
            msg_id, length = big
            have = end - start - FRAME_HEADER.size
            capacity = min(max(READ_BYTES, have), length)
            if self._draw(capacity):
                self._big = _grown(buf, start + FRAME_HEADER.size, have, capacity)
                self._big_msg_id, self._big_length, self._big_filled = msg_id, length, have
            start = end
        if start == end:
            start = end = 0
        self._start, self._end = start, end

    def _make_room(self) -> None:
        """_buf is full up to its end: reads are filling it, so it doubles up to READ_BYTES; once there, the partial
        frame at _start moves to the front (it is shorter than a big frame, so it fits)."""
        size = self._end - self._start
        if len(self._buf) < READ_BYTES:
            self._buf = _grown(self._buf, self._start, size, 2 * len(self._buf))
        else:
            self._buf[:size] = self._buf[self._start : self._end]
        self._start, self._end = 0, size

    def _queue_frame(self, msg_id: int, payload: bytes | bytearray) -> None:
        self._frames.append((msg_id, payload))
        self._queued_bytes += len(payload)
        if self._queued_bytes > MAX_QUEUED_BYTES:
            self._pause_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def _wake(self) -> None:
        waiter = self._frames_ready
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _next_frames(self) -> None:
        """Waits until a frame, an error or the end of the stream is there."""
        self._frames_ready = self.loop.create_future()
        try:
            await self._frames_ready
        finally:
            self._frames_ready = None

    def _check_idle(self) -> None:
        """TANK's idle_connection_ttl: nothing in flight and nothing received for idle_timeout_s closes it."""
        self._idle_timer = None
        if self.closed:
            return
        now = self.loop.time()
        if self._partial_since is not None and now - self._partial_since > REQUEST_DEADLINE_S:
            log.info("closing connection from %s: a request did not arrive whole within %.0f s", self.peer,
                     REQUEST_DEADLINE_S)
            self.abort()
            return
        if self.tasks or self._busy or self._frames:
            self._last_activity = now
        due = self._last_activity + self.idle_timeout_s
        if self._partial_since is not None:
            due = min(due, self._partial_since + REQUEST_DEADLINE_S + 0.001)
        if now < due:
            self._idle_timer = self.loop.call_at(due, self._check_idle)
            return
        log.info("closing idle connection from %s", self.peer)
        self.abort()

    # -- requests --------------------------------------------------------------------------------------------------

    def spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self._last_activity = self.loop.time()
        if not task.cancelled() and task.exception() is not None:
            log.error("request task on %s failed: %r", self.peer, task.exception())
            self.abort()

    async def run(self) -> None:
        frames = self._frames
        try:
            await self.send(MsgType.PING, b"")  # TANK introduces itself with one ping on accept
            produce = self.broker.handlers.produce.handle_payload  # dispatch's first case, here: no frame per produce
            while not self.closed:
                if not frames:
                    if self._error is not None:
                        raise self._error
                    if self._eof:
                        break
                    await self._next_frames()
                    continue
                msg_id, payload = frames.popleft()
                self._queued_bytes -= len(payload)
                if self._reading_paused and self._queued_bytes <= MAX_QUEUED_BYTES // 2 and not self._refused \
                        and not self.closed:
                    self._reading_paused = False
                    self.transport.resume_reading()
                self._busy = True
                try:
                    if msg_id == _PRODUCE:
                        handling = produce(self, payload, False)
                    else:
                        handling = self.dispatch(msg_id, payload)
                    if handling is not None:
                        await handling
                finally:
                    self._busy = False
                    if len(payload) >= BIG_FRAME_BYTES:
                        self._return_budget(len(payload))  # a big frame's buffer, drawn while it arrived
        except (ProtocolError, CloseConnection) as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
        except ConnectionError:
            pass
        finally:
            await self.close()
            self.broker.connections.discard(self)

    def dispatch(self, msg_id: int, payload) -> Coroutine[Any, Any, None] | None:
        """The request read (ProtocolError here, before anything ran) and its handler's coroutine for the request
        task to await, or None when there is nothing to await (a ping; a produce answered at once,
        ProduceHandler.handle_payload, which reads its payload itself); returned rather than awaited, so a request
        costs no coroutine of its own. `run` reads
        a plain produce (0x01) itself, as the first case here does."""
        h = self.broker.handlers
        if msg_id == _PRODUCE:
            return h.produce.handle_payload(self, payload, False)
        if msg_id == _PRODUCE_WITH_SEQNUM:
            return h.produce.handle_payload(self, payload, True)
        if msg_id == MsgType.CONSUME:
            return h.consume.handle(self, rq.read_consume_request(payload))
        if msg_id == MsgType.PING:
            return None  # pings from clients are ignored, as TANK does
        if msg_id == MsgType.DISCOVER_PARTITIONS:
            return h.admin.discover_partitions(self, rq.read_discover_partitions_request(payload))
        if msg_id == MsgType.CREATE_TOPIC:
            return h.admin.create_topic(self, rq.read_create_topic_request(payload))
        if msg_id == MsgType.RELOAD_CONF:
            return h.admin.reload_conf(self, rq.read_reload_conf_request(payload))
        if msg_id == MsgType.STATUS:
            return h.admin.status(self, rq.read_status_request(payload))
        if msg_id == MsgType.DISCOVER_TOPICS:
            return h.admin.discover_topics(self, rq.read_discover_topics_request(payload))
        if msg_id == MsgType.DISCOVER_TOPOLOGY:
            return h.admin.discover_topology(self, rq.read_discover_topology_request(payload))
        raise CloseConnection(f"unsupported message id 0x{msg_id:02x}")

    # -- responses -------------------------------------------------------------------------------------------------

    async def send(self, msg_id: int, payload: bytes) -> None:
        """Queues one response. Responses queued in the same turn of the event loop (pipelined requests) go out in
        one write, so a burst of small responses costs one send() syscall rather than one each."""
        await self.send_frame(encode_frame(msg_id, payload))

    async def send_frame(self, frame: bytes) -> None:
        """send() of a response framed already (frame head and payload)."""
        if self.write_lock.locked():  # a consume response is going out: this one follows it
            async with self.write_lock:
                self._queue_response(frame)
        else:
            self._queue_response(frame)
        if self._writing_paused:
            await self._drain()

    def try_send_frame(self, frame: bytes) -> bool:
        """send_frame() when it would not wait: the write lock is free and the client reads. False: nothing was
        queued, await send_frame(). Lets a handler answer without a coroutine of its own."""
        if self._writing_paused or self.write_lock.locked():
            return False
        self._queue_response(frame)
        return True

    def _queue_response(self, frame: bytes) -> None:
        """Only while the write lock is free: a consume response going out must not be cut into."""
        if self.closed:
            return
        self._pending.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._pending and not self.closed:
            self.transport.write(b"".join(self._pending) if len(self._pending) > 1 else self._pending[0])
        self._pending.clear()

    async def _send_file_copied(self, chunk: FileChunk) -> bool:
        """A file chunk read with pread (the file's position is never used: the file is shared) and written piece by
        piece, waiting for the client to read when the transport's buffer is full. False when it was cut short."""
        fd, offset, left = chunk.file.fileno(), chunk.start, chunk.size
        while left:
            piece = os.pread(fd, min(left, TLS_COPY_BYTES), offset)
            if not piece:
                log.error("segment file ended %d bytes early for %s; closing", left, self.peer)
                self.abort()
                return False
            self.transport.write(piece)
            offset += len(piece)
            left -= len(piece)
            await self._drain()
            if self.closed:
                return False
        return True

    async def send_consume(self, head: bytes, chunks: list[Chunk]) -> None:
        """A consume response: the frame head with the partition header, then every chunk in header order. A
        streamed chunk is written piece by piece as its bytes arrive, waiting for the client to read when the
        transport's buffer is full, so what a stream holds stays bounded by its read. Chunks not sent (the
        connection closed, or a stream failed) are released."""
        try:
            async with self.write_lock:
                if self.closed:
                    return
                self._flush()  # queued responses go first, in order
                self.transport.write(head)
                for chunk in chunks:
                    if isinstance(chunk, FileChunk) and self.transport.get_extra_info("sslcontext") is not None:
                        # TLS: the bytes go through the encrypting transport (asyncio's own fallback for sendfile
                        # reads from the shared file's position, and not at all from offset 0).
                        if not await self._send_file_copied(chunk):
                            return
                    elif isinstance(chunk, FileChunk):
                        sent = await self.loop.sendfile(self.transport, chunk.file, chunk.start, chunk.size)
                        if sent != chunk.size:
                            # The frame length is already on the wire: a short chunk would desynchronise the client.
                            log.error("sendfile sent %d of %d bytes to %s; closing", sent, chunk.size, self.peer)
                            self.abort()
                            return
                    elif isinstance(chunk, StreamChunk):
                        if not await self._send_stream(chunk):
                            return
                    else:
                        self.transport.write(chunk.data)
                await self._drain()
        finally:
            release(chunks)

    async def _send_stream(self, chunk: StreamChunk) -> bool:
        """Writes a streamed chunk whole; a stream that stops short closes the connection (its length is on the
        wire already), and says so."""
        sent = 0
        try:
            async for piece in chunk.stream.pieces():
                if self.closed:
                    return False
                self.transport.write(piece)
                sent += len(piece)
                await self._drain()
        except Exception as exc:  # whatever stopped the bytes, the length is on the wire: only closing is left
            log.error("a remote chunk for %s stopped after %d of %d bytes (%s); closing", self.peer, sent,
                      chunk.size, exc)
            self.abort()
            return False
        finally:
            chunk.stream.close()
        return True

    async def _drain(self) -> None:
        if not self._writing_paused or self.closed:
            return
        waiter = self.loop.create_future()
        self._drained.append(waiter)
        try:
            await waiter
        except ConnectionError:
            self.abort()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.abort()
        self._wake()

    async def close(self) -> None:
        self._flush()
        self._return_budget(self._budget_held)
        self._big = None
        self.closed = True
        self._wake()
        for task in list(self.tasks):
            task.cancel()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self.transport.close()
        await self._lost
