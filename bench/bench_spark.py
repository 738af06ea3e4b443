"""Spark replay benchmark (issues 6 and 14): decode rate per core, replay throughput from the bucket with 1 and 2
executor cores against one consumer of the same history through the broker in the same run, and planning time for
a topic with 10,000 remote segments.

    python -m bench.bench_spark            256 MiB of history (about 6 minutes)
    python -m bench.bench_spark --quick    32 MiB, one repeat, the native decoder only (about 2 minutes)
    python -m bench.bench_spark --smoke    2 MiB, local[1] only with no untimed pass first, SQLite planning only:
                                           every step once, figures that mean nothing

Decode rate. The bundles of the throughput history below (64 MiB of it), built in memory and decoded into Arrow
record batches by `decoding.decode_records` in this process, with the pure decoder and with the native one
(tiered/spark/_decode.c). Rows/s and MB/s are per CPU second of this process, so per core, and hardly moved by
other work on the machine; the median of the repeats.

Throughput. A `tiered serve` process (its own process: moto S3 in another, SQLite catalog) takes `--mib` of messages
(1000-byte values, 64 per bundle, snappy as TANK's client chooses, two partitions), rolls segments of 1/16 of a
partition's stored bytes, copies them to the bucket and drops them from the local disk once copied
(`log.retention.bytes`), so that the broker, too, serves the history from the bucket. Then:
- broker: one consumer (the project's asyncio Client, 4 MiB fetches) drains both partitions, one after the other,
  `--repeats` times;
- spark local[1], local[2], per decoder (TIERED_SPARK_DECODER on the executors): a fresh SparkSession each, one
  untimed pass of the query (Python workers start, the JVM compiles the query's hot code), then `--repeats` timed
  ones: `count(*)` and the sum of key and value lengths over the whole topic, which decodes every message into
  Arrow and hands it to the JVM. Each result is checked against the broker's consume.
Figures are medians of the repeats. MB/s counts message payload (keys + values, 10^6 bytes) over the wall time of the
consume or of the query (planning included); "per core" divides by the executor cores; "x broker" compares with
the broker consumer of the same run. CPU seconds of the JVM, of the Python workers and of moto are summed over the
timed repeats and divided by their number.

Planning. A catalog (SQLite, and PostgreSQL when its server binaries are installed) holding one topic of 4
partitions x 2,500 COPY_FINISHED segments plus 100 runs each (rows written in one transaction, as the copier and the
block pipeline would leave them): the time of `listing.plan_read` (every catalog query and the planning) for the
whole topic and for a 1% seq range, its catalog statements, and the pure planning alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from bench import format_table
from bench.harness import REPO, BrokerProcess, MotoProcess, PgCluster, find_pg_bindir, process_cpu_s
from bench.sizes import Size, add_size_options, cannot_run, size_of

TOPIC = "history"
PARTITIONS = 2
VALUE_BYTES = 1000
PER_BUNDLE = 64
PLAN_PARTITIONS = 4
PLAN_SEGMENTS_PER_PARTITION = 2500
PLAN_RUNS_PER_PARTITION = 100


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Throughput:
    reader: str
    messages: int
    payload_bytes: int
    seconds: float  # median of the repeats
    cores: int = 1
    runs: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per run: jvm, python, moto

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / 1e6 / self.seconds

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def messages_per_s_per_core(self) -> float:
        return self.messages_per_s / self.cores


@dataclass
class DecodeRate:
    decoder: str
    rows: int
    payload_bytes: int
    cpu_s: float  # median of the repeats
    wall_s: float

    @property
    def rows_per_core_s(self) -> float:
        return self.rows / self.cpu_s

    @property
    def mb_per_core_s(self) -> float:
        return self.payload_bytes / 1e6 / self.cpu_s


# -- the history ---------------------------------------------------------------------------------------------------


def bundle_messages(i: int, base_ms: int) -> list:
    """Bundle `i` of the history: half repeated text, half random hex (snappy stores it at about half its size), a
    key on every other message."""
    from tiered.protocol.bundle import Message

    return [
        Message(b"%08d:" % (i * PER_BUNDLE + j) + b"event field=value;" * 27 + os.urandom(VALUE_BYTES // 3)
                .hex().encode()[: VALUE_BYTES - 9 - 18 * 27], b"user-%d" % (j % 97) if j % 2 else None, base_ms + i)
        for j in range(PER_BUNDLE)
    ]


# -- decode rate per core ------------------------------------------------------------------------------------------


def decode_rates(total_bytes: int, decoders: list[str], repeats: int) -> list[DecodeRate]:
    from tiered.protocol.bundle import encode_bundle, encode_record
    from tiered.spark.decoding import decode_records

    base_ms = int(time.time() * 1000)
    data = b"".join(encode_record(encode_bundle(bundle_messages(i, base_ms)))
                    for i in range(total_bytes // (VALUE_BYTES * PER_BUNDLE)))
    out = []
    for decoder in decoders:
        cpu, wall = [], []
        for _ in range(repeats):
            rows = payload = 0
            started, started_cpu = time.perf_counter(), time.process_time()
            for batch in decode_records(data, 1, TOPIC, 0, decoder=decoder):
                rows += batch.num_rows
                payload += sum(c.buffers()[2].size for c in (batch.column(4), batch.column(5)))
            cpu.append(time.process_time() - started_cpu)
            wall.append(time.perf_counter() - started)
        out.append(DecodeRate(decoder, rows, payload, statistics.median(cpu), statistics.median(wall)))
    return out


# -- history through a real broker ---------------------------------------------------------------------------------


async def produce_history(port: int, total_bytes: int) -> None:
    from tiered.client import Client

    async with await Client.connect("127.0.0.1", port) as client:
        # About 16 segments per partition (values store at about half their size), which leave the local disk
        # once copied.
        segment_bytes = max(64 << 10, total_bytes // 2 // PARTITIONS // 16)
        await client.create_topic(TOPIC, PARTITIONS, {"log.segment.bytes": str(segment_bytes),
                                                      "log.retention.bytes": "128"})
        bundles = total_bytes // (VALUE_BYTES * PER_BUNDLE)
        base_ms = int(time.time() * 1000)
        window: list[asyncio.Future] = []
        for i in range(bundles):
            messages = bundle_messages(i, base_ms)
            window.append(asyncio.ensure_future(client.produce_many({(TOPIC, i % PARTITIONS): messages})))
            if len(window) >= 16:
                statuses = await window.pop(0)
                assert all(s == 0 for s in statuses.values()), statuses
        for pending in window:
            statuses = await pending
            assert all(s == 0 for s in statuses.values()), statuses


def wait_until_tiered(broker: BrokerProcess, timeout_s: float) -> bool:
    """Until every sealed segment is copied and gone from the local disk (bounded); False if that did not happen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/v1/tier", timeout=10) as resp:
            parts = [p for p in json.loads(resp.read()) if p["topic"] == TOPIC]
        if parts and all(p["pending_segments"] == 0 and p["highest_copied_seq"] > 0
                         and p["local_first"] == p["highest_copied_seq"] + 1 for p in parts):
            return True
        time.sleep(0.5)
    return False


async def consume_through_broker(port: int) -> tuple[int, int, float]:
    """(messages, payload bytes, seconds) of one consumer draining both partitions."""
    from tiered.client import Client

    messages = payload = 0
    async with await Client.connect("127.0.0.1", port) as client:
        started = time.perf_counter()
        for p in range(PARTITIONS):
            async for m in client.drain(TOPIC, p, 0, fetch_bytes=4 << 20):
                messages += 1
                payload += len(m.value) + (len(m.key) if m.key else 0)
        seconds = time.perf_counter() - started
    return messages, payload, seconds


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the JVM under this process, the Python workers under the JVM)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(c) for c in children] + [d for c in children for d in descendants(int(c))]


def spark_cpu_s(moto: MotoProcess) -> dict[str, float]:
    """CPU seconds so far of the JVM, of the Python processes under it (Spark's Python workers), and of moto."""
    out = {"jvm": 0.0, "python": 0.0, "moto": moto.cpu_s()}
    for pid in descendants(os.getpid()):
        if _is_java(pid):
            out["jvm"] += _cpu_s(pid)
            out["python"] += sum(_cpu_s(worker) for worker in descendants(pid))
    return out


def _is_java(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"java" in f.read().split(b"\0")[0]
    except OSError:  # exited meanwhile
        return False


def _cpu_s(pid: int) -> float:
    try:
        return process_cpu_s(pid)
    except OSError:  # exited meanwhile: its CPU time is lost to the figure
        return 0.0


def spark_replay(cores: int, decoder: str, catalog_url: str, store_url: str, env: dict[str, str], repeats: int,
                 moto: MotoProcess, warm_up: bool = True) -> Throughput:
    os.environ.update(env)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from tiered.spark import TieredDataSource

    spark = (SparkSession.builder.master(f"local[{cores}]").appName(f"tiered-bench-{cores}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(cores)).config("spark.driver.memory", "2g")
             .config("spark.executorEnv.TIERED_SPARK_DECODER", decoder)
             .config("spark.pyspark.python", sys.executable).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        spark.dataSource.register(TieredDataSource)

        def aggregate():
            df = (spark.read.format("tiered").option("catalog", catalog_url).option("store", store_url)
                  .option("topic", TOPIC).option("s3PathStyle", "true").load())
            payload = F.sum(F.length("value") + F.coalesce(F.length("key"), F.lit(0)))
            return df.agg(F.count(F.lit(1)).alias("n"), payload.alias("bytes")).collect()[0]

        if warm_up:
            aggregate()  # untimed: Python workers start, the JVM compiles the query's hot code
        runs, before = [], spark_cpu_s(moto)
        for _ in range(repeats):
            started = time.perf_counter()
            row = aggregate()
            runs.append(time.perf_counter() - started)
        after = spark_cpu_s(moto)
        cpu = {k: (after[k] - before[k]) / repeats for k in after}
        return Throughput(f"spark local[{cores}], {decoder} decoder", row["n"], row["bytes"], statistics.median(runs),
                          cores, runs, cpu)
    finally:
        spark.stop()


def throughput(total_bytes: int, root: Path, decoders: list[str], repeats: int,
               cores_list: tuple[int, ...] = (1, 2), warm_up: bool = True) -> tuple[list[Throughput], dict]:
    root.mkdir(parents=True, exist_ok=True)
    moto = MotoProcess(root).start()
    catalog_url = f"sqlite:///{root / 'catalog.db'}"
    store_url = f"s3://{moto.bucket}/t"
    broker = BrokerProcess(root / "data", "--catalog", catalog_url, "--store", store_url, "--s3-path-style",
                           "--local-retention-interval-ms", "500", env=moto.env).start()
    try:
        log(f"producing {total_bytes >> 20} MiB")
        asyncio.run(produce_history(broker.port, total_bytes))
        tiered = wait_until_tiered(broker, 300)
        log("every sealed segment is in the bucket only" if tiered else "tiering did not finish in 5 minutes")
        drains, before = [], moto.cpu_s()
        for _ in range(repeats):
            drains.append(asyncio.run(consume_through_broker(broker.port)))
        messages, payload, _ = drains[0]
        runs = [seconds for _, _, seconds in drains]
        consumer = Throughput("broker consume (1 client, bucket)", messages, payload, statistics.median(runs), 1,
                              runs, {"moto": (moto.cpu_s() - before) / repeats})
        results = [consumer]
        log(f"{consumer.reader}: {consumer.mb_per_s:.1f} MB/s")
    finally:
        broker.stop()
    env = {**moto.env, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    try:
        for decoder in decoders:
            for cores in cores_list:
                result = spark_replay(cores, decoder, catalog_url, store_url, env, repeats, moto, warm_up)
                if (result.messages, result.payload_bytes) != (consumer.messages, consumer.payload_bytes):
                    raise AssertionError(f"{result.reader} read {result.messages} messages / {result.payload_bytes} "
                                         f"bytes, the broker {consumer.messages} / {consumer.payload_bytes}")
                log(f"{result.reader}: {result.mb_per_s:.1f} MB/s")
                results.append(result)
    finally:
        moto.stop()
    return results, {"fully_tiered": tiered}


# -- planning ------------------------------------------------------------------------------------------------------


@dataclass
class Planning:
    backend: str
    what: str
    splits: int
    statements: int
    median_ms: float


def fill_catalog(url: str) -> None:
    """One topic of PLAN_PARTITIONS x PLAN_SEGMENTS_PER_PARTITION remote segments (16 MiB, 40,000 seqs each) and a
    tail of block runs, in the end states the copier and the block pipeline leave, written through the catalog's
    own functions (those of `tiered catalog rebuild`, in batches) so that the rows keep up with the schema."""
    from tiered.catalog import Catalog
    from tiered.catalog import partitions as catalog_partitions
    from tiered.catalog import topics as catalog_topics
    from tiered.catalog.blocks import RunRow
    from tiered.catalog.restore import (PartitionBounds, RestoredBlock, insert_committed_blocks,
                                        insert_finished_segments, restore_partition_bounds)
    from tiered.catalog.segments import SegmentMeta
    from tiered.tiering.objects import keys

    cat = Catalog.open(url)
    try:
        catalog_topics.create_topic(cat, TOPIC, PLAN_PARTITIONS)
        epoch = catalog_partitions.claim_partitions(cat, 1, TOPIC, range(PLAN_PARTITIONS))
        now = datetime.now(timezone.utc)
        seqs_per_segment, t0 = 40_000, 1_700_000_000_000
        first = PLAN_SEGMENTS_PER_PARTITION * seqs_per_segment + 1
        hwmark = PLAN_SEGMENTS_PER_PARTITION * seqs_per_segment + PLAN_RUNS_PER_PARTITION * 100
        for p in range(PLAN_PARTITIONS):
            insert_finished_segments(cat, [
                SegmentMeta(
                    topic=TOPIC, partition=p, base_seq=i * seqs_per_segment + 1, last_seq=(i + 1) * seqs_per_segment,
                    object_key=keys.segment_key(TOPIC, p, i * seqs_per_segment + 1, (i + 1) * seqs_per_segment,
                                                1_700_000_000 + i),
                    index_object_key=keys.segment_index_key(TOPIC, p, i * seqs_per_segment + 1,
                                                            (i + 1) * seqs_per_segment, 1_700_000_000 + i),
                    size_bytes=16 << 20, index_size_bytes=32 << 10, min_ts_ms=t0 + i * 60_000,
                    max_ts_ms=t0 + i * 60_000 + 59_999, freeze_ts=now, leader_epoch=epoch[p])
                for i in range(PLAN_SEGMENTS_PER_PARTITION)], now=now)
            insert_committed_blocks(cat, [
                RestoredBlock(
                    object_key=keys.block_key(1, keys.new_block_id(t0 + p * PLAN_RUNS_PER_PARTITION + j)),
                    broker_id=1, size_bytes=64 << 10, created_at=now, committed_at=now,
                    runs=[RunRow(topic=TOPIC, partition=p, from_seq=first + j * 100, first_seq=first + j * 100,
                                 last_seq=first + j * 100 + 99, messages=100, min_ts_ms=t0, max_ts_ms=t0,
                                 leader_epoch=epoch[p], position=0, length_bytes=64 << 10)])
                for j in range(PLAN_RUNS_PER_PARTITION)])
        restore_partition_bounds(cat, [PartitionBounds(TOPIC, p, 1, hwmark) for p in range(PLAN_PARTITIONS)])
    finally:
        cat.close()


def planning(backend: str, url: str, repeats: int) -> list[Planning]:
    from tiered.catalog import Catalog
    from tiered.catalog.migrate import upgrade
    from tiered.spark import listing
    from tiered.spark.options import ReadOptions
    from tiered.spark.planning import SeqRange, plan_partition

    upgrade(url)
    fill_catalog(url)
    out = []
    whole = ReadOptions.parse({"catalog": url, "store": "s3://b/p", "topic": TOPIC})
    total_seqs = PLAN_SEGMENTS_PER_PARTITION * 40_000
    first = total_seqs // 2
    narrow = ReadOptions.parse({"catalog": url, "store": "s3://b/p", "topic": TOPIC,
                                "startingSeq": str(first), "endingSeq": str(first + total_seqs // 100)})
    for what, options in (("whole topic (10,000 segments, 400 runs)", whole), ("1% seq range", narrow)):
        times, splits, statements = [], 0, 0
        for _ in range(repeats):
            cat = Catalog.open(url)
            started = time.perf_counter()
            plans = listing.plan_topic(cat, TOPIC, seqs=options.seqs)
            times.append(time.perf_counter() - started)
            splits, statements = sum(len(p.splits) for p in plans), cat.statements
            cat.close()
        # Through plan_read as the data source calls it: opening the catalog is part of what the driver pays.
        started = time.perf_counter()
        listing.plan_read(options)
        open_and_plan_ms = (time.perf_counter() - started) * 1000
        out.append(Planning(backend, what, splits, statements, statistics.median(times) * 1000))
        out.append(Planning(backend, what + ", plan_read incl. catalog open", splits, statements, open_and_plan_ms))
    cat = Catalog.open(url)
    segments = [listing.list_segments(cat, TOPIC, p, SeqRange()) for p in range(PLAN_PARTITIONS)]
    runs = [listing.list_runs(cat, TOPIC, p, SeqRange(total_seqs + 1)) for p in range(PLAN_PARTITIONS)]
    cat.close()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        n = sum(len(plan_partition(TOPIC, p, segments[p], runs[p], total_seqs, SeqRange()))
                for p in range(PLAN_PARTITIONS))
        times.append(time.perf_counter() - started)
    out.append(Planning("-", "pure planning of the listed rows", n, 0, statistics.median(times) * 1000))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_spark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, quick="32 MiB of history, one repeat, the native decoder only, fewer planning repeats",
                     smoke="2 MiB of history, local[1] only, planning on SQLite only")
    parser.add_argument("--mib", type=int, help="MiB of history to replay (default 256, 32 with --quick, 2 with "
                                                "--smoke)")
    parser.add_argument("--repeats", type=int, help="timed repeats of each read (default 3, 1 with --quick)")
    parser.add_argument("--decoders", help="Spark decoders to replay with, comma-separated (default native,python; "
                                           "native with --quick)")
    parser.add_argument("--no-planning", action="store_true", help="skip the planning benchmark")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    size = size_of(args)
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        cannot_run("Spark needs Java (make system-deps installs it)")
    total = (args.mib or size.pick(256, 32, 2)) << 20
    repeats = args.repeats or size.pick(3, 1, 1)
    decoders = (args.decoders or ("native" if size.short else "native,python")).split(",")
    plan_repeats = size.pick(7, 3, 1)
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-spark-"))
    load = os.getloadavg()[0]
    plans: list[Planning] = []
    try:
        rates = decode_rates(min(total, 64 << 20), ["python", "native"], max(3, repeats))
        results, notes = throughput(total, root / "replay", decoders, repeats, size.pick((1, 2), (1, 2), (1,)),
                                    warm_up=size is not Size.SMOKE)
        if not args.no_planning:
            plans = planning("sqlite", f"sqlite:///{root / 'plan.db'}", plan_repeats)
            bindir = find_pg_bindir() if size is not Size.SMOKE else None
            if bindir is not None:
                pg = PgCluster(bindir).start()
                try:
                    plans += [p for p in planning("postgresql", pg.url(), plan_repeats) if p.backend != "-"]
                finally:
                    pg.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    pure = next(r for r in rates if r.decoder == "python")
    print(f"Decode rate: {rates[0].rows:,} messages of the history below, decoded into Arrow in one process, per CPU "
          f"second (median of {max(3, repeats)}); load average {load:.2f} before the run")
    print(format_table(
        ("decoder", "rows", "payload MB", "CPU s", "rows/s per core", "MB/s per core", "x pure"),
        [(r.decoder, r.rows, r.payload_bytes / 1e6, r.cpu_s, r.rows_per_core_s, r.mb_per_core_s,
          pure.cpu_s / r.cpu_s) for r in rates],
    ))
    print()
    consumer = results[0]
    print(f"Spark replay: {total >> 20} MiB of history, {PARTITIONS} partitions, moto S3 on loopback, SQLite catalog; "
          f"{os.cpu_count()} cores; median of {repeats}")
    print(format_table(
        ("reader", "messages", "payload MB", "seconds", "MB/s", "messages/s", "per core", "x broker",
         "JVM CPU s", "Python CPU s", "moto CPU s"),
        [(r.reader, r.messages, r.payload_bytes / 1e6, r.seconds, r.mb_per_s, r.messages_per_s,
          r.messages_per_s_per_core, r.mb_per_s / consumer.mb_per_s, r.cpu.get("jvm", "-"), r.cpu.get("python", "-"),
          r.cpu.get("moto", "-")) for r in results],
    ))
    print("runs (s): " + "; ".join(f"{r.reader}: " + ", ".join(f"{x:.2f}" for x in r.runs) for r in results))
    if not notes["fully_tiered"]:
        print("note: some sealed segments were still on the broker's disk when it was consumed")
    if plans:
        print()
        print(format_table(("catalog", "planning", "splits", "statements", "ms (median)"),
                           [(p.backend, p.what, p.splits, p.statements, p.median_ms) for p in plans]))
    if args.json:
        args.json.write_text(json.dumps({
            "load_average": load,
            "decode": [{**asdict(r), "rows_per_core_s": r.rows_per_core_s, "mb_per_core_s": r.mb_per_core_s}
                       for r in rates],
            "throughput": [{**asdict(r), "mb_per_s": r.mb_per_s, "messages_per_s": r.messages_per_s,
                            "messages_per_s_per_core": r.messages_per_s_per_core,
                            "x_broker": r.mb_per_s / consumer.mb_per_s} for r in results],
            "planning": [asdict(p) for p in plans],
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
