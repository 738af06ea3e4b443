"""Durable acks (issue 4): ack latency, PUTs per GiB, idle PUTs, catalog statements per block, durable/local ratio.

Runs once per backend, each against a fresh `tiered serve` process:
- "file+sqlite": the embedded defaults (local-directory store with fsync, SQLite catalog in the data directory);
- "s3+postgresql": moto's S3 server (a child process, over HTTP on loopback, path-style) and a throwaway
  PostgreSQL cluster (fsync off); skipped when the PostgreSQL server binaries are missing.

Phases, in this order, on one broker per backend:
1. Ack latency: open-loop producers at a fixed message rate on a `produce.ack=durable` topic; each latency runs from
   a request's scheduled send time to its response (so a late sender cannot hide queueing).
2. Durable vs local throughput: the same closed-loop workload on a durable and on a local topic, alternately. The
   first workload (1 KiB x 1000, eight connections) is the high-rate ingest that PUTs per GiB are counted on.
3. Idle: once every block is committed, PUTs and catalog statements over an idle window, scaled to a minute.

Counters come from GET /metrics: `tiered_store_puts_total`, `tiered_blocks_uploaded_total`,
`tiered_catalog_statements_total` (every SQL statement the catalog sent, BEGIN/COMMIT not counted, heartbeats
included), `tanksrv_topic_produced_bytes`. A counter missing from /metrics is an error, never a zero.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import format_table, percentile
from bench.bench_broker import Measurement, create_topic, produce
from bench.harness import BrokerProcess, MotoProcess, PgCluster, find_pg_bindir
from bench.loadgen import Shape
from bench.sizes import Size

GIB = 1 << 30
PARTITIONS = 8
SMALL = Shape(100, 1)


@dataclass(frozen=True)
class LatencyRun:
    rate_per_s: float
    shape: Shape  # messages per request = shape.bundle_msgs
    seconds: float
    quick_seconds: float
    full_only: bool = False

    def seconds_at(self, size: Size) -> float:
        return size.pick(self.seconds, self.quick_seconds, min(self.quick_seconds, 0.5))


LATENCY_RUNS = (
    LatencyRun(1, SMALL, 20.0, 4.0),
    LatencyRun(100, SMALL, 10.0, 3.0),
    LatencyRun(10_000, Shape(100, 10), 10.0, 3.0),  # a client batching what it has every millisecond
    LatencyRun(10_000, SMALL, 5.0, 0.0, full_only=True),  # the same rate as one request per message
)


@dataclass(frozen=True)
class RatioRun:
    shape: Shape
    conns: int
    window: int  # requests in flight per connection, the same for both ack modes


# Windows large enough that a durable producer is not held back by the ~250 ms it waits for each ack.
RATIO_RUNS = (
    RatioRun(Shape(1024, 1000), 8, 8),
    RatioRun(Shape(1024, 100), 8, 64),
    RatioRun(SMALL, 1, 4096),
)


@dataclass
class Backend:
    name: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    parts: list = field(default_factory=list)  # MotoProcess, PgCluster: stopped after the run, CPU counted

    def parts_cpu_s(self) -> float:
        return sum(p.cpu_s() for p in self.parts)

    def stop(self) -> None:
        for part in self.parts:
            part.stop()


@dataclass
class LatencyResult:
    run: LatencyRun
    measurement: Measurement
    statements_per_block: float
    puts: int


@dataclass
class RatioResult:
    run: RatioRun
    durable: Measurement
    local: Measurement


@dataclass
class BackendResult:
    backend: str
    latency: list[LatencyResult] = field(default_factory=list)
    ratio: list[RatioResult] = field(default_factory=list)
    ingest_gib: float = 0.0
    ingest_puts: int = 0
    ingest_blocks: int = 0
    ingest_block_bytes: float = 0.0  # the sum over the ingest's blocks
    largest_block_bytes: int = 0
    ingest_statements: int = 0
    ingest_seconds: float = 0.0
    parts_cpu_s: float = 0.0  # moto + PostgreSQL during the ingest (NaN for file+sqlite)
    idle_seconds: float = 0.0
    idle_puts: int = 0
    idle_statements: int = 0


def backends(size: Size, names: list[str] | None, log=print) -> list[str]:
    wanted = names or (["file+sqlite"] if size.short else ["file+sqlite", "s3+postgresql"])
    if "s3+postgresql" in wanted and find_pg_bindir() is None:
        log("  s3+postgresql skipped: PostgreSQL server binaries not found (make system-deps)")
        wanted = [n for n in wanted if n != "s3+postgresql"]
    return wanted


def start_backend(name: str, root: Path) -> Backend:
    if name == "file+sqlite":
        return Backend(name)
    if name == "s3+postgresql":
        backend = Backend(name)
        try:
            moto = MotoProcess(root).start()
            backend.parts.append(moto)
            pg = PgCluster(find_pg_bindir()).start()
            backend.parts.append(pg)
        except BaseException:
            backend.stop()
            raise
        backend.args = ("--store", f"s3://{moto.bucket}/bench", "--s3-path-style", "--catalog", pg.url())
        backend.env = moto.env
        return backend
    raise ValueError(f"unknown backend {name!r} (file+sqlite or s3+postgresql)")


def largest_object_bytes(backend: Backend, broker: BrokerProcess) -> int:
    """The size of the largest object in the store (blocks only: nothing else is uploaded in these runs)."""
    if not backend.parts:
        root = broker.data_dir / ".tiered" / "objects"
        return max((p.stat().st_size for p in root.rglob("*") if p.is_file()), default=0)
    moto = backend.parts[0]
    s3 = moto.client()
    largest = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=moto.bucket):
        largest = max([largest, *(o["Size"] for o in page.get("Contents", ()))])
    return largest


async def wait_committed(broker: BrokerProcess, timeout_s: float = 60.0) -> dict[str, float]:
    """Metrics once no block is pending or in flight."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = broker.metrics()
        gauges = ("tiered_blocks_in_flight", "tiered_block_pending_bytes")
        missing = [g for g in gauges if g not in m]
        if missing:
            raise RuntimeError(f"/metrics has no {', '.join(missing)}")
        if not any(m[g] for g in gauges):
            return m
        if time.monotonic() > deadline:
            raise RuntimeError(f"blocks still in flight after {timeout_s} s")
        await asyncio.sleep(0.1)


def _delta(after: dict, before: dict, name: str) -> float:
    if name not in after or name not in before:
        raise RuntimeError(f"/metrics has no {name}: the benchmark and the broker disagree on the counter's name")
    return after[name] - before[name]


async def run_backend(name: str, size: Size, log=print) -> BackendResult:
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-durable-"))
    backend = start_backend(name, root)
    result = BackendResult(name)
    try:
        broker = BrokerProcess(root / "data", *backend.args, env=backend.env).start()
        try:
            await create_topic(broker.port, "durable", PARTITIONS, {"produce.ack": "durable"})
            await create_topic(broker.port, "local", PARTITIONS, {"produce.ack": "local"})
            await _latency(broker, result, size, log)
            await _ratio(broker, backend, result, size, log)
            await _idle(broker, result, size, log)
        finally:
            broker.stop()
    finally:
        backend.stop()
        shutil.rmtree(root, ignore_errors=True)
    return result


async def _latency(broker: BrokerProcess, result: BackendResult, size: Size, log) -> None:
    for run in LATENCY_RUNS:
        if size.short and run.full_only:
            continue
        seconds = run.seconds_at(size)
        log(f"  {result.backend}: durable ack latency at {run.rate_per_s:,.0f} msgs/s ({run.shape.label}) ...")
        before = await wait_committed(broker)
        m = await produce(broker.port, "durable", run.shape, 1, seconds, broker.cpu_s, rate_per_s=run.rate_per_s)
        after = await wait_committed(broker)
        blocks = _delta(after, before, "tiered_blocks_uploaded_total")
        statements = _delta(after, before, "tiered_catalog_statements_total")
        result.latency.append(LatencyResult(run, m, statements / blocks if blocks else float("nan"),
                                            int(_delta(after, before, "tiered_store_puts_total"))))


async def _ratio(broker: BrokerProcess, backend: Backend, result: BackendResult, size: Size, log) -> None:
    """Durable and local halves alternate (durable, local, durable, local) so that a change in the machine's other
    load hits both modes alike. The ingest figures are the counters' deltas over the durable halves of the first
    workload, each from a moment with no block pending to the moment its last block is committed."""
    half_s = size.pick(6.0, 1.0, 0.3)
    for i, run in enumerate(RATIO_RUNS):
        if size.short and i:
            continue
        log(f"  {result.backend}: durable vs local, {run.shape.label}, {run.conns} connection(s) ...")
        halves: dict[str, list[Measurement]] = {"durable": [], "local": []}
        for _ in range(2):
            for topic in ("durable", "local"):
                before = await wait_committed(broker)
                parts0 = backend.parts_cpu_s()
                m = await produce(broker.port, topic, run.shape, run.conns, half_s, broker.cpu_s, window=run.window)
                parts_s = backend.parts_cpu_s() - parts0
                halves[topic].append(m)
                if i == 0 and topic == "durable":
                    after = await wait_committed(broker)
                    _count_ingest(result, before, after, parts_s if backend.parts else float("nan"), m.seconds)
        result.ratio.append(RatioResult(run, merge(halves["durable"]), merge(halves["local"])))
    if result.ingest_blocks:
        result.largest_block_bytes = largest_object_bytes(backend, broker)


def _count_ingest(result: BackendResult, before: dict, after: dict, parts_s: float, seconds: float) -> None:
    result.ingest_gib += _delta(after, before, 'tanksrv_topic_produced_bytes{m="durable"}') / GIB
    result.ingest_puts += int(_delta(after, before, "tiered_store_puts_total"))
    result.ingest_blocks += int(_delta(after, before, "tiered_blocks_uploaded_total"))
    result.ingest_block_bytes += _delta(after, before, "tiered_block_bytes_uploaded_total")
    result.ingest_statements += int(_delta(after, before, "tiered_catalog_statements_total"))
    result.ingest_seconds += seconds
    result.parts_cpu_s += parts_s


def merge(parts: list[Measurement]) -> Measurement:
    errors = [m for m in parts if m.errors]
    return Measurement(
        sum(m.messages for m in parts), sum(m.value_bytes for m in parts), sum(m.seconds for m in parts),
        sum(m.server_cpu_s for m in parts), sum(m.loadgen_cpu_s for m in parts), sum(m.other_cpu_s for m in parts),
        sum(m.errors for m in parts), errors[0].first_error if errors else "",
    )


async def _idle(broker: BrokerProcess, result: BackendResult, size: Size, log) -> None:
    idle_s = size.pick(21.0, 6.0, 0.5)  # past at least one 10 s catalog heartbeat in a full run
    log(f"  {result.backend}: idle for {idle_s:.0f} s ...")
    before = await wait_committed(broker)
    t0 = time.monotonic()
    await asyncio.sleep(idle_s)
    after = broker.metrics()
    result.idle_seconds = time.monotonic() - t0
    result.idle_puts = int(_delta(after, before, "tiered_store_puts_total"))
    result.idle_statements = int(_delta(after, before, "tiered_catalog_statements_total"))


async def run(size: Size, names: list[str] | None = None, log=print) -> list[BackendResult]:
    out = []
    for name in backends(size, names, log):
        out.append(await run_backend(name, size, log))
    return out


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def report(results: list[BackendResult]) -> str:
    latency_rows = []
    for r in results:
        for lat in r.latency:
            m = lat.measurement
            xs = m.latencies_s or []
            latency_rows.append([
                r.backend, lat.run.rate_per_s, lat.run.shape.label, len(xs), m.msgs_per_s, _ms(percentile(xs, 0.5)),
                _ms(percentile(xs, 0.99)), _ms(xs[-1]) if xs else float("nan"), m.errors, lat.puts,
                lat.statements_per_block,
            ])
    summary_rows = []
    for r in results:
        per_gib = r.ingest_puts / r.ingest_gib if r.ingest_gib else float("nan")
        idle_per_min = r.idle_puts * 60.0 / r.idle_seconds if r.idle_seconds else float("nan")
        statements_per_min = r.idle_statements * 60.0 / r.idle_seconds if r.idle_seconds else float("nan")
        per_block = r.ingest_statements / r.ingest_blocks if r.ingest_blocks else float("nan")
        per_block_mib = r.ingest_block_bytes / r.ingest_blocks / (1 << 20) if r.ingest_blocks else float("nan")
        parts_cores = r.parts_cpu_s / r.ingest_seconds if r.ingest_seconds else float("nan")
        summary_rows.append([r.backend, r.ingest_gib, r.ingest_puts, per_gib, per_block_mib,
                             r.largest_block_bytes / (1 << 20), per_block, r.idle_seconds, r.idle_puts, idle_per_min,
                             statements_per_min, parts_cores])
    ratio_rows = []
    for r in results:
        for x in r.ratio:
            ratio_rows.append([r.backend, x.run.shape.label, x.run.conns, x.run.window, x.durable.msgs_per_s,
                               x.durable.mb_per_s, x.local.msgs_per_s, x.local.mb_per_s,
                               x.durable.msgs_per_s / x.local.msgs_per_s, x.durable.errors + x.local.errors])
    return "\n\n".join((
        format_table(("backend", "msgs/s", "request", "samples", "achieved msgs/s", "p50 ms", "p99 ms", "max ms",
                      "errors", "PUTs", "stmts/block"), latency_rows,
                     "Durable ack latency (open loop, from each request's scheduled send time to its response)"),
        format_table(("backend", "GiB ingested", "PUTs", "PUTs/GiB", "MiB/block", "largest MiB", "stmts/block",
                      "idle s", "idle PUTs", "idle PUTs/min", "idle stmts/min", "moto+pg cores"), summary_rows,
                     "High-rate ingest (durable, 1KiB x1000, 8 connections) and idle (PUTs/min extrapolated from "
                     "the idle window; floor for 8 MiB blocks: 128 PUTs/GiB)"),
        format_table(("backend", "workload", "conns", "window", "durable msgs/s", "durable MB/s", "local msgs/s",
                      "local MB/s", "durable/local", "errors"), ratio_rows,
                     "Produce throughput, durable vs local acks, same broker, same run"),
    ))

