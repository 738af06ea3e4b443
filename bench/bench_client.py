"""`python -m bench.bench_client [--quick | --smoke]`: what one request costs the client (tiered.client) itself.

The client talks to the load generator's NullServer (bench/loadgen.py; a child process, so the two use both cores),
which answers every produce OK and every consume with a ready-made chunk at once: the figures are the client's
CPU per request (encoding, the routing of each request by partition, decoding) plus one loopback round trip, not a
broker's. Each workload runs once to warm up, then `--repeat` times (default 5); the table shows the best run's wall
time and the client process's CPU time in it (time.process_time: the client's own cost, less disturbed by other
processes on a shared machine). Workloads, each on one `Client.connect` connection to one partition, 100-byte
messages:

    produce 1 msg, 1 in flight      one request after another
    produce 1 msg, 64 in flight     64 tasks producing at once (as `tiered produce --in-flight 64`)
    produce 100 msgs, 64 in flight  bundles of 100
    consume 64 KiB, 1 in flight     `consume` one after another, each chunk decoded into messages
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

from bench import format_table
from bench.sizes import add_size_options, size_of
from tiered.client import Client

MESSAGE = b"m" * 100


async def _produce(client: Client, requests: int, in_flight: int, per_bundle: int) -> None:
    bundle = [MESSAGE] * per_bundle
    left = iter(range(requests))

    async def worker() -> None:
        for _ in left:
            await client.produce("bench", 0, bundle)

    await asyncio.gather(*(worker() for _ in range(in_flight)))


async def _consume(client: Client, requests: int) -> None:
    for _ in range(requests):
        got = await client.consume("bench", 0, 1, fetch_bytes=64 << 10)
        assert got.messages


async def measure(port: int, requests: int, repeat: int) -> list[tuple[str, int, float, float]]:
    rows = []
    workloads = [
        ("produce 1 msg, 1 in flight", lambda c: _produce(c, requests, 1, 1)),
        ("produce 1 msg, 64 in flight", lambda c: _produce(c, requests, 64, 1)),
        ("produce 100 msgs, 64 in flight", lambda c: _produce(c, requests, 64, 100)),
        ("consume 64 KiB, 1 in flight", lambda c: _consume(c, requests // 4)),
    ]
    async with await Client.connect("127.0.0.1", port) as client:
        await client.produce("bench", 0, [MESSAGE])  # the bundle the null server serves to consumes
        for name, run in workloads:
            await run(client)  # warm up
            runs = []
            for _ in range(repeat):
                wall, cpu = time.perf_counter(), time.process_time()
                await run(client)
                runs.append((time.perf_counter() - wall, time.process_time() - cpu))
            count = requests // 4 if name.startswith("consume") else requests
            rows.append((name, count, *min(runs)))
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_client")
    add_size_options(parser, quick="fewer requests", smoke="100 requests, one measured run")
    parser.add_argument("--repeat", type=int, help="measured runs of each workload (the best is shown; default 5)")
    args = parser.parse_args()
    size = size_of(args)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.loadgen", "null-server", "--port", str(port)])
    try:
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.02)
        rows = asyncio.run(measure(port, size.pick(10_000, 2_000, 100), args.repeat or size.pick(5, 5, 1)))
    finally:
        server.terminate()
        server.wait(10)
    print(format_table(("workload", "requests", "seconds", "requests/s", "µs/request", "client CPU µs/request"),
                       [(n, k, s, round(k / s), round(s / k * 1e6), round(c / k * 1e6)) for n, k, s, c in rows]))


if __name__ == "__main__":
    main()
