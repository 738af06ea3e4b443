"""Broker CPU per GB of two or more source trees, measured in turns (issue 13's before/after figures).

    python -m bench.ab_trees --rounds 8 ../before .

Each tree is a checkout of this repository; to compare an older commit, `git worktree add ../before <commit>` and copy
the built extensions (`tiered/protocol/*.so`, `tiered/spark/*.so`) into it. Every round runs each tree in turn, in a
child process whose working directory is that tree (so its `bench` and `tiered` are imported): for 100 B and 1 KiB
messages, bundles of 100, one connection with 64 requests in flight on a `produce.ack=local` topic, one broker started
on the tree's embedded defaults, 0.5 s of warm-up and then `--seconds` of load. A figure is the median (and minimum)
over the rounds of broker CPU seconds per GB. Alternating the trees spreads the load of a shared machine over all of
them; within a run their order is what to read, not the absolute level.

`--topic-config log.segment.bytes=64m` (any topic setting, repeatable) applies to every tree's topic: with the
default 1 GiB segments no segment seals within a few seconds of load, so the copy of sealed segments into the store
is in the figures only with smaller segments.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench import format_table

SIZES = (100, 1024)

# Runs inside the tree being measured, so that it imports that tree's code.
_CHILD = r"""
import asyncio, json, os, shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.bench_broker import create_topic, produce
from bench.harness import BrokerProcess
from bench.loadgen import Shape

async def main(seconds, config):
    out = {}
    root = Path(tempfile.mkdtemp(prefix="tiered-ab-"))
    try:
        for size in (100, 1024):
            broker = BrokerProcess(root / f"d{size}").start()
            try:
                await create_topic(broker.port, "t", 1, {"produce.ack": "local", **config})
                shape = Shape(size, 100)
                await produce(broker.port, "t", shape, 1, 0.5, broker.cpu_s, window=64)
                m = await produce(broker.port, "t", shape, 1, seconds, broker.cpu_s, window=64)
                out[size] = m.cpu_s_per_gb
            finally:
                broker.stop()
                shutil.rmtree(root / f"d{size}", ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out))

asyncio.run(main(float(sys.argv[1]), json.loads(sys.argv[2])))
"""


def measure(tree: Path, seconds: float, config: dict[str, str]) -> dict[int, float]:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(seconds), json.dumps(config)], cwd=tree,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)}, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: the measurement failed:\n{done.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="checkouts of this repository to compare")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0, help="load per workload and round")
    parser.add_argument("--topic-config", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic setting for every tree (repeatable)")
    args = parser.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    config = dict(item.split("=", 1) for item in args.topic_config)
    figures: dict[Path, dict[int, list[float]]] = {t: {s: [] for s in SIZES} for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            for size, value in measure(tree, args.seconds, config).items():
                figures[tree][size].append(value)
            print(f"round {r + 1}/{args.rounds}: {tree}", file=sys.stderr, flush=True)
    rows = [[str(t), *(f"{statistics.median(figures[t][s]):.2f} ({min(figures[t][s]):.2f})" for s in SIZES)]
            for t in trees]
    print(format_table(("tree", "100 B x100: CPU s/GB median (min)", "1 KiB x100: CPU s/GB median (min)"), rows,
                       f"Broker CPU per GB, produce.ack=local, 1 connection, window 64, {args.rounds} rounds in turn"
                       + "".join(f", {k}={v}" for k, v in config.items())))


if __name__ == "__main__":
    main()
