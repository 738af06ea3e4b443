"""`python -m bench` (also `make bench`): runs the benchmarks and prints their tables.

    python -m bench                      broker throughput, the append path's budgets, then durable acks on both
                                         backends (~12 minutes)
    python -m bench --quick              shorter runs, durable acks on file+sqlite only (~2 minutes)
    python -m bench --smoke              the smallest size: every step once, figures that mean nothing (what
                                         tests/test_bench_smoke.py runs, one benchmark at a time)
    python -m bench --only broker        one benchmark: broker, append, durable or spark (repeatable)
    python -m bench --only durable --backend s3+postgresql
    python -m bench --profile DIR        cProfile the broker of the throughput (one file per workload) and append
                                         benchmarks
    python -m bench --json PATH          also write every figure as JSON

Every other `--only NAME` (spark, remote, cli, compaction, remote_compaction, snapshot, chaos, client, cluster,
linger, instructions, scale_commit, scale_idle, scale_create, scale_lookup, restarts, ...) runs the module DELEGATED[NAME] names, a
benchmark of its own (`python -m bench.bench_NAME`), passing `--quick` or `--smoke` on. A benchmark that cannot run on
this machine
(valgrind or PostgreSQL missing) says why and is skipped; the exit status is bench.sizes.CANNOT_RUN when no benchmark
asked for could run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bench import bench_append, bench_broker, bench_durable
from bench.harness import REPO
from bench.sizes import CANNOT_RUN, add_size_options, size_of

# Benchmarks run in this process whose broker --profile profiles: name -> (module, what it measures).
PROFILED = {"broker": (bench_broker, "broker throughput (issue 3)"),
            "append": (bench_append, "append path budgets (issue 13)")}
# Benchmarks with a command of their own, run as `python -m <module> [--quick]`.
DELEGATED = {"spark": "bench.bench_spark", "remote": "bench.bench_remote", "cli": "bench.bench_cli",
             "compaction": "bench.bench_compaction", "remote_compaction": "bench.bench_remote_compaction",
             "snapshot": "bench.bench_snapshot",
             "chaos": "bench.chaos", "client": "bench.bench_client",
             "cluster": "bench.bench_cluster", "linger": "bench.bench_linger",
             "instructions": "bench.bench_instructions", "scale_commit": "bench.bench_scale_commit",
             "scale_idle": "bench.bench_scale_idle", "scale_create": "bench.bench_scale_create",
             "scale_lookup": "bench.bench_scale_lookup",
             "restarts": "bench.bench_restarts", "tls": "bench.bench_tls", "access": "bench.bench_access",
             "cost": "bench.bench_cost", "consume_latency": "bench.bench_consume_latency",
             "block_copy": "bench.bench_block_copy"}
NAMES = ("broker", "append", "durable", *DELEGATED)


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return (f"{os.cpu_count()} cores ({model or platform.machine()}), Linux {platform.release()}, Python "
            f"{platform.python_version()}; load average before the run {load[0]:.2f}")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def to_json(value):
    if dataclasses.is_dataclass(value):
        out = {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "latencies_s"}
        if getattr(value, "latencies_s", None):
            out["latency_samples"] = len(value.latencies_s)
        return out
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, quick="short runs (about 2 minutes in all)")
    parser.add_argument("--only", action="append", choices=NAMES, help="run only this benchmark (repeatable)")
    parser.add_argument("--backend", action="append", choices=("file+sqlite", "s3+postgresql"),
                        help="durable benchmark backend (repeatable; default: both, file+sqlite only with --quick)")
    parser.add_argument("--profile", type=Path, help="cProfile the broker of the throughput and append benchmarks into "
                        "this directory")
    parser.add_argument("--json", type=Path, help="write the figures as JSON to this file")
    args = parser.parse_args(argv)
    size = size_of(args)
    only = args.only or ["broker", "append", "durable"]
    skipped = []
    started = time.monotonic()
    print(f"tiered benchmarks, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
    print(f"machine: {machine()}")
    print(f"command: python -m bench {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    figures: dict = {}
    for name, (module, what) in PROFILED.items():
        if name not in only:
            continue
        log(f"{what} ...")
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(module.run(size, args.profile, log))
        figures[name] = results
        print()
        print(module.report(results))
    if "durable" in only:
        log("durable acks (issue 4) ...")
        results = asyncio.run(bench_durable.run(size, args.backend, log))
        figures["durable"] = results
        print()
        print(bench_durable.report(results))
    for name, module in DELEGATED.items():
        if name not in only:
            continue
        if not (REPO / (module.replace(".", "/") + ".py")).exists():
            print(f"\n{name}: {module} does not exist yet")
            continue
        print(flush=True)
        done = subprocess.run([sys.executable, "-m", module, *size.flags], cwd=REPO)
        if done.returncode == CANNOT_RUN:
            print(f"\n{name}: cannot run on this machine (see above)")
            skipped.append(name)
        elif done.returncode:
            return done.returncode
    if args.json:
        args.json.write_text(json.dumps(to_json(figures), indent=1))
    print(f"\ntook {time.monotonic() - started:.0f} s")
    return CANNOT_RUN if skipped and len(skipped) == len(set(only)) else 0


if __name__ == "__main__":
    sys.exit(main())
