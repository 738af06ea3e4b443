"""One client connection: frames in, requests dispatched in order, responses out.

Invariants:
- A malformed frame, an oversized frame (> 256 MiB), an unknown message id or a payload that does not decode closes
  this connection only; nothing has been applied for that request (produce validates before appending).
- Requests are processed in the order they arrive. A long-poll consume or a produce waiting for its durable ack
  runs as a task of its own, so later requests on the connection are not held up by it.
- A response is written whole under the write lock (frame head, then chunks with sendfile), so concurrent
  responses never interleave.
- A connection with nothing in flight that sends nothing for 16 s is closed, as TANK's idle_connection_ttl.
"""

from __future__ import annotations

import asyncio
import logging

from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import FrameBuffer, MsgType, encode_frame
from tiered.protocol import requests as rq

from tiered.server.fetch import FileChunk

log = logging.getLogger("tiered.server")

IDLE_TIMEOUT_S = 16.0
READ_BYTES = 256 * 1024
WRITE_BUFFER_HIGH_BYTES = 1 << 20  # past this much unsent, a sender waits for the client to read


class CloseConnection(Exception):
    """Raised by a handler to close the connection after a request that must not be answered."""


class Connection:
    def __init__(self, broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.broker = broker
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername")
        self.write_lock = asyncio.Lock()
        self.tasks: set[asyncio.Task] = set()
        self.closed = False
        self.idle_timeout_s = broker.idle_timeout_s
        self._pending: list[bytes] = []  # responses queued for the next flush
        self._flush_scheduled = False

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("request task on %s failed: %r", self.peer, task.exception())
            self.abort()

    async def run(self) -> None:
        frames = FrameBuffer()
        try:
            await self.send(MsgType.PING, b"")  # TANK introduces itself with one ping on accept
            while not self.closed:
                got = frames.next_frame()
                if got is None:
                    data = await self._read()
                    if not data:
                        break
                    frames.feed(data)
                    continue
                await self.dispatch(*got)
        except ProtocolError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
        except CloseConnection as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.TimeoutError:
            log.info("closing idle connection from %s", self.peer)
        finally:
            await self.close()

    async def _read(self) -> bytes:
        if self.tasks:
            return await self.reader.read(READ_BYTES)
        return await asyncio.wait_for(self.reader.read(READ_BYTES), self.idle_timeout_s)

    async def dispatch(self, msg_id: int, payload: bytes) -> None:
        h = self.broker.handlers
        if msg_id == MsgType.PRODUCE:
            await h.produce.handle(self, rq.read_produce_request(payload, with_seqnum=False))
        elif msg_id == MsgType.PRODUCE_WITH_SEQNUM:
            await h.produce.handle(self, rq.read_produce_request(payload, with_seqnum=True))
        elif msg_id == MsgType.CONSUME:
            await h.consume.handle(self, rq.read_consume_request(payload))
        elif msg_id == MsgType.PING:
            return  # pings from clients are ignored, as TANK does
        elif msg_id == MsgType.DISCOVER_PARTITIONS:
            await h.admin.discover_partitions(self, rq.read_discover_partitions_request(payload))
        elif msg_id == MsgType.CREATE_TOPIC:
            await h.admin.create_topic(self, rq.read_create_topic_request(payload))
        elif msg_id == MsgType.RELOAD_CONF:
            await h.admin.reload_conf(self, rq.read_reload_conf_request(payload))
        elif msg_id == MsgType.STATUS:
            await h.admin.status(self, rq.read_status_request(payload))
        elif msg_id == MsgType.DISCOVER_TOPICS:
            await h.admin.discover_topics(self, rq.read_discover_topics_request(payload))
        elif msg_id == MsgType.DISCOVER_TOPOLOGY:
            await h.admin.discover_topology(self, rq.read_discover_topology_request(payload))
        else:
            raise CloseConnection(f"unsupported message id 0x{msg_id:02x}")

    async def send(self, msg_id: int, payload: bytes) -> None:
        """Queues one response. Responses queued in the same turn of the event loop (pipelined requests) go out in
        one write, so a burst of small responses costs one send() syscall rather than one each."""
        async with self.write_lock:
            if self.closed:
                return
            self._pending.append(encode_frame(msg_id, payload))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
            if self.writer.transport.get_write_buffer_size() > WRITE_BUFFER_HIGH_BYTES:
                await self._drain()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._pending and not self.closed:
            self.writer.write(b"".join(self._pending))
        self._pending.clear()

    async def send_consume(self, head: bytes, chunks) -> None:
        """A consume response: the frame head with the partition header, then every chunk in header order."""
        loop = asyncio.get_running_loop()
        async with self.write_lock:
            if self.closed:
                return
            self._flush()  # queued responses go first, in order
            self.writer.write(head)
            for chunk in chunks:
                if isinstance(chunk, FileChunk):
                    sent = await loop.sendfile(self.writer.transport, chunk.file, chunk.start, chunk.size)
                    if sent != chunk.size:
                        # The frame length is already on the wire: a short chunk would desynchronise the client.
                        log.error("sendfile sent %d of %d bytes to %s; closing", sent, chunk.size, self.peer)
                        self.abort()
                        return
                else:
                    self.writer.write(chunk.data)
            await self._drain()

    async def _drain(self) -> None:
        try:
            await self.writer.drain()
        except ConnectionError:
            self.abort()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.transport.abort()

    async def close(self) -> None:
        self._flush()
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        try:
            self.writer.close()
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
