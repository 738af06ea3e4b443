"""The catalog at scale: lookups over a long history, a retention pass over every partition, and what one PostgreSQL
core does, direct and through PgBouncer (issue 28, goals 5-7; docs/scale.md).

    python -m bench.bench_scale_lookup [--quick|--smoke]      (also `python -m bench --only scale_lookup`)

A throwaway PostgreSQL cluster (fsync off, default shared_buffers), migrated, then bulk-loaded by generate_series
(a few INSERT ... SELECT statements, not row by row): 25 topics x 4,000 partitions (100,000), 10 M readable remote
segments (100 a partition) and 1 M committed block runs (10 a partition, after its segments) in 10,000 blocks of
100 runs each, then ANALYZE. --quick: 10,000 partitions, 1 M segments, 100,000 runs; --smoke: 100 partitions.

1. Cold lookups: the server is restarted (its shared buffers empty; the OS page cache is not dropped), then random
   (partition, seq) over the whole history: `find_remote_segment` for a seq of a segment, `find_run` for a seq of a
   run. Measured in PostgreSQL (EXPLAIN ANALYZE: planning + execution) and from the broker's side (the query
   function's wall time in this process, through the engine's pool: direct and through PgBouncer in transaction
   mode). Goal: <= 5 ms p99.
2. Throughput per PostgreSQL core: 4 threads for a few seconds of `find_run` (random), then of block commits
   (`insert_pending_block` + `commit_block` of 8 runs, and `expand_blocks` when it left the runs unexpanded,
   each thread on partitions of its own), direct and through PgBouncer. Per PostgreSQL CPU second (the postmaster
   and its backends; PgBouncer's CPU counted apart).
3. Retention: RemoteTier's remote retention passes over every partition, led here (--only-retention: this part
   alone): the first with 1 % of the partitions holding an expired segment, then idle ones (a minute later; a grace
   period later, with the look for runs below the start, every first available seq above 1), while
   one thread commits 8-run blocks; commit latency during the passes against before. Goal: no commit stalled
   > 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench import format_table, percentile
from bench.harness import PgCluster, find_pg_bindir, free_port, process_cpu_s
from bench.sizes import Size, add_size_options, cannot_run, size_of
from tiered.catalog import Catalog, blocks, segments
from tiered.catalog.blocks import RunRow
from tiered.catalog.migrate import upgrade
from tiered.catalog.partitions import get_partition_state
from tiered.storage.topic_config import TopicConfig
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.objects.local_store import LocalObjectStore

SEGMENT_SEQS, RUN_SEQS = 1000, 100  # seqs per bulk segment and per bulk run
RUNS_PER_BLOCK = 100
SEGMENT_BYTES, INDEX_BYTES = 1 << 20, 4096
THREADS = 4
COMMIT_RUNS = 8
EXPIRED_EVERY = 100  # 1 partition in 100 holds an expired segment


@dataclass(frozen=True)
class Shape:
    topics: int
    per_topic: int
    segments: int  # per partition
    runs: int  # per partition
    samples: int  # cold lookups of each kind, per path
    seconds: float  # of each throughput load

    @property
    def partitions(self) -> int:
        return self.topics * self.per_topic


def shape_of(size: Size) -> Shape:
    return size.pick(full=Shape(25, 4000, 100, 10, 2000, 8.0), quick=Shape(10, 1000, 100, 10, 500, 4.0),
                     smoke=Shape(2, 50, 100, 10, 20, 0.5))


def topic_name(t: int) -> str:
    return f"scale{t}"


# ---------------------------------------------------------------------------------------------------- load


def bulk_load(url: str, shape: Shape, now: datetime, log) -> dict[str, float]:
    """The catalog of `shape`, one topic per transaction; returns seconds per table."""
    import psycopg
    from psycopg.types.numeric import Int8

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    took: dict[str, float] = {"topics+partitions": 0.0, "segments": 0.0, "blocks+runs": 0.0}
    hwmark = shape.segments * SEGMENT_SEQS + shape.runs * RUN_SEQS
    remote = shape.segments * (SEGMENT_BYTES + INDEX_BYTES)
    old = now - timedelta(days=30)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in range(shape.topics):
            name, p = topic_name(t), shape.per_topic
            params = {"name": name, "p": p, "s": shape.segments, "r": shape.runs, "hw": hwmark, "rb": remote,
                      "now": now, "old": old, "e": EXPIRED_EVERY, "sq": SEGMENT_SEQS, "rq": RUN_SEQS,
                      "k": RUNS_PER_BLOCK, "base": t * p * shape.runs // RUNS_PER_BLOCK + 1}
            # BIGINT, all of them: psycopg sends a small int as int2, and int2 arithmetic overflows.
            params = {k: Int8(v) if isinstance(v, int) else v for k, v in params.items()}
            with conn.transaction():
                started = time.monotonic()
                conn.execute("INSERT INTO topics (name, partitions, config_text, created_at)"
                             " VALUES (%(name)s, %(p)s, '', %(now)s)", params)
                conn.execute(
                    "INSERT INTO partitions (topic, partition, leader_broker, leader_epoch, first_available_seq,"
                    " hwmark_seq, remote_bytes) SELECT %(name)s, g, 1, 1, 1, %(hw)s, %(rb)s"
                    " FROM generate_series(0, %(p)s - 1) g", params)
                took["topics+partitions"] += time.monotonic() - started
                started = time.monotonic()
                # Segment i of partition g: seqs [i * sq + 1, (i + 1) * sq]; the first one of every e-th partition
                # froze 30 days ago (retention expires it), the others now.
                conn.execute(
                    "INSERT INTO segments (topic, partition, base_seq, last_seq, from_seq, object_key,"
                    " index_object_key, size_bytes, index_size_bytes, min_ts_ms, max_ts_ms, freeze_ts, leader_epoch,"
                    " state, updated_at)"
                    " SELECT %(name)s, g, i * %(sq)s + 1, (i + 1) * %(sq)s, i * %(sq)s + 1,"
                    " 'seg/' || %(name)s || '/' || g || '/' || i, 'idx/' || %(name)s || '/' || g || '/' || i,"
                    f" {SEGMENT_BYTES}, {INDEX_BYTES}, 0, 0,"
                    " CASE WHEN i = 0 AND g %% %(e)s = 0 THEN %(old)s ELSE %(now)s END, 1, 'COPY_FINISHED', %(now)s"
                    " FROM generate_series(0, %(p)s - 1) g, generate_series(0, %(s)s - 1) i", params)
                took["segments"] += time.monotonic() - started
                started = time.monotonic()
                # Run j of the topic: partition j % p, its (j / p)-th run, after the partition's segments; blocks
                # of k consecutive runs (k partitions each), ids from `base` (one range per topic).
                conn.execute(
                    "INSERT INTO blocks (block_id, object_key, state, broker_id, size_bytes, created_at,"
                    " committed_at) SELECT %(base)s + b, 'blk/' || %(name)s || '/' || b, 'committed', 1, 8388608,"
                    " %(now)s, %(now)s FROM generate_series(0, %(p)s * %(r)s / %(k)s - 1) b", params)
                conn.execute(
                    "INSERT INTO block_runs (block_id, position, topic, partition, from_seq, first_seq, last_seq,"
                    " length_bytes, messages, min_ts_ms, max_ts_ms, leader_epoch)"
                    " SELECT %(base)s + j / %(k)s, (j %% %(k)s) * 100000, %(name)s, j %% %(p)s,"
                    " %(s)s * %(sq)s + (j / %(p)s) * %(rq)s + 1, %(s)s * %(sq)s + (j / %(p)s) * %(rq)s + 1,"
                    " %(s)s * %(sq)s + (j / %(p)s + 1) * %(rq)s, 100000, %(rq)s, 0, 0, 1"
                    " FROM generate_series(0, %(p)s * %(r)s - 1) j", params)
                took["blocks+runs"] += time.monotonic() - started
            log(f"  loaded {name} ({t + 1}/{shape.topics})")
        started = time.monotonic()
        conn.execute("SELECT setval(pg_get_serial_sequence('blocks', 'block_id'), (SELECT max(block_id) FROM blocks))")
        conn.execute("VACUUM ANALYZE")
        took["vacuum analyze"] = time.monotonic() - started
        sizes = conn.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname IN"
            " ('segments', 'block_runs', 'blocks', 'partitions')").fetchall()
    took.update({f"{name} bytes": float(size) for name, size in sizes})
    return took


# ---------------------------------------------------------------------------------------------------- lookups


@dataclass
class Lookups:
    path: str
    kind: str
    ms: list[float] = field(default_factory=list)
    # Broker side: this thread's CPU per lookup (the client's own work, which waiting for a core does not inflate).
    cpu_ms: list[float] = field(default_factory=list)


def random_key(shape: Shape, rng: random.Random, kind: str) -> tuple[str, int, int]:
    g = rng.randrange(shape.partitions)
    if kind == "segment":
        seq = rng.randrange(1, shape.segments * SEGMENT_SEQS + 1)
    else:
        seq = shape.segments * SEGMENT_SEQS + rng.randrange(1, shape.runs * RUN_SEQS + 1)
    return topic_name(g // shape.per_topic), g % shape.per_topic, seq


def lookup(cat: Catalog, kind: str, key: tuple[str, int, int]):
    if kind == "segment":
        found = segments.find_remote_segment(cat, *key)
    else:
        found = blocks.find_run(cat, *key)
    if found is None or not found.holds(key[2]):
        raise AssertionError(f"{kind} lookup of {key} found {found}")
    return found


def statement_of(cat: Catalog, kind: str, key) -> tuple[str, dict]:
    from sqlalchemy import event

    sent = []

    def capture(_c, _cur, statement, parameters, _ctx, _many):
        sent.append((statement, parameters))

    event.listen(cat.engine, "before_cursor_execute", capture)
    try:
        lookup(cat, kind, key)
    finally:
        event.remove(cat.engine, "before_cursor_execute", capture)
    return sent[0]


def cold_lookups(pg: PgCluster, urls: dict[str, str], shape: Shape, log) -> list[Lookups]:
    """In PostgreSQL (EXPLAIN ANALYZE) and through each URL: random keys after a server restart."""
    out: list[Lookups] = []
    for kind in ("segment", "run"):
        # Empty shared buffers. The log file named again: without it the server would write into our pipe.
        pg._run("pg_ctl", "-D", str(pg.datadir), "-l", str(pg.root / "server.log"), "-m", "fast", "restart", "-w")
        rng = random.Random(f"{kind}-server")
        server = Lookups("in PostgreSQL (plan + execute)", kind)
        with Catalog.open(urls["direct"]) as cat, cat.engine.connect() as conn:
            for _ in range(shape.samples):
                statement, parameters = statement_of(cat, kind, random_key(shape, rng, kind))
                [[plan]] = conn.exec_driver_sql(
                    "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON, FORMAT JSON) " + statement, parameters).all()
                server.ms.append(plan[0]["Planning Time"] + plan[0]["Execution Time"])
            conn.rollback()
        out.append(server)
        for path, url in urls.items():
            rng = random.Random(f"{kind}-{path}")
            result = Lookups(f"broker side, {path}", kind)
            with Catalog.open(url) as cat:
                lookup(cat, kind, random_key(shape, rng, kind))  # the pool's first connection
                for _ in range(shape.samples):
                    key = random_key(shape, rng, kind)
                    started, cpu = time.perf_counter(), time.thread_time()
                    lookup(cat, kind, key)
                    result.ms.append((time.perf_counter() - started) * 1000)
                    result.cpu_ms.append((time.thread_time() - cpu) * 1000)
            out.append(result)
        log(f"  cold {kind} lookups done")
    return out


def lookups_report(results: list[Lookups]) -> str:
    rows = []
    for r in results:
        ms = sorted(r.ms)
        cpu = sorted(r.cpu_ms)
        rows.append([r.kind, r.path, len(ms), percentile(ms, 0.5), percentile(ms, 0.99), ms[-1],
                     percentile(cpu, 0.5), percentile(cpu, 0.99)])  # NaN: not measured (in PostgreSQL)
    return format_table(["lookup", "measured", "samples", "p50 ms", "p99 ms", "max ms", "client CPU ms p50",
                         "client CPU ms p99"], rows,
                        "Cold 'where is seq N' lookups (goal: p99 <= 5 ms)")


# ---------------------------------------------------------------------------------------------------- throughput


@dataclass
class Throughput:
    load: str
    path: str
    done: int
    seconds: float
    pg_cpu_s: float
    bouncer_cpu_s: float

    @property
    def per_s(self) -> float:
        return self.done / self.seconds

    @property
    def per_pg_core(self) -> float:
        return self.done / self.pg_cpu_s if self.pg_cpu_s else float("nan")


class Committer:
    """Commits 8-run blocks to partitions of its own (a slice of the last topic), continuing their high-water
    marks; each commit's latency is kept with its start time."""

    def __init__(self, cat: Catalog, shape: Shape, slot: int, slots: int):
        self.cat = cat
        topic = topic_name(shape.topics - 1)
        self.keys = [(topic, p) for p in range(slot, shape.per_topic, slots)][: COMMIT_RUNS * 4]
        # Read, not computed: another load may have committed to some of these partitions already.
        self.hwmarks = {key: get_partition_state(cat, *key).hwmark_seq for key in self.keys}
        self.slot = slot
        self.n = 0
        self.latencies: list[tuple[float, float]] = []  # (start, ms)

    def commit_one(self) -> None:
        keys = [self.keys[(self.n * COMMIT_RUNS + i) % len(self.keys)] for i in range(COMMIT_RUNS)]
        keys = sorted(set(keys))
        runs = []
        for i, (topic, partition) in enumerate(keys):
            first = self.hwmarks[(topic, partition)] + 1
            runs.append(RunRow(topic, partition, first, first, first + 9, 10, 0, 0, 1, i * 1000, 1000))
        started = time.perf_counter()
        block_id = blocks.insert_pending_block(self.cat, f"bench/{self.slot}/{self.n}/{time.time_ns()}", 1,
                                               len(runs) * 1000)
        blocks.commit_block(self.cat, block_id, 1, runs, {k: 1 for k in keys})
        self.latencies.append((started, (time.perf_counter() - started) * 1000))
        # Then the expansion of a block the commit left unexpanded, as the broker does after the acknowledgements:
        # its cost counts in the commits per PostgreSQL core-second, not in the commit's latency.
        if not blocks.expands_in_commit(self.cat, len(runs)):
            blocks.expand_blocks(self.cat, [block_id])
        for run in runs:
            self.hwmarks[(run.topic, run.partition)] = run.last_seq
        self.n += 1


def run_threads(work, seconds: float) -> int:
    stop = threading.Event()
    counts = [0] * THREADS

    def loop(i: int) -> None:
        while not stop.is_set():
            work(i)
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts)


def throughput(pg: PgCluster, bouncer, urls: dict[str, str], shape: Shape, log) -> list[Throughput]:
    out = []
    for path, url in urls.items():
        with Catalog.open(url) as cat:
            rngs = [random.Random(f"tp-{path}-{i}") for i in range(THREADS)]
            committers = [Committer(cat, shape, i + THREADS * (path != "direct"), THREADS * 2) for i in range(THREADS)]
            loads = {"find_run": lambda i: lookup(cat, "run", random_key(shape, rngs[i], "run")),
                     "commit (8 runs)": lambda i: committers[i].commit_one()}
            for load, work in loads.items():
                run_threads(work, min(1.0, shape.seconds))  # warm: pool filled, plans cached
                pg_before, b_before, started = pg.cpu_s(), bouncer_cpu(bouncer), time.monotonic()
                done = run_threads(work, shape.seconds)
                elapsed = time.monotonic() - started
                out.append(Throughput(load, path, done, elapsed, pg.cpu_s() - pg_before,
                                      bouncer_cpu(bouncer) - b_before if path != "direct" else 0.0))
                log(f"  {load} {path}: {done / elapsed:.0f}/s")
    return out


def bouncer_cpu(bouncer) -> float:
    return process_cpu_s(bouncer.proc.pid) if bouncer is not None else 0.0


def throughput_report(results: list[Throughput]) -> str:
    rows = [[r.load, r.path, THREADS, round(r.per_s), round(r.pg_cpu_s / r.seconds, 2), round(r.per_pg_core),
             round(r.bouncer_cpu_s / r.seconds, 2)] for r in results]
    return format_table(["load", "path", "threads", "per s", "PG cores busy", "per PG core-second",
                         "PgBouncer cores"], rows, "Throughput per PostgreSQL core")


# ---------------------------------------------------------------------------------------------------- retention


@dataclass
class RetentionPass:
    name: str
    seconds: float
    deleted: int
    pg_cpu_s: float
    statements: int  # catalog calls the pass sent (reads and writes, through AsyncCatalog)


@dataclass
class RetentionResult:
    partitions: int
    passes: list[RetentionPass]
    before_ms: list[float]
    during_ms: list[float]
    lock_waits: int  # waits for a lock longer than 50 ms during the passes, as PostgreSQL logged them

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.passes)

    @property
    def deleted(self) -> int:
        return sum(p.deleted for p in self.passes)


class _CountingCatalog:
    def __init__(self, catalog: AsyncCatalog) -> None:
        self.catalog = catalog
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.catalog, name)

    async def read(self, fn, *args, **kwargs):
        self.calls += 1
        return await self.catalog.read(fn, *args, **kwargs)

    async def write(self, fn, *args, **kwargs):
        self.calls += 1
        return await self.catalog.write(fn, *args, **kwargs)


class _Sink:
    def copied(self, tp, base, last) -> None:
        pass

    def first_available_moved(self, tp, seq) -> None:
        pass


def retention(pg: PgCluster, url: str, shape: Shape, now: datetime, root: Path, log) -> RetentionResult:
    """RemoteTier.remote_retention_pass over every partition, led by this broker, on a clock at `now`: the first pass
    (1 % of the partitions expire a segment; the once-a-grace-period look for runs below the start), an idle pass a
    minute later, and an idle pass with that look a grace period later. Every partition's first available seq is
    above 1, as where retention has run, so that the look probes each partition's oldest run."""
    from tests.support.clock import ManualClock
    from tests.tiering.tier_state import led_state
    from tiered.metrics import Metrics
    from tiered.tiering.remote_tier import RemoteTier
    from tiered.topic_partition import TopicPartition

    config = TopicConfig(remote_retention_secs=7 * 86400)
    grace = timedelta(minutes=10)
    store = LocalObjectStore(root / "objects")
    keys = [(topic_name(g // shape.per_topic), g % shape.per_topic) for g in range(shape.partitions)]
    with Catalog.open(url) as cat:
        epochs = {key: 1 for key in keys}
        committer = Committer(cat, shape, THREADS * 2, THREADS * 2 + 1)
        stop = threading.Event()

        def commit_loop() -> None:
            while not stop.is_set():
                committer.commit_one()
                time.sleep(0.005)

        # PostgreSQL logs every wait for a lock that lasts longer than deadlock_timeout: the stalls counted here.
        with cat.read() as conn:  # autocommit: ALTER SYSTEM runs outside a transaction
            conn.exec_driver_sql("ALTER SYSTEM SET log_lock_waits = on")
            conn.exec_driver_sql("ALTER SYSTEM SET deadlock_timeout = '50ms'")
            conn.exec_driver_sql("SELECT pg_reload_conf()")
        log_before = (pg.root / "server.log").read_text(errors="replace").count("still waiting for")
        # As where retention has run: every first available seq above 1, so that the look for runs below the start
        # probes each partition's oldest run. (Before the commits start; the change counter bumped once.)
        with cat.write() as conn:
            conn.exec_driver_sql("SELECT set_config('tiered.changes_counted', 'on', true)")
            conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
            conn.exec_driver_sql("UPDATE partitions SET first_available_seq = 2 WHERE first_available_seq = 1")
        thread = threading.Thread(target=commit_loop)
        thread.start()
        time.sleep(max(2.0, shape.seconds / 2))
        started_wall = time.perf_counter()
        passes: list[RetentionPass] = []

        async def run_passes() -> None:
            catalog = _CountingCatalog(AsyncCatalog(cat))
            clock = ManualClock(start_ms=now.timestamp() * 1000)
            tier = RemoteTier(store, catalog, _Sink(), metrics=Metrics(), state=led_state(epochs, config=config),
                              fence=lambda tp, epoch, reason: None, grace=grace, clock=clock)
            try:
                for name, advance in (("1 % expire, with the look for runs below the start", 0),
                                      ("nothing to expire", 60),
                                      ("nothing to expire, with the look for runs below the start", grace.total_seconds())):
                    clock.advance(advance)
                    calls, pg_before, started = catalog.calls, pg.cpu_s(), time.perf_counter()
                    deleted = await tier.remote_retention_pass()
                    passes.append(RetentionPass(name, time.perf_counter() - started, deleted, pg.cpu_s() - pg_before,
                                                catalog.calls - calls))
                    log(f"  retention: {name}: {passes[-1].seconds:.2f} s")
            finally:
                catalog.catalog.shutdown()  # the threads; `cat` is closed by its owner below

        asyncio.run(run_passes())
        elapsed = time.perf_counter() - started_wall
        stop.set()
        thread.join()
    waits = (pg.root / "server.log").read_text(errors="replace").count("still waiting for") - log_before
    before = [ms for start, ms in committer.latencies if start < started_wall]
    during = [ms for start, ms in committer.latencies if started_wall <= start < started_wall + elapsed]
    return RetentionResult(shape.partitions, passes, before, during, waits)


def retention_report(r: RetentionResult) -> str:
    rows = [[p.name, round(p.seconds, 3), p.statements, p.deleted, round(p.pg_cpu_s, 2)] for p in r.passes]
    table = format_table(["pass", "seconds", "catalog calls", "segments expired", "PG CPU s"], rows,
                         f"Remote retention passes over {r.partitions:,} led partitions (RemoteTier); "
                         f"lock waits > 50 ms: {r.lock_waits}")
    lat = []
    for name, values in (("before the passes", r.before_ms), ("during the passes", r.during_ms)):
        ms = sorted(values)
        lat.append([name, len(ms), percentile(ms, 0.5), percentile(ms, 0.99), ms[-1] if ms else float("nan")])
    return table + "\n\n" + format_table(["commits (8 runs)", "count", "p50 ms", "p99 ms", "max ms"], lat,
                                         "Commit latency while retention runs, in this process (its GIL shared with the pass)")


# ---------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scale_lookup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--no-retention", action="store_true", help="leave out the retention passes (part 3)")
    parser.add_argument("--only-retention", action="store_true", help="only the retention passes (part 3)")
    args = parser.parse_args(argv)
    size = size_of(args)
    shape = shape_of(size)
    bindir = find_pg_bindir()
    if bindir is None:
        cannot_run("bench_scale_lookup needs the PostgreSQL server binaries (make system-deps)")
    if shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").exists():
        cannot_run("bench_scale_lookup needs pgbouncer (Debian package pgbouncer; make system-deps)")

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    from tests.support.pgbouncer import PgBouncer

    now = datetime.now(timezone.utc)
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-scale-lookup-"))
    pg = PgCluster(bindir).start()
    bouncer = None
    try:
        url = pg.url("postgres")
        upgrade(url)
        log(f"loading {shape.partitions:,} partitions, {shape.partitions * shape.segments:,} segments, "
            f"{shape.partitions * shape.runs:,} block runs")
        started = time.monotonic()
        load = bulk_load(url, shape, now, log)
        load_s = time.monotonic() - started
        # A directory of its own: PgBouncer runs as `postgres` when we are root, and `root` is ours alone.
        bouncer = PgBouncer(pg, Path(tempfile.mkdtemp(prefix="tiered-bench-pgbouncer-")), free_port())
        bouncer.start()
        urls = {"direct": url, "PgBouncer": bouncer.url("postgres")}
        lookups = [] if args.only_retention else cold_lookups(pg, urls, shape, log)
        rates = [] if args.only_retention else throughput(pg, bouncer, urls, shape, log)
        kept = None if args.no_retention else retention(pg, url, shape, now, root, log)
    finally:
        if bouncer is not None:
            bouncer.stop()
            shutil.rmtree(bouncer.root, ignore_errors=True)
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)

    print(f"the catalog at scale (issue 28, goals 5-7){''.join(' ' + f for f in size.flags)}")
    print()
    print(format_table(["rows", "count"], [
        ["partitions", shape.partitions], ["remote segments", shape.partitions * shape.segments],
        ["block runs", shape.partitions * shape.runs], ["blocks", shape.partitions * shape.runs // RUNS_PER_BLOCK],
    ], f"Catalog loaded in {load_s:.0f} s"))
    print(format_table(["relation", "MB (with indexes)"],
                       [[k.removesuffix(" bytes"), round(v / 2**20)] for k, v in load.items() if k.endswith("bytes")]))
    print()
    if lookups:
        print(lookups_report(lookups))
        print()
    if rates:
        print(throughput_report(rates))
    if kept is not None:
        print()
        print(retention_report(kept))
    if args.json:
        args.json.write_text(json.dumps({
            "load_s": load_s, "load": load,
            "lookups": [{"path": r.path, "kind": r.kind, "p50_ms": percentile(sorted(r.ms), 0.5),
                         "p99_ms": percentile(sorted(r.ms), 0.99)} for r in lookups],
            "throughput": [{"load": r.load, "path": r.path, "per_s": r.per_s, "per_pg_core": r.per_pg_core}
                           for r in rates],
            "retention": kept and {"partitions": kept.partitions, "deleted": kept.deleted,
                                   "passes": [{"name": p.name, "seconds": p.seconds, "calls": p.statements}
                                              for p in kept.passes],
                                   "lock_waits_over_50ms": kept.lock_waits},
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
