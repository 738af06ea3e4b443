"""A lean TANK load generator, and the trivial server it is measured against alone.

The generator encodes each workload's produce request once (tiered.protocol: encode_bundle, encode_produce_request,
encode_frame) and then only patches the request id, so its cost per request is a few bytes of work plus the socket.
Responses are checked, not trusted: every produce response must be exactly `request_id, 0x00` (OK for the one
partition asked), and every consume response is parsed with `read_consume_response` and its chunk walked bundle by
bundle (lengths and headers, not the messages inside) to find the next seq, as a consumer must.

- `ProduceConn`: one connection producing one bundle per request to one partition. Closed loop with `window`
  requests pipelined in flight, or open loop at a fixed message rate (`rate_per_s`, one request per `bundle_msgs`
  messages, each latency measured from its scheduled send time, so a late sender does not hide queueing).
- `ConsumeConn`: one connection consuming one partition, one request in flight, from seq 0 to the hwmark and over
  again from the first seq the first answer named (the data is read repeatedly for the whole measuring time). Seq 0
  is asked once only: a broker may serve "first available" differently from the seq it stands for.
- `NullServer` (`python -m bench.loadgen null-server`): speaks just enough TANK to keep the generator busy: a ping
  on accept, `OK` for every produce, and for every consume a ready-made chunk (sent with sendfile) of copies of the
  bundle each connection first produced to that partition.
  The generator's figure against it is its own ceiling, reported beside each broker figure.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import struct
import tempfile
import time
from dataclasses import dataclass, field

from tiered.protocol import requests as rq
from tiered.protocol.bundle import CODEC_NONE, FLAG_SPARSE, Message, encode_bundle, read_bundle_header
from tiered.protocol.codes import ConsumeStatus
from tiered.protocol.consume_response import (
    ConsumePartitionResult,
    ConsumeTopicResult,
    encode_consume_head,
    read_consume_response,
)
from tiered.protocol.frame import FRAME_HEADER, MsgType, encode_frame
from tiered.protocol.varint import encode_varint, maybe_varint

U32 = struct.Struct("<I")
# Where the request id sits in a produce frame: after the frame header and the u16 client_version.
PRODUCE_ID_POSITION = FRAME_HEADER.size + 2
PRODUCE_OK = 0
FETCH_BYTES = 4 << 20
NULL_HWMARK = 1 << 62  # the null server's partitions never end


@dataclass(frozen=True)
class Shape:
    """A workload: messages of `msg_bytes` bytes of content, `bundle_msgs` of them per bundle (one per request)."""

    msg_bytes: int
    bundle_msgs: int

    @property
    def label(self) -> str:
        size = f"{self.msg_bytes // 1024}KiB" if self.msg_bytes % 1024 == 0 else f"{self.msg_bytes}B"
        return f"{size} x{self.bundle_msgs}"


def make_bundle(shape: Shape, seed: int = 0) -> bytes:
    """One uncompressed bundle of random (incompressible) contents, all with one timestamp."""
    rnd = random.Random(seed)
    ts_ms = int(time.time() * 1000)
    messages = [Message(rnd.randbytes(shape.msg_bytes), ts_ms=ts_ms) for _ in range(shape.bundle_msgs)]
    return encode_bundle(messages, codec=CODEC_NONE)


def produce_frame(topic: str, partition: int, bundle: bytes) -> bytes:
    req = rq.ProduceRequest(0, (rq.ProduceTopic(topic, (rq.ProducePartition(partition, bundle),)),))
    return encode_frame(MsgType.PRODUCE, rq.encode_produce_request(req))


def walk_chunk(chunk, base_seq: int) -> tuple[int, int]:
    """(messages in the whole bundles of `chunk`, the seq after them). A partial last bundle is left for later."""
    return _walk_uniform(chunk, base_seq) or _walk(chunk, base_seq)


def _walk_uniform(chunk, base_seq: int) -> tuple[int, int] | None:
    """The same answer in a few C-speed slices when every record of the chunk has the same length and header (what
    these workloads produce), checked by comparing each record's length prefix and bundle header with the first's;
    None when they differ, the first bundle is sparse or the chunk holds fewer than two whole records."""
    got = maybe_varint(chunk, 0)
    if got is None:
        return None
    size, start = got
    stride = start + size
    whole = len(chunk) // stride
    if size == 0 or whole < 2:
        return None
    header = read_bundle_header(chunk[start:stride])
    if header.sparse:
        return None
    view = memoryview(chunk)[:whole * stride]
    prefix = bytes(view[:start + header.header_len])
    for i, expected in enumerate(prefix):
        column = view[i::stride].tobytes()
        if column.count(expected) != whole:
            return None
    messages = whole * header.count
    return messages, base_seq + messages


def _walk(chunk, base_seq: int) -> tuple[int, int]:
    position = 0
    end = len(chunk)
    seq = base_seq
    messages = 0
    while position < end:
        b = chunk[position]
        if b < 0x80:
            size, start = b, position + 1
        else:
            got = maybe_varint(chunk, position)
            if got is None:
                break
            size, start = got
        stop = start + size
        if stop > end:
            break
        flags = chunk[start]
        count = (flags >> 2) & 0x0F
        if count == 0 or flags & FLAG_SPARSE:
            header = read_bundle_header(chunk[start:stop])
            count = header.count
            if header.sparse:
                seq = header.last_seq + 1 - count  # so that the line below lands after the sparse range
        seq += count
        messages += count
        position = stop
    return messages, seq


@dataclass
class ConnStats:
    messages: int = 0
    requests: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)
    first_error: str = ""


class _Connected:
    """What both load-generator connections do on connect and on loss: `connected` and `done` report it."""

    connected: asyncio.Future
    done: asyncio.Future | None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.connected.set_result(None)

    def connection_lost(self, exc) -> None:
        for fut in (self.connected, self.done):
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError(f"connection lost: {exc}"))


class ProduceConn(_Connected, asyncio.Protocol):
    """Produces `frame` (one bundle of `bundle_msgs` messages) until `stop_at` (time.monotonic()), and closed loop
    at most `max_requests` requests when given (a fixed amount of work, for counts that must not depend on speed)."""

    def __init__(self, frame: bytes, bundle_msgs: int, *, window: int = 32, rate_per_s: float | None = None,
                 record_latency: bool = False, max_requests: int | None = None):
        self.prefix = frame[:PRODUCE_ID_POSITION]
        self.suffix = frame[PRODUCE_ID_POSITION + U32.size:]
        self.bundle_msgs = bundle_msgs
        self.window = window
        self.rate_per_s = rate_per_s
        self.max_requests = max_requests
        self.record_latency = record_latency or rate_per_s is not None
        self.stats = ConnStats()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.next_id = 1
        self.sent_at: dict[int, float] = {}
        self.in_flight = 0
        self.stop_at = 0.0
        self.started_at = 0.0
        self.sending = False  # an open-loop sender still has requests to send
        self.done: asyncio.Future | None = None
        self.connected: asyncio.Future = asyncio.get_running_loop().create_future()

    def run(self, stop_at: float) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        self.stop_at = stop_at
        self.started_at = time.monotonic()
        self.sending = self.rate_per_s is not None
        if self.rate_per_s is None:
            self._send(self.window, self.started_at)
        else:
            self._tick()
        return self.done

    def _send(self, count: int, now: float, scheduled: list[float] | None = None) -> None:
        if self.max_requests is not None:
            count = min(count, self.max_requests - (self.next_id - 1))
        if count <= 0:
            return
        frames = []
        for i in range(count):
            rid = self.next_id
            self.next_id += 1
            if self.record_latency:
                self.sent_at[rid] = scheduled[i] if scheduled else now
            frames.append(self.prefix)
            frames.append(U32.pack(rid))
            frames.append(self.suffix)
        self.in_flight += count
        self.transport.write(b"".join(frames))

    def _tick(self) -> None:
        """Open loop: sends every request whose scheduled time has come, then sleeps until the next one is due."""
        now = time.monotonic()
        interval = self.bundle_msgs / self.rate_per_s
        due = min(now, self.stop_at)
        sent = self.next_id - 1
        count = int((due - self.started_at) / interval) + 1 - sent
        if count > 0:
            self._send(count, now, [self.started_at + (sent + i) * interval for i in range(count)])
            sent += count
        upcoming = self.started_at + sent * interval
        if upcoming < self.stop_at:
            asyncio.get_running_loop().call_later(max(0.0, upcoming - time.monotonic()), self._tick)
        else:
            self.sending = False
            self._maybe_done()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        position = 0
        end = len(buf)
        acked = 0
        now = time.monotonic()
        stats = self.stats
        while end - position >= FRAME_HEADER.size:
            msg_id, length = FRAME_HEADER.unpack_from(buf, position)
            stop = position + FRAME_HEADER.size + length
            if stop > end:
                break
            if msg_id == MsgType.PRODUCE:
                rid = U32.unpack_from(buf, position + FRAME_HEADER.size)[0]
                if length != U32.size + 1 or buf[stop - 1] != PRODUCE_OK:
                    stats.errors += 1
                    stats.first_error = stats.first_error or f"produce response {bytes(buf[position:stop]).hex()}"
                else:
                    stats.messages += self.bundle_msgs
                stats.requests += 1
                acked += 1
                if self.record_latency:
                    stats.latencies_s.append(now - self.sent_at.pop(rid))
            elif msg_id != MsgType.PING:
                stats.errors += 1
                stats.first_error = stats.first_error or f"unexpected message 0x{msg_id:02x}"
            position = stop
        if position:
            del buf[:position]
        self.in_flight -= acked
        if self.rate_per_s is None and now < self.stop_at:
            self._send(acked, now)
        self._maybe_done()

    def _maybe_done(self) -> None:
        # Closed loop: nothing is in flight only once sending stopped at stop_at. Open loop: the sender says.
        if self.done is not None and not self.done.done() and not self.in_flight and not self.sending:
            self.done.set_result(None)


class ConsumeConn(_Connected, asyncio.BufferedProtocol):
    """Consumes `topic`/`partition` from seq 0 to its hwmark, over and over, until `stop_at`."""

    def __init__(self, topic: str, partition: int, msg_bytes: int, fetch_bytes: int = FETCH_BYTES):
        self.topic = topic
        self.partition = partition
        self.fetch_bytes = fetch_bytes
        self.stats = ConnStats()
        self.bytes_consumed = 0
        self.buf = bytearray(fetch_bytes + (64 << 10))
        self.filled = 0
        self.seq = 0
        self.first_seq = 0  # learned from the first answer, and where each pass over the data starts again
        self.next_id = 1
        self.stop_at = 0.0
        self.transport = None
        self.done: asyncio.Future | None = None
        self.connected: asyncio.Future = asyncio.get_running_loop().create_future()

    def run(self, stop_at: float) -> asyncio.Future:
        self.done = asyncio.get_running_loop().create_future()
        self.stop_at = stop_at
        self._request()
        return self.done

    def _request(self) -> None:
        rid = self.next_id
        self.next_id += 1
        req = rq.ConsumeRequest(rid, 0, 0, (rq.ConsumeTopic(self.topic, (
            rq.ConsumePartition(self.partition, self.seq, self.fetch_bytes),)),))
        self.transport.write(encode_frame(MsgType.CONSUME, rq.encode_consume_request(req)))

    def get_buffer(self, sizehint: int):
        if self.filled >= FRAME_HEADER.size:
            need = FRAME_HEADER.size + FRAME_HEADER.unpack_from(self.buf, 0)[1]
            if need > len(self.buf):
                self.buf.extend(bytes(need - len(self.buf)))
        if self.filled == len(self.buf):
            self.buf.extend(bytes(64 << 10))
        return memoryview(self.buf)[self.filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        while self.filled >= FRAME_HEADER.size:
            msg_id, length = FRAME_HEADER.unpack_from(self.buf, 0)
            need = FRAME_HEADER.size + length
            if self.filled < need:
                return
            if msg_id == MsgType.CONSUME:
                with memoryview(self.buf) as view:
                    self._answered(view[FRAME_HEADER.size:need])
            elif msg_id != MsgType.PING:
                self._fail(f"unexpected message 0x{msg_id:02x}")
            rest = self.filled - need
            if rest:
                self.buf[:rest] = self.buf[need:self.filled]
            self.filled = rest

    def _answered(self, payload) -> None:
        resp = read_consume_response(payload)
        stats = self.stats
        stats.requests += 1
        part = resp.topics[0].partitions[0]
        if part.status not in (ConsumeStatus.OK, ConsumeStatus.SPARSE):
            self._fail(f"consume status 0x{part.status:02x}")
            return
        if part.chunk_len:
            messages, next_seq = walk_chunk(resp.chunks[0], part.base_seq)
            if not messages:
                self._fail(f"a chunk of {part.chunk_len} bytes holds no whole bundle (fetch size too small)")
                return
            stats.messages += messages
            self.bytes_consumed += part.chunk_len
            self.first_seq = self.first_seq or part.base_seq
            self.seq = next_seq if next_seq <= part.hwmark else self.first_seq
        else:
            self.seq = self.first_seq  # at the end: read everything again
        for chunk in resp.chunks:
            chunk.release()
        if time.monotonic() < self.stop_at:
            self._request()
        elif not self.done.done():
            self.done.set_result(None)

    def _fail(self, why: str) -> None:
        self.stats.errors += 1
        self.stats.first_error = self.stats.first_error or why
        if self.done is not None and not self.done.done():
            self.done.set_exception(RuntimeError(why))


async def open_conn(factory, port: int, host: str = "127.0.0.1"):
    _, conn = await asyncio.get_running_loop().create_connection(factory, host, port)
    await conn.connected
    return conn


# --- the null server ------------------------------------------------------------------------------------------------


class NullServer(asyncio.Protocol):
    """Answers produce with OK without looking inside, and consume with chunks of the last bundle produced, sent with
    sendfile from a file as the broker sends its segments (a copy through Python would make it the slower side)."""

    bundles: dict[tuple[str, int], bytes] = {}  # (topic, partition) -> the first bundle each connection produced
    chunks: dict[tuple[bytes, int], tuple[object, int]] = {}  # (bundle, fetch size) -> (file holding the chunk, size)

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buf = bytearray()
        self.learned = False
        self.sending = asyncio.Lock()  # consume responses go out whole, one after the other
        transport.write(encode_frame(MsgType.PING, b""))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        position = 0
        end = len(buf)
        out = []
        while end - position >= FRAME_HEADER.size:
            msg_id, length = FRAME_HEADER.unpack_from(buf, position)
            start = position + FRAME_HEADER.size
            stop = start + length
            if stop > end:
                break
            if msg_id == MsgType.PRODUCE:
                if not self.learned:
                    req = rq.read_produce_request(bytes(buf[start:stop]), with_seqnum=False)
                    for t in req.topics:
                        for p in t.partitions:
                            self.bundles[(t.name, p.partition)] = bytes(p.bundle)
                    self.learned = True
                out.append(FRAME_HEADER.pack(MsgType.PRODUCE, U32.size + 1))
                out.append(bytes(buf[start + 2:start + 6]))
                out.append(b"\x00")
            elif msg_id == MsgType.CONSUME:
                req = rq.read_consume_request(bytes(buf[start:stop]))
                asyncio.get_running_loop().create_task(self._consume(req))
            position = stop
        if position:
            del buf[:position]
        if out:
            self.transport.write(b"".join(out))

    async def _consume(self, req: rq.ConsumeRequest) -> None:
        topics, files = [], []
        for t in req.topics:
            results = []
            for p in t.partitions:
                file, size = self._chunk(self.bundles[(t.name, p.partition)], p.fetch_size)
                results.append(ConsumePartitionResult(p.partition, ConsumeStatus.OK, p.seq or 1, NULL_HWMARK, size))
                files.append((file, size))
            topics.append(ConsumeTopicResult(t.name, tuple(results), len(results)))
        loop = asyncio.get_running_loop()
        async with self.sending:
            self.transport.write(encode_consume_head(req.request_id, topics))
            for file, size in files:
                await loop.sendfile(self.transport, file, 0, size)

    def _chunk(self, bundle: bytes, fetch_size: int) -> tuple[object, int]:
        key = (bundle, fetch_size)
        if key not in self.chunks:
            record = encode_varint(len(bundle)) + bundle
            chunk = record * max(1, fetch_size // len(record))
            file = tempfile.TemporaryFile()
            file.write(chunk)
            file.flush()
            self.chunks[key] = (file, len(chunk))
        return self.chunks[key]


async def serve_null(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(NullServer, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    sub = parser.add_subparsers(dest="command", required=True)
    null = sub.add_parser("null-server", help="the trivial server the load generator is measured against alone")
    null.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if args.command == "null-server":
        try:
            asyncio.run(serve_null(args.port))
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
