"""`python -m bench.bench_cli [--quick | --smoke]`: single-producer throughput of `tiered produce -f FILE` on a durable topic,
against the broker's block window (`--block-max-age-ms`).

On a durable topic a produce is answered when its block commits, at most one block window after its bundle
arrived. A producer that sends one request after another therefore gets about one request per window, whatever the
machine; `tiered produce` keeps `--in-flight` requests outstanding and batches lines into bundles of up to `-s`, so
its rate is set by the broker and the client's CPU instead. Each row: the broker (embedded defaults: file store,
SQLite catalog) started with the window, a topic created, then the command timed from start to exit (Python start-up
and connecting included) producing LINES lines of 100 bytes from a file; every message is then read back and counted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import format_table
from bench.harness import REPO, BrokerProcess
from bench.sizes import add_size_options, size_of

# (lines, -s, --in-flight): the defaults, one message per bundle pipelined, and the old behaviour (one at a time).
FULL = [(100_000, 500, 64), (100_000, 1000, 64), (5_000, 1, 64), (40, 1, 1)]
QUICK = [(20_000, 500, 64), (1_000, 1, 64), (20, 1, 1)]
SMOKE = [(1_000, 500, 64), (20, 1, 1)]
WINDOWS_MS = (50, 250)


def tiered(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tiered.cli.main", *args], env=env, check=True,
                          capture_output=True, **kwargs)


def one_row(root: Path, window_ms: int, lines: int, bundle: int, in_flight: int) -> dict:
    source = root / f"lines-{lines}.txt"
    if not source.exists():
        source.write_bytes(b"".join(b"%099d\n" % i for i in range(lines)))
    broker = BrokerProcess(root / f"data-{window_ms}-{lines}-{bundle}-{in_flight}", "--block-max-age-ms",
                           str(window_ms)).start()
    try:
        b = ["-b", f"127.0.0.1:{broker.port}"]
        tiered(["topic", "create", *b, "t", "1"])
        started = time.monotonic()
        tiered(["produce", *b, "-t", "t", "-f", str(source), "-s", str(bundle), "--in-flight", str(in_flight)])
        elapsed = time.monotonic() - started
        read = tiered(["consume", *b, "-t", "t", "-d", "-F", "seq"]).stdout.count(b"\n")
    finally:
        broker.stop()
    assert read == lines, f"read back {read} of {lines} messages"
    return {"window_ms": window_ms, "lines": lines, "bundle": bundle, "in_flight": in_flight, "seconds": elapsed,
            "rate": lines / elapsed}


def report(rows: list[dict]) -> str:
    return format_table(("block window", "lines", "-s", "--in-flight", "seconds", "messages/s"),
                        [(f"{r['window_ms']} ms", r["lines"], r["bundle"], r["in_flight"], r["seconds"],
                          round(r["rate"])) for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cli", description=__doc__.split("\n\n")[0])
    add_size_options(parser, quick="fewer lines", smoke="fewest lines, one window")
    args = parser.parse_args(argv)
    size = size_of(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        for window_ms in size.pick(WINDOWS_MS, WINDOWS_MS, WINDOWS_MS[:1]):
            for lines, bundle, in_flight in size.pick(FULL, QUICK, SMOKE):
                print(f"window {window_ms} ms, {lines} lines, -s {bundle}, --in-flight {in_flight} ...",
                      file=sys.stderr, flush=True)
                rows.append(one_row(Path(tmp), window_ms, lines, bundle, in_flight))
    print("single-producer `tiered produce -f` on a durable topic (100-byte lines; wall time of the command)")
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
