"""Latency of small consume requests from the local disk: what a consumer reading one answer at a time waits.

    python -m bench.bench_consume_latency [--quick | --smoke]

One local-only broker (the App of `tiered serve` with `local_only=True`) and its client in this one process, over
127.0.0.1, plaintext and TLS. One partition of 100-byte messages, one per bundle; the client asks for each seq in
turn with one request in flight (a consumer tailing a partition, or walking it in small fetches), at three fetch
sizes. An answer is the frame head written first, then the segment's bytes (sendfile, or pread + the TLS
transport): with Nagle's algorithm on the broker's socket the second send waited for the client's delayed ACK of
the first, about 40 ms on Linux (44 ms per answer before the broker turned it off: docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import format_table
from bench.bench_tls import make_certs
from bench.sizes import add_size_options, cannot_run, size_of
from tiered.client import Client
from tiered.config import Settings
from tiered.protocol.bundle import Message
from tiered.server.app import App
from tiered.tls import client_context

FETCH_BYTES = (256, 4096, 65536)


async def measure(folder: Path, tls: bool, messages: int) -> list[tuple[str, int, int, float, float, float]]:
    """(transport, fetch bytes, answers, p50 ms, p99 ms, answers/s) per fetch size."""
    extra = {"tls_cert": str(folder / "server.pem"), "tls_key": str(folder / "server.key")} if tls else {}
    settings = Settings(data_dir=folder / f"data-{tls}", listen="127.0.0.1:0", http_listen="off", **extra)
    app = App(settings, local_only=True)
    await app.start()
    rows = []
    try:
        ctx = client_context(str(folder / "ca.pem")) if tls else None
        async with await Client.connect("127.0.0.1", app.broker.port, ssl_context=ctx) as client:
            await client.create_topic("lat", 1, {"produce.ack": "local"})
            for i in range(messages):
                await client.produce("lat", 0, [Message(b"%0100d" % i, None, 1_700_000_000_000 + i)])
            for fetch_bytes in FETCH_BYTES:
                waits = []
                started = time.perf_counter()
                for seq in range(1, messages + 1):
                    t = time.perf_counter()
                    got = await client.consume("lat", 0, seq, fetch_bytes=fetch_bytes)
                    waits.append(time.perf_counter() - t)
                    assert got.messages and got.messages[0].seq == seq, (seq, got)
                took = time.perf_counter() - started
                waits.sort()
                rows.append(("TLS" if tls else "plaintext", fetch_bytes, len(waits),
                             statistics.median(waits) * 1000, waits[int(len(waits) * 0.99) - 1] * 1000,
                             len(waits) / took))
    finally:
        await app.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_consume_latency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, quick="300 answers per row", smoke="20 answers per row")
    args = parser.parse_args(argv)
    size = size_of(args)
    if not shutil.which("openssl"):
        cannot_run("the TLS rows need the openssl command")
    messages = size.pick(2000, 300, 20)
    folder = Path(tempfile.mkdtemp(prefix="tiered-bench-consume-latency-"))
    try:
        make_certs(folder, ("server",))
        rows = asyncio.run(measure(folder, False, messages)) + asyncio.run(measure(folder, True, messages))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"Small consume requests from the local disk, one in flight, 100-byte messages one per bundle; "
          f"broker and client in one process over 127.0.0.1")
    print(format_table(("transport", "fetch bytes", "answers", "p50 ms", "p99 ms", "answers/s"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
