"""The child processes of bench.bench_remote, and the parent's handles on them.

- `Moto`: moto's S3 server (`ThreadedMotoServer`) in a child process.
- `Postgres`: a throwaway PostgreSQL cluster (initdb + pg_ctl in a temp dir, fsync off), run as `postgres` through
  runuser when we are root: the approach of tests/support/postgres.py, copied so that the benchmark does not
  import the tests.
- `ClientProcess`: the measuring client, `client_main` in a child process, answering one command at a time over a
  multiprocessing Pipe:

    ("create_topic", port, topic, config)                    -> None
    ("produce", port, topic, total_bytes, value_bytes, per_bundle)
                                                              -> (bytes, messages, seconds)
    ("connect", port)                                         -> None (a raw socket for "fetch")
    ("fetch", topic, seq, fetch_bytes)                        -> (first_byte_s, full_s, chunk_bytes)
    ("s3get", endpoint_url, bucket, object_key, start, end)   -> (first_byte_s, full_s, bytes)
    ("drain", port, topic, first_seq, last_seq, fetch_bytes, consumer)
                                                              -> (messages, value_bytes, seconds, fetches, cpu_s)
    ("probe", port, topic, seconds, interval_s)               -> (ack latencies, tail delivery latencies) in s
    ("stop",)

"fetch" times one consume request on a blocking socket: first byte is when the first byte of the response frame
arrives, full when its last does. The answer is then decoded and checked (status, the requested seq first), outside
the timing. A failed command sends its exception back, and the parent raises it.

Every process started here is stopped by its own pid, never by name.
"""

from __future__ import annotations

import asyncio
import glob
import multiprocessing
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import CODEC_NONE, Message
from tiered.protocol.chunk import read_chunk
from tiered.protocol.codes import ConsumeStatus
from tiered.protocol.consume_response import read_consume_response
from tiered.protocol.frame import FRAME_HEADER, MsgType, encode_frame

PRODUCE_WINDOW = 256  # produce requests in flight: 16 MiB of 64 KiB bundles, two blocks' worth (8 MiB blocks)


class Moto:
    """moto's S3 server in a child process; stopped by its pid."""

    SCRIPT = (
        "import sys\n"
        "from moto.server import ThreadedMotoServer\n"
        "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
        "s.start()\n"
        "print(s.get_host_and_port()[1], flush=True)\n"
        "sys.stdin.read()\n"  # until the parent closes our stdin or ends us
        "s.stop()\n"
    )

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.strip():
            raise RuntimeError(f"moto did not start (exit {self.proc.poll()})")
        self.url = f"http://127.0.0.1:{int(line)}"

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Postgres:
    """A throwaway cluster, started at construction; connections use trust auth as user `postgres`."""

    def __init__(self) -> None:
        bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
        if not bindirs:
            raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql")
        self.bindir = Path(bindirs[-1])
        self.root = Path(tempfile.mkdtemp(prefix="bench-remote-pg-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-A", "trust", "-U", "postgres", "-E", "UTF8", "-D", str(self.root / "data"))
        options = (f"-F -p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
                   " -c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "server.log"), "-o", options,
                  "start", "-w")

    def _run(self, *argv: str) -> None:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")

    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "stop", "-m", "immediate", "-w")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of `pid` (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class ClientProcess:
    """The measuring client, in a child process; each command is answered before the next is sent."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.proc = context.Process(target=client_main, args=(child,), name="bench-remote-client", daemon=True)
        self.proc.start()

    async def call(self, *command):
        """Sends a command and waits for its answer off the event loop, so the in-process broker keeps serving."""
        self.conn.send(command)
        answer = await asyncio.to_thread(self.conn.recv)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.send(("stop",))
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)


# -- the client child ------------------------------------------------------------------------------------------

def client_main(conn) -> None:
    session = _Session()
    while True:
        command = conn.recv()
        if command[0] == "stop":
            session.close()
            return
        try:
            conn.send(getattr(session, command[0])(*command[1:]))
        except Exception as exc:  # the parent raises it
            conn.send(exc)


class _Session:
    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.request_ids = iter(range(1, 1 << 31))
        self.s3 = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()

    # -- through the project's client ----------------------------------------------------------------------------

    def create_topic(self, port: int, topic: str, config: dict) -> None:
        async def go():
            async with await Client.connect("127.0.0.1", port) as c:
                await c.create_topic(topic, 1, config)

        asyncio.run(go())

    def produce(self, port: int, topic: str, total_bytes: int, value_bytes: int, per_bundle: int):
        blob = os.urandom(1 << 20)
        count = -(-total_bytes // value_bytes)
        bundles = -(-count // per_bundle)

        async def go() -> float:
            slots = asyncio.Semaphore(PRODUCE_WINDOW)
            async with await Client.connect("127.0.0.1", port) as c:

                async def one(b: int) -> None:
                    try:
                        first = b * per_bundle
                        messages = []
                        for i in range(first, min(first + per_bundle, count)):
                            at = (i * 7919) % (len(blob) - value_bytes)
                            messages.append(Message(blob[at:at + value_bytes], None, 1_700_000_000_000 + i))
                        await c.produce(topic, 0, messages, codec=CODEC_NONE)
                    finally:
                        slots.release()

                started = time.perf_counter()
                tasks = []
                for b in range(bundles):
                    await slots.acquire()
                    tasks.append(asyncio.create_task(one(b)))
                await asyncio.gather(*tasks)
                return time.perf_counter() - started

        seconds = asyncio.run(go())
        return count * value_bytes, count, seconds

    def drain(self, port: int, topic: str, first_seq: int, last_seq: int, fetch_bytes: int, consumer: str = "chunks"):
        """Every message first_seq..last_seq, counting the fetches, each seq checked to come once and in order, by
        one of the CONSUMERS: "chunks" (Client.consume_chunk: each chunk's messages read and checked natively, not
        built), "messages" (Client.consume: a Message per message, read natively) or "messages, pure Python"
        (Client.consume with the reference reader, as every consumer read before the native one)."""
        if consumer == "chunks":
            return self._drain_chunks(port, topic, first_seq, last_seq, fetch_bytes)
        from tiered.protocol import chunk as chunk_module

        native = chunk_module._native_read
        if consumer == "messages, pure Python":
            chunk_module._native_read = None
        try:
            return self._drain_messages(port, topic, first_seq, last_seq, fetch_bytes)
        finally:
            chunk_module._native_read = native

    def _drain_chunks(self, port: int, topic: str, first_seq: int, last_seq: int, fetch_bytes: int):
        async def read(c: Client, seq: int, size: int):
            got = await c.consume_chunk(topic, 0, seq, fetch_bytes=size, end_seq=last_seq)
            s = got.summary
            if s.messages:  # ascending from seq with no gap: each seq once, in order
                if s.first != seq or not s.ascending or s.last - s.first + 1 != s.messages:
                    raise RuntimeError(f"replay: expected seqs from {seq}, got {s}")
            return got, s.messages, s.messages, s.value_bytes

        return self._drain(port, first_seq, last_seq, fetch_bytes, read)

    def _drain_messages(self, port: int, topic: str, first_seq: int, last_seq: int, fetch_bytes: int):
        async def read(c: Client, seq: int, size: int):
            got = await c.consume(topic, 0, seq, fetch_bytes=size)
            taken = value_bytes = 0
            for m in got.messages:
                if m.seq > last_seq:
                    break
                if m.seq != seq + taken:
                    raise RuntimeError(f"replay: expected seq {seq + taken}, got {m.seq}")
                taken += 1
                value_bytes += len(m.value)
            return got, len(got.messages), taken, value_bytes

        return self._drain(port, first_seq, last_seq, fetch_bytes, read)

    def _drain(self, port: int, first_seq: int, last_seq: int, fetch_bytes: int, read):
        """The loop of both drains, on one connection: fetches from first_seq until last_seq was taken, the fetch
        size raised to what the broker asks for. `read(client, seq, size)` fetches from seq, checks that the seqs it
        takes come once and in order from seq, and returns (the response, the messages it held, the messages taken,
        their value bytes). Returns (messages, value bytes, seconds, fetches, CPU seconds)."""
        async def go():
            messages = value_bytes = fetches = 0
            seq, size = first_seq, fetch_bytes
            async with await Client.connect("127.0.0.1", port) as c:
                started = time.perf_counter()
                while seq <= last_seq:
                    got, held, taken, taken_bytes = await read(c, seq, size)
                    fetches += 1
                    messages += taken
                    value_bytes += taken_bytes
                    seq += taken
                    if got.need_bytes > size:
                        size = got.need_bytes
                    elif not held:
                        raise RuntimeError(f"replay stopped at seq {seq}: no messages (hwmark {got.hwmark})")
                return messages, value_bytes, time.perf_counter() - started, fetches

        return _with_cpu_s(go)

    def probe(self, port: int, topic: str, seconds: float, interval_s: float):
        """A producer sending one small message every `interval_s` with durable acks, timing each ack, and a tail
        consumer long-polling the same partition, timing each message from its send to its delivery."""
        async def go():
            acks: list[float] = []
            deliveries: list[float] = []
            async with await Client.connect("127.0.0.1", port) as prod, \
                    await Client.connect("127.0.0.1", port) as cons:
                start_seq = (await cons.consume(topic, 0, 0, fetch_bytes=1)).hwmark + 1
                stop = time.perf_counter() + seconds
                sent = 0

                async def tail() -> None:
                    seq = start_seq
                    while len(deliveries) < sent or time.perf_counter() < stop:
                        got = await cons.consume(topic, 0, seq, fetch_bytes=1 << 16, max_wait_ms=500)
                        now = time.perf_counter()
                        for m in got.messages:
                            deliveries.append(now - float(m.value))
                            seq = m.seq + 1
                        if time.perf_counter() > stop + 10:
                            return

                async def one(before: float) -> None:
                    await prod.produce(topic, 0, [Message(repr(before).encode(), None, int(time.time() * 1000))])
                    acks.append(time.perf_counter() - before)

                tailing = asyncio.create_task(tail())
                producing = []
                while time.perf_counter() < stop:  # one produce every interval, each waiting for its own ack
                    before = time.perf_counter()
                    producing.append(asyncio.create_task(one(before)))
                    sent += 1
                    await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - before)))
                await asyncio.gather(*producing)
                await tailing
            return acks, deliveries

        return asyncio.run(go())

    # -- raw, for timing -----------------------------------------------------------------------------------------

    def connect(self, port: int) -> None:
        self.close()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self._skip_pings()  # the broker introduces itself with one ping on accept

    def _skip_pings(self) -> None:
        while len(self.buf) < FRAME_HEADER.size:
            self.buf += self.sock.recv(1 << 16)
        while len(self.buf) >= FRAME_HEADER.size and self.buf[0] == MsgType.PING:
            del self.buf[:FRAME_HEADER.size]

    def fetch(self, topic: str, seq: int, fetch_bytes: int):
        request_id = next(self.request_ids)
        part = rq.ConsumePartition(0, seq, fetch_bytes)
        req = rq.ConsumeRequest(request_id, 0, 0, (rq.ConsumeTopic(topic, (part,)),))
        frame = encode_frame(MsgType.CONSUME, rq.encode_consume_request(req))
        buf = self.buf
        started = time.perf_counter()
        self.sock.sendall(frame)
        first = None
        while True:
            if len(buf) >= FRAME_HEADER.size:
                msg_id, length = FRAME_HEADER.unpack_from(buf)
                if msg_id == MsgType.PING:
                    del buf[:FRAME_HEADER.size]
                    first = None if not buf else first
                    continue
                if len(buf) >= FRAME_HEADER.size + length:
                    break
            data = self.sock.recv(4 << 20)
            now = time.perf_counter()
            if not data:
                raise ConnectionError("the broker closed the connection")
            if first is None:
                first = now
            buf += data
        full = now - started
        payload = bytes(buf[FRAME_HEADER.size:FRAME_HEADER.size + length])
        del buf[:FRAME_HEADER.size + length]
        if msg_id != MsgType.CONSUME:
            raise RuntimeError(f"expected a consume response, got message 0x{msg_id:02x}")
        resp = read_consume_response(payload)
        p = resp.topics[0].partitions[0]
        if p.status != ConsumeStatus.OK or not p.chunk_len:
            raise RuntimeError(f"fetch of {topic}/0 at {seq}: status 0x{p.status:02x}, {p.chunk_len} bytes")
        read = read_chunk(resp.chunks[0], p.base_seq, seq, p.hwmark)
        if not read.messages or read.messages[0].seq != seq:
            raise RuntimeError(f"fetch at {seq} began at {read.messages[0].seq if read.messages else None}")
        return first - started, full, p.chunk_len

    def s3get(self, endpoint_url: str, bucket: str, object_key: str, start: int, end: int):
        if self.s3 is None:
            import boto3

            self.s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1")
        started = time.perf_counter()
        response = self.s3.get_object(Bucket=bucket, Key=object_key, Range=f"bytes={start}-{end - 1}")
        body = response["Body"]
        first = body.read(1)  # headers parsed and the first body byte in
        first_s = time.perf_counter() - started
        rest = body.read()
        full_s = time.perf_counter() - started
        size = len(first) + len(rest)
        if size != end - start:
            raise RuntimeError(f"moto returned {size} bytes for {end - start}")
        return first_s, full_s, size


def _with_cpu_s(go):
    """Runs the coroutine function `go` (returning a tuple) and appends this process's CPU seconds it took."""
    cpu = os.times()
    result = asyncio.run(go())
    done = os.times()
    return (*result, done.user + done.system - cpu.user - cpu.system)
