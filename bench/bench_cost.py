"""What the design costs (issue 25): PUTs and dollars per GiB ingested, read from the cost meter
(`tiered_object_requests_total`), for a few loads, next to what one PUT per partition per 250 ms would cost.

    python -m bench.bench_cost [--quick | --smoke] [--backend file+sqlite|s3+postgresql]

One fresh `tiered serve` per load, one durable topic. Loads: one topic at a high rate (1 KiB x 1000 bundles, closed
loop, 8 partitions on 8 connections); 1,000 partitions at a low rate (one 100-byte message per partition per second,
open loop, one connection per partition); and a moderate rate (100 msgs/s of 100 B over 8 partitions) under each
block policy, cost-first (the default, 250 ms blocks) and latency-first (`--block-linger-ms 5`, at most 10 early
closes a second). Every request the broker made for the topic counts: block PUTs, and the sealed segments' and
indexes' copies (`segment PUTs` = every put-class request minus the blocks). Dollars are S3 Standard us-east-1 list
prices (tiered/cost_report.py). The comparison is a design that PUTs each partition's records on their own every
250 ms: one PUT per partition per 250 ms window that received a record (min(4, bundles per second) per partition per
second), priced the same way, segment copies left out of it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import format_table
from bench.bench_broker import create_topic, produce
from bench.bench_durable import _delta, backends, start_backend, wait_committed
from bench.harness import BrokerProcess
from bench.loadgen import Shape
from bench.sizes import Size, add_size_options, size_of
from tiered.cost_report import PUT_CLASS, S3_STANDARD_US_EAST_1

GIB = float(1 << 30)
TOPIC = "cost"
LATENCY_FIRST = ("--block-linger-ms", "5", "--block-max-puts-per-s", "10")
_REQUESTS = re.compile(r'^tiered_object_requests_total\{topic="([^"]*)",op="([^"]*)"\}$')


@dataclass(frozen=True)
class Load:
    name: str
    partitions: int
    shape: Shape
    rate_per_s: float | None  # messages a second in all (open loop); None: closed loop
    policy: tuple[str, ...] = ()


LOADS = (
    Load("1 topic, high rate", 8, Shape(1024, 1000), None),
    Load("1,000 partitions, low rate", 1000, Shape(100, 1), 1000.0),
    Load("100 msgs/s, cost-first", 8, Shape(100, 1), 100.0),
    Load("100 msgs/s, latency-first", 8, Shape(100, 1), 100.0, LATENCY_FIRST),
)


@dataclass
class LoadResult:
    backend: str
    load: str
    seconds: float
    gib: float
    block_puts: float
    puts: float  # every put-class request for the topic
    gets: float
    naive_puts: float

    def dollars(self, puts: float, gets: float = 0.0) -> float:
        prices = S3_STANDARD_US_EAST_1.per_1000_requests
        return (puts * prices["put"] + gets * prices["get"]) / 1000

    def per_gib(self, value: float) -> float:
        return value / self.gib if self.gib else float("nan")


def requests(metrics: dict[str, float], topic: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if (m := _REQUESTS.match(name)) and m.group(1) == topic:
            out[m.group(2)] = value
    return out


async def wait_led(broker: BrokerProcess, partitions: int, timeout_s: float = 120.0) -> None:
    """Until the broker leads every partition: a new topic's partitions are claimed in batches after it is created,
    and a produce before its claim is answered "no leader yet"."""
    deadline = time.monotonic() + timeout_s
    while broker.metrics().get("tiered_leaderships", 0) < partitions:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker leads fewer than {partitions} partitions after {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


async def run_load(backend_name: str, load: Load, size: Size, log) -> LoadResult:
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-cost-"))
    backend = start_backend(backend_name, root)
    try:
        broker = BrokerProcess(root / "data", *backend.args, *load.policy, env=backend.env).start()
        try:
            await create_topic(broker.port, TOPIC, load.partitions, {"produce.ack": "durable"})
            await wait_led(broker, load.partitions)
            before = await wait_committed(broker)
            seconds = size.pick(20.0, 6.0, 1.0)
            log(f"  {backend_name}: {load.name} for {seconds:.0f} s ...")
            window = 8 if load.rate_per_s is None else None
            m = await produce(broker.port, TOPIC, load.shape, load.partitions, seconds, broker.cpu_s, window=window,
                              rate_per_s=load.rate_per_s)
            if m.errors:
                raise RuntimeError(f"{load.name}: {m.errors} failed requests, the first: {m.first_error}")
            after = await wait_committed(broker)
        finally:
            broker.stop()
    finally:
        backend.stop()
        shutil.rmtree(root, ignore_errors=True)
    counted_before, counted_after = requests(before, TOPIC), requests(after, TOPIC)
    delta = {op: counted_after.get(op, 0.0) - counted_before.get(op, 0.0) for op in counted_after}
    bundles_per_partition = m.messages / load.shape.bundle_msgs / load.partitions
    naive = load.partitions * min(bundles_per_partition, math.ceil(m.seconds * 4))
    produced = f'tanksrv_topic_produced_bytes{{m="{TOPIC}"}}'  # exported from the topic's first produce on
    return LoadResult(
        backend=backend_name, load=load.name, seconds=m.seconds,
        gib=(after.get(produced, 0.0) - before.get(produced, 0.0)) / GIB,
        block_puts=_delta(after, before, "tiered_blocks_uploaded_total"),
        puts=sum(delta.get(op, 0.0) for op in PUT_CLASS),
        gets=delta.get("get", 0.0) + delta.get("head", 0.0),
        naive_puts=naive,
    )


def report(results: list[LoadResult]) -> str:
    rows = []
    for r in results:
        dollars = r.dollars(r.puts, r.gets)
        naive = r.dollars(r.naive_puts)
        rows.append([r.backend, r.load, round(r.seconds, 1), r.gib * 1024, r.block_puts, r.puts - r.block_puts,
                     r.per_gib(r.puts), f"{r.per_gib(dollars):.4f}", r.naive_puts, r.per_gib(r.naive_puts),
                     f"{r.per_gib(naive):.4f}", naive / dollars if dollars else float("nan")])
    return format_table(
        ("backend", "load", "s", "MiB ingested", "block PUTs", "segment PUTs", "PUTs/GiB", "$/GiB",
         "per-partition PUTs", "per-partition PUTs/GiB", "per-partition $/GiB", "x"), rows,
        f"PUTs and request dollars per GiB ingested, from the cost meter ({S3_STANDARD_US_EAST_1.name}); "
        f"per-partition: one PUT per partition per 250 ms; x: how many times the per-partition design costs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cost", description=__doc__.split("\n\n")[0])
    add_size_options(parser, quick="6 s per load", smoke="1 s per load (figures mean nothing)")
    parser.add_argument("--backend", action="append", choices=["file+sqlite", "s3+postgresql"])
    args = parser.parse_args(argv)
    size = size_of(args)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    async def everything() -> list[LoadResult]:
        return [await run_load(name, load, size, log)
                for name in backends(Size.QUICK, args.backend, log) for load in LOADS]

    print(report(asyncio.run(everything())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
