"""The append path's budgets (issue 13): broker CPU per 1-message produce request and CPU seconds per GB.

Goals (local ack, bundles uncompressed, random content):
- at most 25 µs of broker CPU per produce request of one 100-byte message;
- at most 5 CPU s/GB at 100-byte messages and 1.5 CPU s/GB at 1 KiB messages, bundles of 100.

Beside them, for comparison, the same workloads against the broker without its tiering layer (bench/local_broker.py):
what the append path alone costs, and so how much of each figure is the background upload of blocks. And against
bench/floor_server.py's three floors, which only write each request to a file and answer OK: the least a server in
Python pays on this machine for the same bytes, so a broker figure below its floor is not a goal code can reach.

One broker per workload (`tiered serve` on its embedded defaults: blocks are still uploaded to the local-directory
store and committed to SQLite in the background, and that CPU counts), with one `produce.ack=local` topic. Each
workload is one connection to partition 0, closed loop, `window` requests pipelined. The workloads take turns for
`rounds` rounds (so a burst of other load on this shared machine hits every workload alike) and each figure is the
median of its rounds; the spread (min..max) is printed beside it. Broker CPU is user + system of every thread.
With `--profile DIR`, each broker runs under cProfile into DIR/broker-append-<workload>.prof.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench import format_table
from bench.bench_broker import Measurement, create_topic, produce
from bench.floor_server import MODES, FloorProcess
from bench.harness import BrokerProcess
from bench.loadgen import Shape
from bench.sizes import Size


@dataclass(frozen=True)
class Workload:
    shape: Shape
    window: int
    goal: float | None  # µs per request for 1-message bundles, else CPU s/GB; None: a figure for comparison
    per_request: bool
    # "whole": the broker; "no tiering": the broker without its tiering layer (what the append path alone costs);
    # "floor: <mode>": bench/floor_server.py, the least a Python server does with the same requests
    server: str = "whole"

    @property
    def topic(self) -> str:
        server = {"whole": "", "no tiering": "l"}.get(self.server, "f" + self.server.removeprefix("floor: "))
        return f"a{self.shape.msg_bytes}b{self.shape.bundle_msgs}w{self.window}{server}"

    def figure(self, m: Measurement) -> float:
        if self.per_request:
            return m.server_cpu_s / (m.messages / self.shape.bundle_msgs) * 1e6
        return m.cpu_s_per_gb


WORKLOADS = (
    Workload(Shape(100, 1), 16, 25.0, True),
    Workload(Shape(100, 1), 256, 25.0, True),
    Workload(Shape(100, 100), 64, 5.0, False),
    Workload(Shape(1024, 100), 64, 1.5, False),
    Workload(Shape(100, 1), 256, None, True, "no tiering"),
    Workload(Shape(100, 100), 64, None, False, "no tiering"),
    Workload(Shape(1024, 100), 64, None, False, "no tiering"),
    *(Workload(Shape(size, 100), 64, None, False, f"floor: {mode}") for mode in MODES for size in (100, 1024)),
)


@dataclass
class Result:
    workload: Workload
    runs: list[Measurement] = field(default_factory=list)

    def figures(self) -> list[float]:
        return [self.workload.figure(m) for m in self.runs]


def smoke_workloads() -> tuple[Workload, ...]:
    """The first workload of each server (the broker, the broker without tiering, each floor)."""
    first: dict[str, Workload] = {}
    for w in WORKLOADS:
        first.setdefault(w.server, w)
    return tuple(first.values())


async def run(size: Size, profile_dir: Path | None = None, log=print, rounds: int | None = None) -> list[Result]:
    """One broker per workload (so that a profile, one file per workload, holds that workload only), all started
    first; then the rounds, each running every workload in turn against its broker."""
    rounds = rounds or size.pick(5, 3, 1)
    seconds, warmup_s = size.pick((2.0, 0.5), (1.0, 0.3), (0.2, 0.0))
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-append-"))
    results = [Result(w) for w in (smoke_workloads() if size is Size.SMOKE else WORKLOADS)]
    brokers: list[BrokerProcess | FloorProcess] = []
    try:
        for w in (r.workload for r in results):
            if w.server.startswith("floor: "):
                brokers.append(FloorProcess(root / w.topic, w.server.removeprefix("floor: ")).start())
                continue
            profile = profile_dir / f"broker-append-{w.topic}.prof" if profile_dir else None
            brokers.append(BrokerProcess(root / w.topic / "data", profile_path=profile,
                                         local_only=w.server == "no tiering").start())
            await create_topic(brokers[-1].port, w.topic, 1, {"produce.ack": "local"})
        for r in range(rounds):
            for result, server in zip(results, brokers):
                w = result.workload
                log(f"  round {r + 1}/{rounds}: {w.shape.label}, window {w.window}, {w.server} ...")
                m = await produce(server.port, w.topic, w.shape, 1, seconds, server.cpu_s, window=w.window,
                                  warmup_s=warmup_s if r == 0 else 0.0)
                if m.errors or not m.messages:
                    raise RuntimeError(f"{w.shape.label}: {m.errors} failed requests ({m.first_error})")
                result.runs.append(m)
    finally:
        for server in brokers:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return results


HEADERS = ("workload", "window", "broker", "figure", "median", "min", "max", "goal", "met", "msgs/s", "broker cores",
           "other cores")


def report(results: list[Result]) -> str:
    rows = []
    for result in results:
        w = result.workload
        figures = result.figures()
        median = statistics.median(figures)
        runs = result.runs
        rows.append([
            w.shape.label, w.window, w.server,
            "CPU µs/request" if w.per_request else "CPU s/GB", median, min(figures), max(figures),
            "-" if w.goal is None else w.goal, "-" if w.goal is None else "yes" if median <= w.goal else "no",
            statistics.median(m.msgs_per_s for m in runs),
            statistics.median(m.cores(m.server_cpu_s) for m in runs),
            statistics.median(m.cores(m.other_cpu_s) for m in runs),
        ])  # fmt: skip
    rounds = len(results[0].runs) if results else 0
    return format_table(HEADERS, rows, f"Append path budgets (issue 13), produce.ack=local, 1 connection, medians of "
                                       f"{rounds} rounds; broker \"no tiering\": the same broker without its tiering "
                                       "layer (no block upload, no catalog); \"floor\": bench/floor_server.py, which "
                                       "only writes each request to a file and answers OK (asyncio: as the broker's "
                                       "connections; blocking: a thread, one write per read; null: writes nothing)")
