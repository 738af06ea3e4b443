"""`python -m bench.floor_server --port P --dir D --mode M`: the least a Python server can do to store produce requests.

The append benchmark (issue 13) prints these beside the broker, so that each broker figure can be read against what
any server written in Python pays on this machine for the same bytes. A floor server takes TANK produce requests,
writes each request's payload, unparsed, to one file through the page cache (as the broker writes its segment) and
answers OK (`request_id, 0x00`, what the load generator checks). It parses nothing but the frame header and the
request id; it keeps no index, builds no block, uploads nothing and commits nothing. So a broker cannot cost less
than its floor, whatever else it must do.

- `asyncio`: an `asyncio.BufferedProtocol` on the default event loop, as the broker's connections are: received into
  a 256 KiB buffer (a bigger frame gets one of its own size); every whole frame is written straight from that buffer,
  one write per frame, and the answers to one read go out in one send.
- `blocking`: one thread per connection, blocking `recv_into` of up to 4 MiB, one write per read for all the whole
  frames it holds and one send for their answers: the fewest system calls Python can make for these bytes, close to
  the kernel's own cost for the socket and the page cache.
- `null`: as `asyncio`, but writes nothing: the socket and the event loop alone.

Each sends TANK's Ping on accept (the load generator waits for it) and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from bench.harness import REPO, die_with_parent, free_port, process_cpu_s, stop_process, wait_for_port
from tiered.protocol.frame import FRAME_HEADER, MsgType, encode_frame

MODES = ("asyncio", "blocking", "null")
READ_BYTES = 256 * 1024  # the asyncio server's receive buffer, as the broker's
BLOCKING_READ_BYTES = 4 << 20
ID_AT = FRAME_HEADER.size + 2  # a produce request's id follows the frame header and the u16 client version
ANSWER_HEADER = FRAME_HEADER.pack(MsgType.PRODUCE, 5)
U32 = struct.Struct("<I")
PING = encode_frame(MsgType.PING, b"")


def whole_frames(buf: bytearray | memoryview, start: int, end: int) -> list[tuple[int, int]]:
    """(start, stop) of every whole frame in buf[start:end], in order."""
    frames = []
    while end - start >= FRAME_HEADER.size:
        stop = start + FRAME_HEADER.size + FRAME_HEADER.unpack_from(buf, start)[1]
        if stop > end:
            break
        frames.append((start, stop))
        start = stop
    return frames


def answer(buf: bytearray | memoryview, start: int) -> bytes:
    """OK to the produce request framed at `start` (the answer the load generator checks)."""
    return ANSWER_HEADER + bytes(buf[start + ID_AT : start + ID_AT + U32.size]) + b"\x00"


def new_file(directory: Path) -> int:
    """A new file for one connection's requests."""
    return os.open(directory / f"{next(_numbers)}.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)


_numbers = itertools.count()


def make_room(buf: bytearray, start: int, end: int) -> tuple[bytearray, int, int]:
    """For a full receive buffer holding a partial frame at buf[start:end]: (buffer, 0, end - start) with that frame
    at the front. It moves there when it does not start the buffer; when it does (one frame fills the buffer), it gets
    a new buffer of its own size, at least twice the old one."""
    have = end - start
    if start == 0:
        length = FRAME_HEADER.unpack_from(buf, 0)[1] + FRAME_HEADER.size
        grown = bytearray(max(length, 2 * len(buf)))
        grown[:have] = buf
        return grown, 0, have
    buf[:have] = buf[start:end]
    return buf, 0, have


class AsyncFloor(asyncio.BufferedProtocol):
    def __init__(self, directory: Path | None):
        self.fd = None if directory is None else new_file(directory)  # None: `null` mode writes nothing
        self.buf = bytearray(READ_BYTES)
        self.start = self.end = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(PING)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.end == len(self.buf):
            self.buf, self.start, self.end = make_room(self.buf, self.start, self.end)
        return memoryview(self.buf)[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        with memoryview(self.buf) as view:
            frames = whole_frames(view, self.start, self.end)
            if self.fd is not None:
                for start, stop in frames:
                    os.write(self.fd, view[start + FRAME_HEADER.size : stop])  # one write per request, as a segment's
            answers = [answer(view, start) for start, _ in frames]
        if frames:
            self.start = frames[-1][1]
            if self.start == self.end:
                self.start = self.end = 0
            self.transport.write(b"".join(answers))


def serve_blocking(listener: socket.socket, directory: Path) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_blocking_connection, args=(conn, directory), daemon=True).start()


def _blocking_connection(conn: socket.socket, directory: Path) -> None:
    fd = new_file(directory)
    buf = bytearray(BLOCKING_READ_BYTES)
    view = memoryview(buf)
    start = end = 0
    with conn, open(fd, "wb", closefd=True):
        conn.sendall(PING)
        while True:
            if end == len(buf):
                buf, start, end = make_room(buf, start, end)
                if view.obj is not buf:
                    view.release()
                    view = memoryview(buf)
            n = conn.recv_into(view[end:])
            if not n:
                return
            end += n
            frames = whole_frames(view, start, end)
            if frames:
                stop = frames[-1][1]
                os.write(fd, view[start:stop])  # the frames' headers too: one write per read
                conn.sendall(b"".join(answer(view, at) for at, _ in frames))
                start = stop
            if start == end:
                start = end = 0


async def serve_async(port: int, directory: Path | None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: AsyncFloor(directory), "127.0.0.1", port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


class FloorProcess:
    """A floor server in a child process of its own (so that its CPU time can be read alone), as the harness's
    BrokerProcess: `port`, `start()`, `pid`, `cpu_s()`, `stop()`; `wrapper` is a command the interpreter runs under
    (valgrind, say) and `env` is added to the environment."""

    def __init__(self, directory: Path, mode: str, wrapper: Sequence[str] = (), env: dict[str, str] | None = None):
        self.directory = directory
        self.mode = mode
        self.wrapper = tuple(wrapper)
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> "FloorProcess":
        self.proc = subprocess.Popen([*self.wrapper, sys.executable, "-m", "bench.floor_server", "--port",
                                      str(self.port), "--dir", str(self.directory), "--mode", self.mode], cwd=REPO,
                                     env=self.env, preexec_fn=die_with_parent)
        wait_for_port(self.port, self.proc, timeout_s, f"the {self.mode} floor server", Path("/dev/null"),
                      greeting=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def cpu_s(self) -> float:
        return process_cpu_s(self.pid)

    def stop(self) -> None:
        stop_process(self.proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True, help="where the files of written requests go (one per "
                                                                   "connection)")
    parser.add_argument("--mode", choices=MODES, required=True)
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    directory = None if args.mode == "null" else args.dir
    if args.mode == "blocking":
        listener = socket.create_server(("127.0.0.1", args.port))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            serve_blocking(listener, args.dir)
        except (KeyboardInterrupt, SystemExit):
            return 0
    asyncio.run(serve_async(args.port, directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
