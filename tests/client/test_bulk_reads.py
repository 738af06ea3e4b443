"""Bulk reads from a real broker: Client.consume_chunk against Client.consume on the same history (plain, keyed,
snappy and sparse bundles, small and big answers), and the connection's cutting of frames however the bytes
arrive (small frames, big frames received into their own buffer, both pipelined)."""

from __future__ import annotations

import asyncio
import random

from tiered.client import Client
from tiered.client.connection import BIG_FRAME_BYTES, READ_BYTES, Connection
from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, Message, encode_bundle, encode_record
from tiered.protocol.codes import UINT64_MAX, Endpoint
from tiered.protocol.frame import FRAME_HEADER, MAX_FRAME_BYTES, MsgType, encode_frame
from tiered.protocol.errors import ProtocolError


async def seed(client: Client) -> int:
    """A topic of 1,200 messages in bundles of every kind; returns its hwmark."""
    await client.create_topic("bulk", 1)
    rng = random.Random(7)
    produced = 0
    for i in range(40):
        count = rng.choice([1, 3, 15, 16, 64])
        messages = [Message(rng.randbytes(rng.choice([0, 10, 900, 5000])), rng.choice([None, b"", b"key"]),
                            1_700_000_000_000 + i) for _ in range(count)]
        await client.produce("bulk", 0, messages, codec=CODEC_SNAPPY if i % 3 == 0 else CODEC_NONE)
        produced += count
    return produced


async def test_consume_chunk_sums_up_what_consume_returns(client):
    hwmark = await seed(client)
    rng = random.Random(11)
    for _ in range(60):
        seq = rng.randint(1, hwmark + 1)
        fetch_bytes = rng.choice([1, 300, 4096, 65536, 1 << 20])
        end_seq = rng.choice([None, seq, seq + 5, hwmark])
        got = await client.consume("bulk", 0, seq, fetch_bytes=fetch_bytes)
        bulk = await client.consume_chunk("bulk", 0, seq, fetch_bytes=fetch_bytes, end_seq=end_seq)
        kept = [m for m in got.messages if end_seq is None or m.seq <= end_seq]
        s = bulk.summary
        assert (s.messages, s.value_bytes, s.ascending) == (len(kept), sum(len(m.value) for m in kept), True)
        assert (s.first, s.last) == ((kept[0].seq, kept[-1].seq) if kept else (0, 0))
        assert bulk.hwmark == got.hwmark and bulk.need_bytes == got.need_bytes and bulk.drained == got.drained
        if end_seq is None or not kept:
            assert bulk.next_seq == got.next_seq
        else:
            assert bulk.next_seq == kept[-1].seq + 1


async def test_a_bulk_drain_reads_every_seq_once_in_order_with_big_answers(client):
    hwmark = await seed(client)
    seq, fetches, values = 1, 0, 0
    while seq <= hwmark:
        got = await client.consume_chunk("bulk", 0, seq, fetch_bytes=256 * 1024)
        assert len(got.chunk) >= BIG_FRAME_BYTES or got.summary.last == hwmark  # big frames, but for the tail
        s = got.summary
        assert s.first == seq and s.ascending and s.last - s.first + 1 == s.messages
        seq, fetches, values = s.last + 1, fetches + 1, values + s.value_bytes
    assert values == sum([len(m.value) async for m in client.drain("bulk", 0, 0)])
    assert fetches > 3
    at_tail = await client.consume_chunk("bulk", 0, UINT64_MAX)
    assert at_tail.drained and at_tail.next_seq == hwmark + 1


class Sender:
    """A broker stand-in on a real socket: once `requests` empty requests arrived, sends the frames it is given,
    written in pieces."""

    def __init__(self, answers: list[bytes], pieces: list[int], requests: int) -> None:
        self.answers, self.pieces, self.requests = answers, pieces, requests

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(FRAME_HEADER.size * self.requests)
        data = b"".join(self.answers)
        position, i = 0, 0
        while position < len(data):
            size = self.pieces[i % len(self.pieces)]
            writer.write(data[position:position + size])
            await writer.drain()
            await asyncio.sleep(0)
            position, i = position + size, i + 1
        try:
            await reader.read()  # until the client closes
        except ConnectionError:
            pass
        writer.close()


def consume_answer(request_id: int, size: int) -> bytes:
    """A frame of message CONSUME whose payload carries `request_id` where a consume answer does."""
    body = bytes(range(256)) * (size // 256 + 1)
    payload = bytes(4) + request_id.to_bytes(4, "little") + body[request_id % 256:][:size]  # differs by request
    return encode_frame(MsgType.CONSUME, payload)


async def test_frames_are_cut_alike_however_the_bytes_arrive():
    sizes = [0, 10, BIG_FRAME_BYTES - 9, BIG_FRAME_BYTES - 8, READ_BYTES, 3 * READ_BYTES + 7, 5, 1 << 20]
    answers = [encode_frame(MsgType.PING, b"")] + [consume_answer(i + 1, size) for i, size in enumerate(sizes)]
    for pieces in ([1 << 20], [1], [7, 4093, 65536], [FRAME_HEADER.size + 3, 100_000]):
        if pieces == [1]:  # byte by byte: only the small frames and one big one, to keep the test short
            wanted = sizes[:4]
        else:
            wanted = sizes
        sender = Sender(answers[:len(wanted) + 1], pieces, len(wanted))
        server = await asyncio.start_server(sender.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await Connection.open(Endpoint("127.0.0.1", port), 5)
        got = await asyncio.gather(*(conn.call(MsgType.CONSUME, conn.request_id(), b"") for _ in wanted))
        for i, (payload, size) in enumerate(zip(got, wanted)):
            assert bytes(payload) == consume_answer(i + 1, size)[FRAME_HEADER.size:], (pieces, size)
        await conn.close()
        server.close()
        await server.wait_closed()


async def test_a_frame_past_the_limit_ends_the_connection():
    sender = Sender([FRAME_HEADER.pack(MsgType.CONSUME, MAX_FRAME_BYTES + 1)], [64], 1)
    server = await asyncio.start_server(sender.serve, "127.0.0.1", 0)
    conn = await Connection.open(Endpoint("127.0.0.1", server.sockets[0].getsockname()[1]), 5)
    try:
        await conn.call(MsgType.CONSUME, conn.request_id(), b"")
    except ProtocolError as exc:
        assert "exceeds" in exc.what
    else:
        raise AssertionError("a frame past 256 MiB was accepted")
    assert not conn.alive
    await conn.close()
    server.close()
    await server.wait_closed()


async def test_a_payload_held_is_never_overwritten_by_a_later_frame():
    """Big buffers are used again only when no payload view of them is alive: the payloads (and slices of them)
    kept here stay as they came while the dropped ones' buffers carry later frames."""
    sizes = [READ_BYTES * 3, READ_BYTES * 2, READ_BYTES * 3, READ_BYTES + 5, READ_BYTES * 3] * 3
    answers = [consume_answer(i + 1, size) for i, size in enumerate(sizes)]
    server = await asyncio.start_server(OneByOne(answers).serve, "127.0.0.1", 0)
    conn = await Connection.open(Endpoint("127.0.0.1", server.sockets[0].getsockname()[1]), 5)
    kept = []
    buffers = set()
    for i, size in enumerate(sizes):
        payload = await conn.call(MsgType.CONSUME, conn.request_id(), b"")
        buffers.add(id(payload.obj))  # a memoryview of its buffer: frames past READ_BYTES are received as big ones
        if i % 3 == 0:
            kept.append((i, payload[8:]))  # a slice holds the buffer as the payload does
        del payload
        for j, piece in kept:
            assert bytes(piece) == answers[j][FRAME_HEADER.size + 8:], (i, j)
    assert len(buffers) < len(sizes)  # buffers were used again
    await conn.close()
    server.close()
    await server.wait_closed()


class OneByOne:
    """Answers each empty request, as it comes, with the next of `answers`."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for answer in self.answers:
                await reader.readexactly(FRAME_HEADER.size)
                writer.write(answer)
                await writer.drain()
            await reader.read()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        writer.close()
