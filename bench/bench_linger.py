"""The two block policies side by side (issue 13): durable ack latency and PUTs at 1, 100 and 10,000 msgs/s, and
PUTs per GiB at a high rate, for cost-first (the default: a block waits out `block_max_age_ms`, 250 ms) and
latency-first (`--block-linger-ms 5`: with no upload in flight a block closes 5 ms after its oldest record; early
closes at most `block_max_puts_per_s` = 10 a second).

    python -m bench.bench_linger [--quick | --smoke] [--backend file+sqlite|s3+postgresql ...]

One fresh `tiered serve` per backend and policy, one durable topic of 8 partitions. Latency: open-loop producers of
100-byte messages on one connection, from each request's scheduled send time to its response (bench_durable's
method): 1 msg/s, 100 msgs/s, and 10,000 msgs/s as 10-message bundles every millisecond. PUTs per hour are the PUTs
of each run scaled to an hour. High rate: 1 KiB x 1000 bundles on 8 connections (window 8), PUTs per GiB ingested
(goal: at most 130 for both policies).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench import format_table, percentile
from bench.bench_broker import create_topic, produce
from bench.bench_durable import LATENCY_RUNS, PARTITIONS, _delta, backends, start_backend, wait_committed
from bench.harness import BrokerProcess
from bench.loadgen import Shape
from bench.sizes import Size, add_size_options, size_of

POLICIES = {"cost-first": (), "latency-first": ("--block-linger-ms", "5", "--block-max-puts-per-s", "10")}
HIGH_RATE = Shape(1024, 1000)
GIB = 1 << 30


@dataclass
class PolicyResult:
    backend: str
    policy: str
    latency: list[tuple[float, int, float, float, float, int, float, int]] = field(default_factory=list)
    # (rate, samples, achieved msgs/s, p50 ms, p99 ms, PUTs, PUTs per hour, errors)
    ingest_gib: float = 0.0
    ingest_puts: int = 0
    early_closes: int = 0


async def run_policy(backend_name: str, policy: str, size: Size, log) -> PolicyResult:
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-linger-"))
    backend = start_backend(backend_name, root)
    result = PolicyResult(backend_name, policy)
    try:
        broker = BrokerProcess(root / "data", *backend.args, *POLICIES[policy], env=backend.env).start()
        try:
            await create_topic(broker.port, "durable", PARTITIONS, {"produce.ack": "durable"})
            for run in LATENCY_RUNS:
                if run.full_only:
                    continue
                seconds = run.seconds_at(size)
                log(f"  {backend_name}, {policy}: {run.rate_per_s:,.0f} msgs/s ({run.shape.label}) ...")
                before = await wait_committed(broker)
                m = await produce(broker.port, "durable", run.shape, 1, seconds, broker.cpu_s,
                                  rate_per_s=run.rate_per_s)
                after = await wait_committed(broker)
                puts = int(_delta(after, before, "tiered_store_puts_total"))
                xs = m.latencies_s or []
                result.latency.append((run.rate_per_s, len(xs), m.msgs_per_s, percentile(xs, 0.5) * 1000,
                                       percentile(xs, 0.99) * 1000, puts, puts * 3600.0 / m.seconds, m.errors))
            log(f"  {backend_name}, {policy}: high rate ({HIGH_RATE.label}, 8 connections) ...")
            before = await wait_committed(broker)
            m = await produce(broker.port, "durable", HIGH_RATE, 8, size.pick(6.0, 2.0, 0.3), broker.cpu_s, window=8)
            after = await wait_committed(broker)
            result.ingest_puts = int(_delta(after, before, "tiered_store_puts_total"))
            result.ingest_gib = _delta(after, before, 'tanksrv_topic_produced_bytes{m="durable"}') / GIB
            result.early_closes = int(after.get("tiered_blocks_closed_early_total", 0))
        finally:
            broker.stop()
    finally:
        backend.stop()
        shutil.rmtree(root, ignore_errors=True)
    return result


def report(results: list[PolicyResult]) -> str:
    latency_rows = [[r.backend, r.policy, rate, samples, achieved, p50, p99, puts, per_hour, errors]
                    for r in results for rate, samples, achieved, p50, p99, puts, per_hour, errors in r.latency]
    ingest_rows = [[r.backend, r.policy, r.ingest_gib, r.ingest_puts,
                    r.ingest_puts / r.ingest_gib if r.ingest_gib else float("nan"), r.early_closes] for r in results]
    return "\n\n".join((
        format_table(("backend", "policy", "msgs/s", "samples", "achieved msgs/s", "ack p50 ms", "ack p99 ms", "PUTs",
                      "PUTs/hour", "errors"), latency_rows,
                     "Durable ack latency by block policy (open loop, 100 B messages, one connection)"),
        format_table(("backend", "policy", "GiB ingested", "PUTs", "PUTs/GiB", "early closes (whole run)"),
                     ingest_rows, f"High rate ({HIGH_RATE.label}, 8 connections, window 8): goal ≤ 130 PUTs/GiB"),
    ))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_linger", description=__doc__.split("\n\n")[0])
    add_size_options(parser, quick="short runs, file+sqlite only", smoke="shortest runs, file+sqlite only")
    parser.add_argument("--backend", action="append", choices=["file+sqlite", "s3+postgresql"])
    args = parser.parse_args(argv)
    size = size_of(args)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    async def everything() -> list[PolicyResult]:
        out = []
        for name in backends(size, args.backend, log):
            for policy in POLICIES:
                out.append(await run_policy(name, policy, size, log))
        return out

    print(report(asyncio.run(everything())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
