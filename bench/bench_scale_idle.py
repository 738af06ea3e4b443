"""An idle cluster at scale, and a failover at that size (issue 28 goals 1 and 2; docs/scale.md "Idle cost").

    python -m bench.bench_scale_idle [--quick|--smoke] [--topics 25] [--partitions 4096] [--settle-s 60] [--measure-s 30]
                                     [--mode idle|failover|both] [--lease-ms 10000] [--sample 64]

- idle: three `tiered serve` processes on one real PostgreSQL (a temp cluster) and a local-directory store they
  share, `--topics` durable topics of `--partitions` partitions each (default 25 x 4,096 = 102,400), no traffic.
  After `--settle-s`, each broker's CPU and PostgreSQL's (the postmaster and every backend, /proc/<pid>/stat) over
  `--measure-s`, in cores. Goals: each broker <= 0.02 cores, PostgreSQL <= 0.05 cores.
- failover: then `kill -9` of broker 0. From the kill: when the last of its partitions was claimed by a live broker
  (the catalog polled every 0.1 s), and for `--sample` of its partitions (spread over every topic), when a durable
  produce through a client that follows redirects was acknowledged again. Goal: every partition within lease + 2 s.
`--tree DIR` runs the brokers from another checkout (e.g. `git archive main | tar -x -C DIR`) for a before/after.
Real parts throughout; the store is a local directory so that the catalog and the brokers are what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import format_table
from bench.harness import REPO, BrokerProcess, PgCluster, find_pg_bindir, process_cpu_s
from bench.sizes import Size, add_size_options, cannot_run, size_of

BROKERS = 3
GOAL_BROKER_CORES = 0.02
GOAL_PG_CORES = 0.05
DURABLE = {"produce.ack": "durable"}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Service:
    def __init__(self, root: Path, pg: PgCluster, lease_ms: int, tree: Path):
        self.root = root
        self.tree = tree
        self.pg = pg
        self.lease_ms = lease_ms
        self.brokers: dict[int, BrokerProcess] = {}

    def start(self, broker_id: int) -> BrokerProcess:
        bp = BrokerProcess(self.root / f"disk{broker_id}", "--catalog", self.pg.url(), "--store",
                           f"file://{self.root}/objects", "--broker-id", str(broker_id), "--cluster-lease-ms",
                           str(self.lease_ms), tree=self.tree)
        self.brokers[broker_id] = bp
        return bp.start(timeout_s=600.0)

    def claimed(self) -> dict[tuple[str, int], tuple[int | None, int]]:
        """Every partition's (assigned leader, epoch)."""
        from tiered.catalog import Catalog
        from tiered.catalog import cluster

        with Catalog.open(self.pg.url()) as cat:
            return {(a.topic, a.partition): (a.leader_broker, a.leader_epoch) for a in cluster.assignments(cat)}

    def stop_all(self) -> None:
        for bp in self.brokers.values():
            if bp.proc is not None and bp.proc.poll() is None:
                bp.proc.kill()
                bp.proc.wait(10)


async def create_topics(service: Service, topics: int, partitions: int) -> list[str]:
    from tiered.client import Client

    names = [f"idle{i:02d}" for i in range(topics)]
    for i, name in enumerate(names):
        started = time.monotonic()
        for attempt in range(3):
            # A creation already done answers EXISTS: sent again over a new connection if the last one was lost.
            client = await Client.connect_any([f"127.0.0.1:{bp.port}" for bp in service.brokers.values()])
            try:
                await client.create_topic(name, partitions, DURABLE)
                break
            except (ConnectionError, OSError) as error:
                log(f"topic {name}: {error}; asking again")
                for b, bp in service.brokers.items():
                    if bp.proc.poll() is not None:
                        raise RuntimeError(f"broker {b} exited: {bp.output()}") from None
            finally:
                await client.close()
        log(f"topic {i + 1}/{topics}: {name}, {partitions} partitions in {time.monotonic() - started:.1f} s")
    deadline = time.monotonic() + 600
    while True:
        unclaimed = [k for k, (_, epoch) in (await asyncio.to_thread(service.claimed)).items() if not epoch]
        if not unclaimed:
            return names
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(unclaimed)} partitions never claimed, e.g. {unclaimed[:3]}")
        await asyncio.sleep(1)


def measure_idle(service: Service, settle_s: float, measure_s: float) -> dict[str, float]:
    log(f"settling {settle_s:.0f} s, then measuring {measure_s:.0f} s with no traffic")
    time.sleep(settle_s)
    pids = {f"broker {b}": bp.pid for b, bp in service.brokers.items()}
    before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    pg_before = service.pg.cpu_s()
    started = time.monotonic()
    time.sleep(measure_s)
    elapsed = time.monotonic() - started
    cores = {name: (process_cpu_s(pid) - before[name]) / elapsed for name, pid in pids.items()}
    cores["PostgreSQL (all processes)"] = (service.pg.cpu_s() - pg_before) / elapsed
    return cores


async def failover(service: Service, names: list[str], sample: int, seed: int) -> dict[str, float]:
    from tiered.client import Client, TankError

    victim = 0
    before = await asyncio.to_thread(service.claimed)
    theirs = sorted(k for k, (leader, _) in before.items() if leader == victim)
    rng = random.Random(seed)
    sampled = sorted(rng.sample(theirs, min(sample, len(theirs))))
    others = [bp for b, bp in service.brokers.items() if b != victim]
    client = await Client.connect_any([f"127.0.0.1:{bp.port}" for bp in others])
    acked: dict[tuple[str, int], float] = {}

    async def produce_until_acked(key: tuple[str, int]) -> None:
        while True:
            try:
                await client.produce(key[0], key[1], [b"after the kill"], timeout_s=60.0)
            except (TankError, ConnectionError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.05)
                continue
            acked[key] = time.monotonic()
            return

    log(f"kill -9 of broker {victim}, which leads {len(theirs)} partitions; producing to {len(sampled)} of them")
    killed_at = time.monotonic()
    service.brokers[victim].proc.kill()
    service.brokers[victim].proc.wait(10)
    producers = [asyncio.create_task(produce_until_acked(key)) for key in sampled]
    waiting = set(theirs)
    last_claim = None
    deadline = killed_at + service.lease_ms / 1000.0 + 120
    while waiting and time.monotonic() < deadline:
        now = await asyncio.to_thread(service.claimed)
        moved = {k for k in waiting if now[k][1] > before[k][1] and now[k][0] != victim}
        if moved:
            last_claim = time.monotonic()
            waiting -= moved
        await asyncio.sleep(0.1)
    try:
        await asyncio.wait_for(asyncio.gather(*producers), max(1.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        for task in producers:
            task.cancel()
    await client.close()
    took = sorted(t - killed_at for t in acked.values())
    return {"partitions of the killed broker": len(theirs), "not claimed": len(waiting),
            "last claim (s after the kill)": (last_claim - killed_at) if last_claim else float("nan"),
            "sampled": len(sampled), "sampled never acked": len(sampled) - len(took),
            "durable ack again, median (s)": took[len(took) // 2] if took else float("nan"),
            "durable ack again, max (s)": took[-1] if took else float("nan"),
            "goal (lease + 2 s)": service.lease_ms / 1000.0 + 2}


def print_idle(cores: dict[str, float], topics: int, partitions: int) -> None:
    print(f"\nidle cluster: {BROKERS} brokers, {topics} topics x {partitions} partitions = {topics * partitions} "
          f"partitions, no traffic")
    print(format_table(("process", "cores", "goal"), [
        (name, f"{value:.4f}", GOAL_PG_CORES if name.startswith("PostgreSQL") else GOAL_BROKER_CORES)
        for name, value in cores.items()]))


def print_failover(figures: dict[str, float]) -> None:
    print()
    print(format_table(("failover: kill -9 of broker 0", "value"), list(figures.items())))


async def run(args: argparse.Namespace) -> int:
    bindir = find_pg_bindir()
    if bindir is None:
        cannot_run("bench_scale_idle: PostgreSQL binaries not found (run `sh .ci/system-deps`)")
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-scale-"))
    pg = PgCluster(bindir).start()
    service = Service(root, pg, args.lease_ms, args.tree.resolve())
    try:
        for broker_id in range(BROKERS):
            service.start(broker_id)
        started = time.monotonic()
        names = await create_topics(service, args.topics, args.partitions)
        log(f"{args.topics * args.partitions} partitions created and claimed in {time.monotonic() - started:.0f} s")
        if args.mode in ("idle", "both"):
            print_idle(measure_idle(service, args.settle_s, args.measure_s), args.topics, args.partitions)
        if args.mode in ("failover", "both"):
            print_failover(await failover(service, names, args.sample, args.seed))
    finally:
        service.stop_all()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scale_idle", description=__doc__.split("\n")[0])
    add_size_options(parser, quick="4 topics x 256 partitions, 5 s settle, 10 s measured",
                     smoke="1 topic x 8 partitions, 1 s settle, 2 s measured, lease 2 s (figures mean nothing)")
    parser.add_argument("--topics", type=int, default=25)
    parser.add_argument("--partitions", type=int, default=4096, help="partitions per topic")
    parser.add_argument("--settle-s", type=float, default=60.0,
                        help="after the claims: the start-up work of each claim (loading what is copied) ends")
    parser.add_argument("--measure-s", type=float, default=30.0)
    parser.add_argument("--mode", choices=("idle", "failover", "both"), default="both")
    parser.add_argument("--lease-ms", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=64, help="partitions of the killed broker produced to")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tree", type=Path, default=REPO,
                        help="the checkout whose brokers run (another commit's export, for a before/after)")
    args = parser.parse_args(argv)
    for name in ("topics", "partitions", "lease_ms", "sample"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    size = size_of(args)
    if size is Size.QUICK:
        args.topics, args.partitions, args.settle_s, args.measure_s = 4, 256, 5.0, 10.0
    elif size is Size.SMOKE:
        args.topics, args.partitions, args.settle_s, args.measure_s, args.lease_ms = 1, 8, 1.0, 2.0, 2_000
        args.sample = min(args.sample, 4)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
