"""Wide blocks and partition creation (issue 28, goals 3 and 4).

    python -m bench.bench_scale_commit [--quick|--smoke] [--part commit|durable|create] [--backend sqlite|postgresql]
                                       [--tree CHECKOUT] [--against CHECKOUT]

- commit: `catalog.blocks.commit_block` called in this process, on a throwaway PostgreSQL cluster (fsync off) and on
  SQLite (a file, synchronous=FULL, as the broker opens it): a wide block of 1,600 runs (8 topics x 200 partitions,
  one message each) and a narrow block of 8 runs (partition 0 of each topic, 200 messages each: the same messages),
  alternated, each preceded by its intent row, with the process's start-up heap frozen as a broker's is (tiered.heap). Per load: p50, p99 and max of the commit's wall time, the mean CPU
  it took (this thread's, plus every PostgreSQL process's: what a busy machine does not inflate), and the SQL
  statements one commit sends; then, apart, the CPU of this checkout's expansion of the block (on PostgreSQL: its
  runs into block_runs, which the broker does after the acknowledgements). Goal: the wide commit <= 20 ms p99. `--against CHECKOUT` runs that checkout's
  commit_block too, on a catalog of its own in the same cluster, alternating commit by commit with this one's: a
  before/after under the same load.
- durable: a `tiered serve` process on PostgreSQL and moto's S3 (each a process of its own), the same 8 topics of
  200 partitions, `produce.ack=durable`. One connection, open loop at 32 requests a second of 200 messages of 100
  bytes: the wide load sends each request to one topic's 200 partitions (one message each), so a 250 ms block holds
  1,600 runs; the narrow load sends each to one topic's partition 0 (one bundle of 200 messages), 8 runs a block.
  After a warm-up of each (the first append to a partition creates its segment files), the loads alternate (wide,
  narrow, wide, narrow). Each latency runs from the request's scheduled send time to its response; "broker cores" and
  "PG cores" are the CPU the broker process and PostgreSQL used per second of each load (what a busy machine
  inflates far less than the latencies). Goal: wide ack p99 <= 1.25 x narrow ack p99.
- create: the same broker setup; CreateTopic of one topic of 4,096 partitions (timed to the answer, then to the
  moment the broker leads every partition), then 25 topics of 4,096 (102,400 partitions) one after the other.
  Goals: 4,096 in <= 1 s, 100,000 in <= 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import format_table, percentile
from bench.harness import REPO, BrokerProcess, MotoProcess, PgCluster, find_pg_bindir, process_cpu_s
from bench.loadgen import FRAME_HEADER, U32, make_bundle, open_conn, _Connected
from bench.loadgen import Shape
from bench.sizes import Size, add_size_options, cannot_run, size_of
from tiered.protocol import requests as rq
from tiered.protocol.frame import MsgType, encode_frame

TOPICS, PARTITIONS = 8, 200
MESSAGE_BYTES = 100
REQUESTS_PER_S = 32  # x 200 messages: 6,400 messages a second, 1,600 per 250 ms block
CREATE_PARTITIONS, CREATE_TOPICS = 4096, 25


def topic_name(i: int) -> str:
    return f"wide{i}"


# ---------------------------------------------------------------------------------------------------- commit


@dataclass
class CommitResult:
    backend: str
    load: str
    runs: int
    code: str = "this"  # whose commit_block: this checkout's, or the --against one's
    ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # this thread's CPU, plus PostgreSQL's (all its processes)
    statements: float = 0.0
    # The expansion after the commit (this checkout's, on PostgreSQL: the runs into block_runs, off the ack's path),
    # timed apart: the CPU moved out of the commit, not removed.
    expand_cpu_ms: list[float] = field(default_factory=list)

    def row(self) -> list:
        ms = sorted(self.ms)
        # The mean, not the median: PostgreSQL's CPU is read from /proc in 10 ms ticks, whose median is one tick or
        # the next, while their mean over many commits is the CPU per commit.
        expand = sum(self.expand_cpu_ms) / len(self.expand_cpu_ms) if self.expand_cpu_ms else 0.0
        return [self.backend, self.code, self.load, self.runs, len(ms), percentile(ms, 0.5), percentile(ms, 0.99),
                ms[-1], sum(self.cpu_ms) / len(self.cpu_ms), self.statements, expand]


def _runs(wide: bool, seqs: dict[tuple[str, int], int], epochs: dict[tuple[str, int], int], now_ms: int):
    from tiered.catalog.blocks import RunRow

    runs, position = [], 0
    keys = ([(topic_name(t), p) for t in range(TOPICS) for p in range(PARTITIONS)] if wide
            else [(topic_name(t), 0) for t in range(TOPICS)])
    messages = 1 if wide else PARTITIONS
    for key in keys:
        first = seqs[key] + 1
        length = messages * (MESSAGE_BYTES + 20)
        runs.append(RunRow(key[0], key[1], first, first, first + messages - 1, messages, now_ms, now_ms,
                           epochs[key], position, length))
        seqs[key] = first + messages - 1
        position += length
    return runs


def commit_of(tree: Path):
    """`commit_block` of another checkout (its tiered/catalog/blocks.py, importing this checkout's other catalog
    modules: the schema must be the same), for an A/B in one run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiered.catalog._blocks_against", tree / "tiered/catalog/blocks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.commit_block


def measure_commits(urls: dict[str, str], backend: str, rounds: int, log=print, server_cpu=lambda: 0.0,
                    commits=None) -> list[CommitResult]:
    """`urls` names one catalog per contender ("this", and the --against checkout's), each fed the same blocks;
    commits alternate between the contenders and between wide and narrow, so that they share the machine's load."""
    from tiered.catalog import Catalog, blocks, partitions, topics
    from tiered.catalog.migrate import upgrade

    from tiered.heap import Heap

    commits = {"this": blocks.commit_block, **(commits or {})}
    heap = Heap(time.monotonic)
    results = {(code, load): CommitResult(backend, load, TOPICS * PARTITIONS if load == "wide" else TOPICS, code)
               for code in urls for load in ("wide", "narrow")}
    cats, epochs = {}, {}
    try:
        for code, url in urls.items():
            upgrade(url)
            cats[code] = cat = Catalog.open(url)
            epochs[code] = {}
            for t in range(TOPICS):
                topics.create_topic(cat, topic_name(t), PARTITIONS)
                claimed = partitions.claim_partitions(cat, 1, topic_name(t), range(PARTITIONS))
                epochs[code].update({(topic_name(t), p): e for p, e in claimed.items()})
        seqs = {code: {key: 0 for key in epochs[code]} for code in urls}
        order = list(urls)
        # As a broker does once started (tiered.heap): what start-up left (the imported libraries, the catalogs) is
        # set aside from the collector, whose full passes would otherwise walk it during the timed commits (30-50 ms
        # each, the whole of this table's p99 without it).
        heap.settle("the catalogs are set up")
        for i in range(rounds * 2 + 4):
            load = "wide" if i % 2 == 0 else "narrow"
            for code in (order if i % 4 < 2 else order[::-1]):
                cat = cats[code]
                runs = _runs(load == "wide", seqs[code], epochs[code], int(time.time() * 1000))
                block_id = blocks.insert_pending_block(cat, f"bench/{backend}/{i}", 1, runs[-1].position + 1000)
                statements = cat.statements
                server0, cpu0 = server_cpu(), time.thread_time()
                t0 = time.perf_counter()
                commits[code](cat, block_id, 1, runs, {(r.topic, r.partition): r.leader_epoch for r in runs})
                elapsed = time.perf_counter() - t0
                cpu = time.thread_time() - cpu0 + server_cpu() - server0
                sent = cat.statements - statements
                expand_cpu = None
                if code == "this" and not blocks.expands_in_commit(cat, len(runs)):
                    server0, cpu0 = server_cpu(), time.thread_time()
                    blocks.expand_blocks(cat, [block_id])
                    expand_cpu = time.thread_time() - cpu0 + server_cpu() - server0
                if i >= 4:  # the first two of each load warm the caches and the statement cache
                    result = results[code, load]
                    result.ms.append(elapsed * 1000)
                    result.cpu_ms.append(cpu * 1000)
                    result.statements = sent
                    if expand_cpu is not None:
                        result.expand_cpu_ms.append(expand_cpu * 1000)
    finally:
        heap.thaw()
        for cat in cats.values():
            cat.close()
    return list(results.values())


def run_commit(backends: list[str], size: Size, log=print, against: Path | None = None) -> list[CommitResult]:
    rounds = size.pick(200, 30, 3)
    codes = ["this"] + (["against"] if against else [])
    commits = {"against": commit_of(against)} if against else {}
    out: list[CommitResult] = []
    for backend in backends:
        log(f"  commit on {backend}: {rounds} wide and {rounds} narrow blocks" + (" per checkout" if against else "")
            + " ...")
        if backend == "sqlite":
            root = Path(tempfile.mkdtemp(prefix="tiered-bench-commit-"))
            try:
                out += measure_commits({c: f"sqlite:///{root / c}.db" for c in codes}, backend, rounds, log,
                                       commits=commits)
            finally:
                shutil.rmtree(root, ignore_errors=True)
        else:
            pg = PgCluster(find_pg_bindir()).start()
            try:
                if against:
                    import psycopg

                    with psycopg.connect(pg.url().replace("+psycopg", ""), autocommit=True) as admin:
                        admin.execute("CREATE DATABASE against")
                urls = {c: pg.url() if c == "this" else pg.url(c) for c in codes}
                out += measure_commits(urls, backend, rounds, log, pg.cpu_s, commits)
            finally:
                pg.stop()
    return out


def commit_report(results: list[CommitResult]) -> str:
    return format_table(["catalog", "code", "block", "runs", "commits", "p50 ms", "p99 ms", "max ms", "CPU ms mean",
                         "statements", "expansion CPU ms mean"],
                        [r.row() for r in results],
                        "commit_block: wide (8 topics x 200 partitions, 1 msg each) vs narrow (8 partitions, "
                        "200 msgs each)")


# ---------------------------------------------------------------------------------------------------- durable


class MultiProduceConn(_Connected, asyncio.Protocol):
    """Open loop: sends `frames[i % len(frames)]` (each a produce to `partitions` partitions) at `rate_per_s`
    requests a second until `stop_at`; every answer must be OK for every partition. Latency from the scheduled send
    time of each request to its answer."""

    def __init__(self, frames: list[bytes], partitions: int, rate_per_s: float):
        self.frames = [(f[:FRAME_HEADER.size + 2], f[FRAME_HEADER.size + 2 + U32.size:]) for f in frames]
        self.answer_length = U32.size + partitions
        self.rate_per_s = rate_per_s
        self.latencies_s: list[float] = []
        self.errors = 0
        self.first_error = ""
        self.buf = bytearray()
        self.sent_at: dict[int, float] = {}
        self.next_id = 1
        self.sending = True
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future | None = None
        self.connected: asyncio.Future = asyncio.get_running_loop().create_future()

    def run(self, stop_at: float) -> asyncio.Future:
        self.done = asyncio.get_running_loop().create_future()
        self.stop_at = stop_at
        self.started_at = time.monotonic()
        self._tick()
        return self.done

    def _tick(self) -> None:
        now = time.monotonic()
        interval = 1 / self.rate_per_s
        while True:
            scheduled = self.started_at + (self.next_id - 1) * interval
            if scheduled > min(now, self.stop_at):
                break
            rid = self.next_id
            self.next_id += 1
            prefix, suffix = self.frames[rid % len(self.frames)]
            self.sent_at[rid] = scheduled
            self.transport.write(prefix + U32.pack(rid) + suffix)
        upcoming = self.started_at + (self.next_id - 1) * interval
        if upcoming < self.stop_at:
            asyncio.get_running_loop().call_later(max(0.0, upcoming - time.monotonic()), self._tick)
        else:
            self.sending = False
            self._maybe_done()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        now = time.monotonic()
        position = 0
        while len(self.buf) - position >= FRAME_HEADER.size:
            msg_id, length = FRAME_HEADER.unpack_from(self.buf, position)
            stop = position + FRAME_HEADER.size + length
            if stop > len(self.buf):
                break
            if msg_id == MsgType.PRODUCE:
                body = bytes(self.buf[position + FRAME_HEADER.size:stop])
                rid = U32.unpack_from(body)[0]
                if length != self.answer_length or any(body[U32.size:]):
                    self.errors += 1
                    self.first_error = self.first_error or f"produce response {body.hex()[:80]}"
                self.latencies_s.append(now - self.sent_at.pop(rid))
            position = stop
        del self.buf[:position]
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.done is not None and not self.done.done() and not self.sending and not self.sent_at:
            self.done.set_result(None)


def load_frames(wide: bool) -> tuple[list[bytes], int]:
    frames = []
    if wide:
        bundle = make_bundle(Shape(MESSAGE_BYTES, 1))
        for t in range(TOPICS):
            parts = tuple(rq.ProducePartition(p, bundle) for p in range(PARTITIONS))
            req = rq.ProduceRequest(0, (rq.ProduceTopic(topic_name(t), parts),))
            frames.append(encode_frame(MsgType.PRODUCE, rq.encode_produce_request(req)))
        return frames, PARTITIONS
    bundle = make_bundle(Shape(MESSAGE_BYTES, PARTITIONS))
    for t in range(TOPICS):
        req = rq.ProduceRequest(0, (rq.ProduceTopic(topic_name(t), (rq.ProducePartition(0, bundle),)),))
        frames.append(encode_frame(MsgType.PRODUCE, rq.encode_produce_request(req)))
    return frames, 1


@dataclass
class AckResult:
    load: str
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    # The broker's CPU (every thread) and PostgreSQL's during the load, and the load's wall time: what the load
    # costs, which a busy machine inflates far less than the latencies.
    broker_cpu_s: float = 0.0
    pg_cpu_s: float = 0.0
    seconds: float = 0.0

    def p(self, q: float) -> float:
        return percentile(sorted(self.latencies_s), q) * 1000


class Service:
    """moto, PostgreSQL and one broker, in processes of their own."""

    def __init__(self, tree: Path = REPO, profile: Path | None = None):
        self.root = Path(tempfile.mkdtemp(prefix="tiered-bench-scale-"))
        self.moto = MotoProcess(self.root).start()
        self.pg = PgCluster(find_pg_bindir()).start()
        self.broker = BrokerProcess(self.root / "data", "--store", f"s3://{self.moto.bucket}/bench", "--s3-path-style",
                                    "--catalog", self.pg.url(), env=self.moto.env, tree=tree,
                                    profile_path=profile).start()

    def stop(self) -> None:
        for part in (self.broker, self.moto, self.pg):
            part.stop()
        shutil.rmtree(self.root, ignore_errors=True)


async def _client(port: int):
    from tiered.client import Client

    return await Client.connect("127.0.0.1", port)


async def wait_led(service: Service, topics: list[str], partitions: int, timeout_s: float = 300.0) -> None:
    """Until the catalog names an epoch for every partition of `topics` (the broker claimed them)."""
    from tiered.catalog import Catalog, partitions as parts

    deadline = time.monotonic() + timeout_s
    waiting = list(topics)
    with Catalog.open(service.pg.url()) as cat:
        while waiting:  # one topic's rows per look: the catalog and this process stay out of the broker's way
            states = await asyncio.to_thread(parts.get_partition_states, cat, waiting[0])
            if len(states) == partitions and all(s.leader_epoch for s in states):
                waiting.pop(0)
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"topics {waiting} not all led after {timeout_s} s")
            await asyncio.sleep(0.05)


async def run_durable(size: Size, tree: Path = REPO, log=print) -> list[AckResult]:
    seconds = size.pick(12.0, 4.0, 1.0)
    # At --smoke (figures mean nothing) the warm-up is shorter and the loads follow one another without a pause.
    warm_s, pause_s = size.pick(3.0, 3.0, 1.0), size.pick(1.0, 1.0, 0.0)
    service = Service(tree)
    try:
        client = await _client(service.broker.port)
        try:
            for t in range(TOPICS):
                await client.create_topic(topic_name(t), PARTITIONS, {"produce.ack": "durable"})
        finally:
            await client.close()
        await wait_led(service, [topic_name(t) for t in range(TOPICS)], PARTITIONS)
        results = {"wide": AckResult("wide"), "narrow": AckResult("narrow")}
        # Warm-up, not counted: the first append to a partition creates its segment files (an open and a sync
        # each, 1,600 of them for the wide load), which is creation's cost, not a block's.
        for load in ("wide", "narrow"):
            log(f"  warm-up, {load} load, {warm_s:g} s ...")
            frames, partitions = load_frames(load == "wide")
            conn = await open_conn(lambda: MultiProduceConn(frames, partitions, REQUESTS_PER_S), service.broker.port)
            try:
                await conn.run(time.monotonic() + warm_s)
            finally:
                conn.transport.close()
            await asyncio.sleep(pause_s)
        for load in ("wide", "narrow", "wide", "narrow"):
            log(f"  durable acks, {load} load, {seconds:.0f} s ...")
            frames, partitions = load_frames(load == "wide")
            conn = await open_conn(lambda: MultiProduceConn(frames, partitions, REQUESTS_PER_S), service.broker.port)
            broker0, pg0, wall0 = process_cpu_s(service.broker.pid), service.pg.cpu_s(), time.monotonic()
            try:
                await conn.run(time.monotonic() + seconds)
            finally:
                conn.transport.close()
            result = results[load]
            result.broker_cpu_s += process_cpu_s(service.broker.pid) - broker0
            result.pg_cpu_s += service.pg.cpu_s() - pg0
            result.seconds += time.monotonic() - wall0
            result.latencies_s += conn.latencies_s[REQUESTS_PER_S:]  # the first second warms up
            result.errors += conn.errors
            result.first_error = result.first_error or conn.first_error
            await asyncio.sleep(pause_s)
        return list(results.values())
    finally:
        service.stop()


def durable_report(results: list[AckResult]) -> str:
    narrow = next(r for r in results if r.load == "narrow")
    rows = [[r.load, TOPICS * PARTITIONS if r.load == "wide" else TOPICS, len(r.latencies_s), r.p(0.5), r.p(0.99),
             r.p(1.0), r.p(0.99) / narrow.p(0.99), r.broker_cpu_s / r.seconds, r.pg_cpu_s / r.seconds, r.errors]
            for r in results]
    return format_table(["load", "runs/block", "acks", "p50 ms", "p99 ms", "max ms", "p99 / narrow", "broker cores",
                         "PG cores", "errors"], rows,
                        f"durable acks through a broker (PostgreSQL + moto S3), {REQUESTS_PER_S} requests/s of "
                        f"{PARTITIONS} x {MESSAGE_BYTES} B")


# ---------------------------------------------------------------------------------------------------- create


@dataclass
class CreateResult:
    what: str
    partitions: int
    answered_s: float
    led_s: float


async def create_topics(port: int, names: list[str], partitions: int) -> None:
    """One connection per topic: a broker closes a connection idle for 16 s, as TANK does."""
    for name in names:
        client = await _client(port)
        try:
            await client.create_topic(name, partitions, {})
        finally:
            await client.close()


async def run_create(size: Size, tree: Path = REPO, log=print, profile: Path | None = None) -> list[CreateResult]:
    count = size.pick(CREATE_TOPICS, 3, 1)
    service = Service(tree, profile)
    out: list[CreateResult] = []
    try:
        for names in (["create0"], [f"many{i}" for i in range(count)]):
            log(f"  create: {len(names)} topic(s) of {CREATE_PARTITIONS} partitions ...")
            t0 = time.monotonic()
            await create_topics(service.broker.port, names, CREATE_PARTITIONS)
            answered = time.monotonic() - t0
            await wait_led(service, names, CREATE_PARTITIONS)
            out.append(CreateResult(f"{len(names)} topic(s) x {CREATE_PARTITIONS}", len(names) * CREATE_PARTITIONS,
                                    answered, time.monotonic() - t0))
    finally:
        service.stop()
    return out


def create_report(results: list[CreateResult]) -> str:
    rows = [[r.what, r.partitions, r.answered_s, r.led_s, r.partitions / r.led_s] for r in results]
    return format_table(["created", "partitions", "answered s", "all led s", "partitions/s"], rows,
                        "CreateTopic through a broker (PostgreSQL + moto S3): until the answer, until every partition "
                        "is led")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scale_commit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser)
    parser.add_argument("--part", action="append", choices=("commit", "durable", "create"))
    parser.add_argument("--backend", action="append", choices=("sqlite", "postgresql"),
                        help="catalog of the commit part (default: both)")
    parser.add_argument("--tree", type=Path, default=REPO,
                        help="the checkout whose broker runs the durable and create parts (another commit's, for a "
                             "before/after)")
    parser.add_argument("--against", type=Path,
                        help="the commit part also runs this checkout's commit_block (its tiered/catalog/blocks.py), "
                             "alternating commit by commit with this one's, each on a catalog of its own")
    parser.add_argument("--profile", type=Path, help="cProfile the broker of the create part into this file")
    args = parser.parse_args(argv)
    parts = args.part or ["commit", "durable", "create"]
    size = size_of(args)
    if find_pg_bindir() is None:
        cannot_run("bench_scale_commit needs the PostgreSQL server binaries (make system-deps)")

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    print(f"wide blocks and partition creation (issue 28){''.join(' ' + f for f in size.flags)}")
    if "commit" in parts:
        print()
        print(commit_report(run_commit(args.backend or ["postgresql", "sqlite"], size, log, args.against)))
    if "durable" in parts:
        print()
        print(durable_report(asyncio.run(run_durable(size, args.tree, log))))
    if "create" in parts:
        print()
        print(create_report(asyncio.run(run_create(size, args.tree, log, args.profile))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
