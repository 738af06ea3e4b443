"""Latest value per key benchmark (issue 15, reading side): the snapshot of a partition's history against a plain read
of the same history, with `tiered replay` (one process) and with Spark `local[2]`.

    python -m bench.bench_snapshot            64 MiB of history (about 3 minutes)
    python -m bench.bench_snapshot --quick    16 MiB
    python -m bench --only snapshot [--quick | --smoke]

The history is written with tiered.storage.PartitionLog (`log.segment.bytes=8mb`, bundles of 100 messages of
100 B random values, uncompressed; keys drawn uniformly from one tenth of the message count, 5% of the messages
tombstones and 2% keyless), then recorded as the durable path and the copier leave it
(bench_remote_compaction.copy_history) in a file store with a SQLite catalog, so both read segments from the
store. Timed, each the median of `--repeats` after one untimed pass (none at --smoke):
- replay: `export_parquet` of everything, then with `latest_per_key` (two passes: every segment read twice unless a
  split holds nothing kept), Parquet to a local directory;
- spark: a fresh `local[2]` session; the sum of key and value lengths over the plain read (which decodes every
  message and hands it to the JVM), then `latest_per_key(df)` counted (its aggregation over every message).
Rows/s is messages read (the history's) per second of wall time; "rows out" what the query returns. Each snapshot is
checked against a model computed in this process from the messages written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import format_table
from bench.bench_compaction import MESSAGE_OVERHEAD, PER_BUNDLE, log
from bench.bench_remote_compaction import copy_history
from bench.sizes import add_size_options, size_of
from tiered.catalog import Catalog
from tiered.catalog.migrate import upgrade
from tiered.protocol.bundle import Message, encode_bundle
from tiered.storage import PartitionLog, TopicConfig
from tiered.tiering.objects.local_store import LocalObjectStore

TOPIC = "users"
VALUE_BYTES = 100
CONFIG = TopicConfig(log_segment_bytes=8 << 20, produce_ack="local")


@dataclass
class Result:
    reader: str
    query: str
    rows_in: int
    rows_out: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows_in / self.seconds


def fill(partition: PartitionLog, messages: int, rng: random.Random) -> int:
    """Appends the workload and seals; returns how many messages the snapshot must hold."""
    keys = max(1, messages // 10)
    latest: dict[bytes, bool] = {}
    keyless = 0
    ts = 1_700_000_000_000
    for _ in range(0, messages, PER_BUNDLE):
        bundle = []
        for _ in range(PER_BUNDLE):
            roll = rng.random()
            if roll < 0.02:
                bundle.append(Message(rng.randbytes(VALUE_BYTES), None, ts))
                keyless += 1
            else:
                key = b"key-%08d" % rng.randrange(keys)
                value = b"" if roll < 0.07 else rng.randbytes(VALUE_BYTES)
                bundle.append(Message(value, key, ts))
                latest[key] = bool(value)
            ts += 1
        partition.append(encode_bundle(bundle))
    partition.seal_active()
    return keyless + sum(latest.values())


def timed(repeats: int, run, warm: bool) -> tuple[float, int]:
    if warm:
        run()  # untimed: workers start, code is compiled
    times, out = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def bench_replay(url: str, store_url: str, root: Path, repeats: int, messages: int, expected: int,
                 warm: bool) -> list[Result]:
    from tiered.spark.options import ReadOptions
    from tiered.spark.replay import export_parquet

    options = ReadOptions.parse({"catalog": url, "store": store_url, "topic": TOPIC})
    results = []
    for query, latest in (("everything", False), ("latest per key", True)):
        counter = iter(range(1 << 30))

        def run() -> int:
            dest = root / f"parquet-{next(counter)}"
            stats = export_parquet(options, str(dest), latest_per_key=latest)
            shutil.rmtree(dest)
            return stats.messages

        seconds, out = timed(repeats, run, warm)
        if out != (expected if latest else messages):
            raise RuntimeError(f"replay {query}: {out} rows, expected {expected if latest else messages}")
        results.append(Result("tiered replay", query, messages, out, seconds))
    return results


def bench_spark(url: str, store_url: str, repeats: int, messages: int, expected: int, warm: bool) -> list[Result]:
    from pyspark.sql import functions as F

    from tiered.spark.session import local_session
    from tiered.spark.snapshot import latest_per_key

    spark = local_session("local[2]", "tiered-bench-snapshot", {"spark.sql.shuffle.partitions": "2",
                                                                "spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = spark.read.format("tiered").option("catalog", url).option("store", store_url).option("topic", TOPIC) \
            .option("maxSplitBytes", "16MiB").load()

        def everything() -> int:
            row = df.agg(F.count("*").alias("n"), F.sum(F.length("key") + F.length("value"))).collect()[0]
            return row.n

        results = []
        for query, run, want in (("everything", everything, messages),
                                 ("latest per key", lambda: latest_per_key(df).count(), expected)):
            seconds, out = timed(repeats, run, warm)
            if out != want:
                raise RuntimeError(f"spark {query}: {out} rows, expected {want}")
            results.append(Result("spark local[2]", query, messages, out, seconds))
        return results
    finally:
        spark.stop()


def run(total_bytes: int, root: Path, repeats: int, warm: bool) -> list[Result]:
    url = f"sqlite:///{root / 'catalog.db'}"
    upgrade(url)
    cat = Catalog.open(url)
    store = LocalObjectStore(root / "objects", fsync=False)
    try:
        messages = total_bytes // (VALUE_BYTES + MESSAGE_OVERHEAD) // PER_BUNDLE * PER_BUNDLE
        local = PartitionLog.open(str(root / "local"), CONFIG)
        log(f"snapshot: writing {messages} messages ...")
        expected = fill(local, messages, random.Random(1))
        log(f"snapshot: copying {len(local.segments)} segments ...")
        asyncio.run(copy_history(store, cat, TOPIC, local))
        local.close()
        store_url = f"file://{root / 'objects'}"
        log("snapshot: tiered replay ...")
        results = bench_replay(url, store_url, root, repeats, messages, expected, warm)
        log("snapshot: spark ...")
        return results + bench_spark(url, store_url, repeats, messages, expected, warm)
    finally:
        cat.close()


def report(results: list[Result], total_bytes: int) -> str:
    title = (f"Latest value per key: {total_bytes >> 20} MiB of history (100 B values, 10% distinct keys, 5% "
             f"tombstones, 2% keyless), file store and SQLite; {os.cpu_count()} cores")
    return format_table(("reader", "query", "rows in", "rows out", "seconds", "rows/s in"),
                        [(r.reader, r.query, r.rows_in, r.rows_out, r.seconds, round(r.rows_per_s))
                         for r in results], title)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_snapshot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, quick="16 MiB of history", smoke="1 MiB of history")
    parser.add_argument("--mib", type=int, help="MiB of history (default 64, 16 with --quick, 1 with --smoke)")
    parser.add_argument("--repeats", type=int, help="timed runs of each query (default 3, 1 with --smoke)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    size = size_of(args)
    total = (args.mib or size.pick(64, 16, 1)) << 20
    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-snapshot-"))
    try:
        # A smoke run has no untimed pass first: its figures mean nothing, each step runs once.
        results = run(total, root, args.repeats or size.pick(3, 3, 1), warm=size.pick(True, True, False))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(results, total))
    print(f"load average before the run: {load:.2f}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "rows_per_s": r.rows_per_s} for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
