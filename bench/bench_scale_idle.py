"""An idle cluster at scale, and a failover at that size (issue 28 goals 1 and 2; docs/scale.md "Idle cost").

    python -m bench.bench_scale_idle [--quick|--smoke] [--topics 25] [--partitions 4096] [--measure-s 30]
                                     [--settle-s 300] [--flat-s 20] [--flat-cores 0.01] [--window-s 5]
                                     [--mode create|idle|failover|handover|both] [--lease-ms 10000] [--sample 64]

- creation (always): the time of each CreateTopic and until every partition is claimed.
- idle: three `tiered serve` processes on one real PostgreSQL (a temp cluster) and a local-directory store they
  share, `--topics` durable topics of `--partitions` partitions each (default 25 x 4,096 = 102,400), no traffic.
  Once settled (each broker's and PostgreSQL's CPU sampled every `--window-s`, until every one has stayed within
  `--flat-cores` over `--flat-s`; at most `--settle-s`, then measured anyway and the table says so), each broker's
  CPU and PostgreSQL's (the postmaster and every backend, /proc/<pid>/stat) over `--measure-s`, in cores. Goals: each
  broker <= 0.02 cores, PostgreSQL <= 0.05 cores.
- failover: then `kill -9` of the broker leading the most partitions. From the kill: when its lease expired, when
  the live brokers claimed the first, half and last of its partitions (the claims' own rows, partition_epochs), and
  for `--sample` of its partitions (spread over every topic), when a durable produce through a client that follows
  redirects was acknowledged again. Goal: every partition within lease + 2 s.
- handover: instead, SIGTERM of the broker leading the most (one step of a rolling restart: it hands every partition
  over before it exits); per sampled partition, produced to continuously, the longest gap between two durable acks
  from the SIGTERM until it is acknowledged again after the exit. Goal: at most 1 s.
After a failover or a handover, `tiered catalog check`'s check of every partition (every seq from the first available
to the high-water mark has exactly one location): its problems are printed and fail the run.
`--profile DIR` profiles broker 0 over the idle window (bench/profiled_serve.py: per thread, per function).
`--tree DIR` runs the brokers from another checkout (e.g. `git archive main | tar -x -C DIR`) for a before/after.
Real parts throughout; the store is a local directory so that the catalog and the brokers are what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench import format_table
from bench.harness import REPO, BrokerProcess, PgCluster, find_pg_bindir, process_cpu_s
from bench.sizes import Size, add_size_options, cannot_run, size_of

BROKERS = 3
PG = "PostgreSQL (all processes)"
GOAL_BROKER_CORES = 0.02
GOAL_PG_CORES = 0.05
DURABLE = {"produce.ack": "durable"}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Service:
    def __init__(self, root: Path, pg: PgCluster, lease_ms: int, tree: Path, log_level: str = "warning",
                 profile: Path | None = None):
        self.root = root
        self.profile = profile
        self.log_level = log_level
        self.tree = tree
        self.pg = pg
        self.lease_ms = lease_ms
        self.brokers: dict[int, BrokerProcess] = {}

    def start(self, broker_id: int) -> BrokerProcess:
        bp = BrokerProcess(self.root / f"disk{broker_id}", "--catalog", self.pg.url(), "--store",
                           f"file://{self.root}/objects", "--broker-id", str(broker_id), "--cluster-lease-ms",
                           str(self.lease_ms), "--log-level", self.log_level, tree=self.tree,
                           env={"TIERED_PROFILE_DIR": str(self.profile)} if self.profile and broker_id == 0 else None)
        if self.profile is not None and broker_id == 0:
            bp.program = ["bench.profiled_serve"]  # broker 0's CPU over the measured window, by function
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


async def create_topics(service: Service, topics: int, partitions: int) -> dict[str, float]:
    """Creates the topics one after the other; returns the figures of the creation: each CreateTopic until its
    answer (the creating broker answers once the topic is in the catalog, on its disk and claimed, and the others'
    claims landed or 5 s passed), and until every partition of every topic is claimed."""
    from tiered.client import Client

    names = [f"idle{i:02d}" for i in range(topics)]
    answered: list[float] = []
    begun = time.monotonic()
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
        answered.append(time.monotonic() - started)
        log(f"topic {i + 1}/{topics}: {name}, {partitions} partitions in {answered[-1]:.1f} s")
    deadline = time.monotonic() + 600
    while True:
        unclaimed = [k for k, (_, epoch) in (await asyncio.to_thread(service.claimed)).items() if not epoch]
        if not unclaimed:
            took = time.monotonic() - begun
            return {"topics x partitions": f"{topics} x {partitions}", "first topic answered (s)": answered[0],
                    "median topic answered (s)": sorted(answered)[len(answered) // 2],
                    "last topic answered (s)": answered[-1], "all created and claimed (s)": took,
                    "partitions per second": topics * partitions / took}
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(unclaimed)} partitions never claimed, e.g. {unclaimed[:3]}")
        await asyncio.sleep(1)


@dataclass(frozen=True)
class SettleRule:
    """When an idle cluster has settled: every process's CPU, sampled in windows of `window_s`, has stayed within
    `tolerance_cores` (highest window less lowest) over the last `flat_s`; given up after `max_s`."""

    window_s: float = 5.0
    flat_s: float = 20.0
    tolerance_cores: float = 0.01
    max_s: float = 300.0

    @property
    def windows(self) -> int:
        return max(1, round(self.flat_s / self.window_s))


def flat(history: Mapping[str, Sequence[float]], windows: int, tolerance_cores: float) -> bool:
    """Whether every process's last `windows` samples (cores over each window) are within `tolerance_cores` of each
    other: its start-up work (each claim loading what is copied) is over, whatever its steady cost is."""
    return all(len(samples) >= windows and max(samples[-windows:]) - min(samples[-windows:]) <= tolerance_cores
               for samples in history.values())


def cpu_now(service: Service) -> dict[str, float]:
    """CPU seconds so far of each broker and of PostgreSQL (every process)."""
    now = {f"broker {b}": process_cpu_s(bp.pid) for b, bp in service.brokers.items()}
    now[PG] = service.pg.cpu_s()
    return now


def settle(service: Service, rule: SettleRule) -> tuple[bool, float]:
    """Samples every process's CPU each window until `flat` (True) or `rule.max_s` passed (False); returns that and
    the seconds it took."""
    started = time.monotonic()
    history: dict[str, list[float]] = {}
    last, last_at = cpu_now(service), started
    while True:
        time.sleep(rule.window_s)
        now, at = cpu_now(service), time.monotonic()
        for name, seconds in now.items():
            history.setdefault(name, []).append((seconds - last[name]) / (at - last_at))
        last, last_at = now, at
        if flat(history, rule.windows, rule.tolerance_cores):
            return True, at - started
        if at - started >= rule.max_s:
            return False, at - started


def measure_idle(service: Service, rule: SettleRule, measure_s: float) -> tuple[dict[str, float], str]:
    """Each process's cores over `measure_s`, once settled (or given up on), and how the settle ended, in words."""
    log(f"settling (every process within {rule.tolerance_cores} cores over {rule.flat_s:g} s, at most "
        f"{rule.max_s:.0f} s), then measuring {measure_s:.0f} s with no traffic")
    settled, took = settle(service, rule)
    settled_text = (f"after {took:.0f} s (every process within {rule.tolerance_cores} cores over {rule.flat_s:g} s)"
                    if settled else f"NOT within {rule.tolerance_cores} cores over {rule.flat_s:g} s after "
                                    f"{took:.0f} s: measured anyway")
    log(f"settled: {settled_text}")
    before = cpu_now(service)
    started = time.monotonic()
    if service.profile is not None:
        service.brokers[0].proc.send_signal(signal.SIGUSR1)  # opens broker 0's profile window (bench.profiled_serve)
    time.sleep(measure_s)
    elapsed = time.monotonic() - started
    if service.profile is not None:
        service.brokers[0].proc.send_signal(signal.SIGUSR1)
    cores = {name: (seconds - before[name]) / elapsed for name, seconds in cpu_now(service).items()}
    if service.profile is not None:
        report = service.profile / "window.txt"
        deadline = time.monotonic() + 60
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        log(f"broker 0's profile of the window: {report} (and window.prof for `python -m pstats`)")
    return cores, settled_text


class Samples:
    """A producer per sampled partition, through a client that follows redirects: the time of every durable ack."""

    def __init__(self, client, keys: list[tuple[str, int]], pause_s: float):
        self.client = client
        self.pause_s = pause_s
        self.acks: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._run(key)) for key in keys]

    async def _run(self, key: tuple[str, int]) -> None:
        from tiered.client import TankError

        while not self._stop.is_set():
            try:
                await self.client.produce(key[0], key[1], [b"sampled"], timeout_s=60.0)
            except (TankError, ConnectionError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.05)
                continue
            self.acks[key].append(time.monotonic())
            await asyncio.sleep(self.pause_s)

    def first_after(self, key: tuple[str, int], moment: float) -> float | None:
        return next((t for t in self.acks[key] if t > moment), None)

    async def wait_first_after(self, moment: float, deadline: float) -> None:
        while time.monotonic() < deadline and any(self.first_after(k, moment) is None for k in self.acks):
            await asyncio.sleep(0.05)

    def longest_gap(self, key: tuple[str, int], start: float, end: float) -> float:
        times = [start, *(t for t in self.acks[key] if start < t < end), end]
        return max(b - a for a, b in zip(times, times[1:]))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


def busiest(service: Service) -> tuple[int, dict[tuple[str, int], tuple[int | None, int]], list[tuple[str, int]]]:
    """The broker leading the most (under load a broker may have lost its partitions to takeovers while the topics
    were created, and a broker that comes back takes none back), every partition's (leader, epoch), and its
    partitions."""
    before = service.claimed()
    led = Counter(leader for leader, _ in before.values() if leader is not None)
    victim = max(service.brokers, key=lambda b: (led[b], -b))
    return victim, before, sorted(k for k, (leader, _) in before.items() if leader == victim)


def claims_after(service: Service, theirs: list[tuple[str, int]],
                 before: dict[tuple[str, int], tuple[int | None, int]], since: float) -> tuple[list[float], int]:
    """When each of `theirs` was claimed again (s after `since`, a time.time()), from the claims' own rows
    (partition_epochs.claimed_at), and how many were not."""
    from sqlalchemy import select

    from tiered.catalog import Catalog
    from tiered.catalog.models import PartitionEpochModel as E

    wanted = set(theirs)
    first: dict[tuple[str, int], float] = {}
    with Catalog.open(service.pg.url()) as cat, cat.read() as conn:
        for topic, partition, epoch, at in conn.execute(select(E.topic, E.partition, E.leader_epoch, E.claimed_at)):
            key = (topic, partition)
            if key in wanted and epoch > before[key][1]:
                first[key] = min(first.get(key, float("inf")), at.timestamp() - since)
    return sorted(first.values()), len(wanted) - len(first)


def lease_expiry(service: Service, broker_id: int) -> float:
    """The broker's lease expiry, as a time.time()."""
    from tiered.catalog import Catalog
    from tiered.catalog import cluster

    with Catalog.open(service.pg.url()) as cat:
        member = next(mb for mb in cluster.members(cat) if mb.broker_id == broker_id)
    return member.lease_expires_at.timestamp()


def unclaimed(service: Service, broker_id: int) -> int:
    """Partitions still assigned to `broker_id` (a live broker's claim reassigns them): one count, not every row."""
    from sqlalchemy import func, select

    from tiered.catalog import Catalog
    from tiered.catalog.models import PartitionModel as P

    with Catalog.open(service.pg.url()) as cat, cat.read() as conn:
        return conn.execute(select(func.count()).where(P.leader_broker == broker_id)).scalar()


async def sampled_client(service: Service, victim: int, theirs: list[tuple[str, int]], sample: int, seed: int):
    from tiered.client import Client

    sampled = sorted(random.Random(seed).sample(theirs, min(sample, len(theirs))))
    others = [bp for b, bp in service.brokers.items() if b != victim]
    return await Client.connect_any([f"127.0.0.1:{bp.port}" for bp in others]), sampled


async def failover(service: Service, sample: int, seed: int) -> dict[str, float]:
    victim, before, theirs = await asyncio.to_thread(busiest, service)
    client, sampled = await sampled_client(service, victim, theirs, sample, seed)
    samples = Samples(client, sampled, 0.2)
    await asyncio.sleep(2)  # every sampled partition acknowledged before the kill
    expires = await asyncio.to_thread(lease_expiry, service, victim)
    log(f"kill -9 of broker {victim}, which leads {len(theirs)} partitions; producing to {len(sampled)} of them")
    killed_wall, killed_at = time.time(), time.monotonic()
    service.brokers[victim].proc.kill()
    service.brokers[victim].proc.wait(10)
    deadline = killed_at + service.lease_ms / 1000.0 + 120
    while time.monotonic() < deadline and await asyncio.to_thread(unclaimed, service, victim):
        await asyncio.sleep(0.25)
    await samples.wait_first_after(killed_at, deadline)
    await samples.stop()
    await client.close()
    claimed, never = await asyncio.to_thread(claims_after, service, theirs, before, killed_wall)
    took = sorted(t - killed_at for t in (samples.first_after(k, killed_at) for k in sampled) if t is not None)
    nan = float("nan")
    return {"killed broker": victim, "partitions of the killed broker": len(theirs), "not claimed": never,
            "its lease expired (s after the kill)": expires - killed_wall,
            "first claim (s after the kill)": claimed[0] if claimed else nan,
            "half claimed (s after the kill)": claimed[len(claimed) // 2] if claimed else nan,
            "last claim (s after the kill)": claimed[-1] if claimed else nan,
            "sampled": len(sampled), "sampled never acked": len(sampled) - len(took),
            "durable ack again, median (s)": took[len(took) // 2] if took else nan,
            "durable ack again, max (s)": took[-1] if took else nan,
            "goal (lease + 2 s)": service.lease_ms / 1000.0 + 2}


async def handover(service: Service, sample: int, seed: int) -> dict[str, float]:
    """One step of a rolling restart: SIGTERM of the broker leading the most, which hands every partition it leads
    to the others before it exits; per sampled partition, the longest gap between two durable acks from the SIGTERM
    until it was acknowledged again after the broker exited."""
    victim, before, theirs = await asyncio.to_thread(busiest, service)
    client, sampled = await sampled_client(service, victim, theirs, sample, seed)
    samples = Samples(client, sampled, 0.01)
    await asyncio.sleep(2)
    log(f"SIGTERM of broker {victim}, which leads {len(theirs)} partitions; producing to {len(sampled)} of them")
    started_wall, started = time.time(), time.monotonic()
    await asyncio.to_thread(service.brokers[victim].stop)
    stopped = time.monotonic()
    await samples.wait_first_after(stopped, stopped + 60)
    ended = max([time.monotonic(), *(samples.first_after(k, stopped) or 0 for k in sampled)])
    await samples.stop()
    await client.close()
    gaps = sorted(samples.longest_gap(k, started, ended) for k in sampled)
    claimed, never = await asyncio.to_thread(claims_after, service, theirs, before, started_wall)
    nan = float("nan")
    return {"stopped broker": victim, "partitions it led": len(theirs), "not claimed": never,
            "its exit (s after SIGTERM)": stopped - started,
            "first claim (s after SIGTERM)": claimed[0] if claimed else nan,
            "half claimed (s after SIGTERM)": claimed[len(claimed) // 2] if claimed else nan,
            "last claim (s after SIGTERM)": claimed[-1] if claimed else nan,
            "sampled": len(sampled),
            "longest gap per partition, median (s)": gaps[len(gaps) // 2] if gaps else nan,
            "longest gap per partition, max (s)": gaps[-1] if gaps else nan,
            "goal (longest gap)": 1.0}


def catalog_problems(service: Service) -> tuple[int, list[str]]:
    """`tiered catalog check` over every topic: the partitions checked and the problems found."""
    from tiered.catalog import Catalog
    from tiered.catalog.check import check_catalog

    with Catalog.open(service.pg.url()) as cat:
        report = check_catalog(cat)
    return len(report.partitions), list(report.problems)


def print_idle(cores: dict[str, float], settled: str, topics: int, partitions: int) -> None:
    print(f"\nidle cluster: {BROKERS} brokers, {topics} topics x {partitions} partitions = {topics * partitions} "
          f"partitions, no traffic; settled {settled}")
    print(format_table(("process", "cores", "goal"), [
        (name, f"{value:.4f}", GOAL_PG_CORES if name == PG else GOAL_BROKER_CORES) for name, value in cores.items()]))


def print_figures(title: str, figures: dict[str, float]) -> None:
    print()
    print(format_table((title, "value"), list(figures.items())))


async def run(args: argparse.Namespace) -> int:
    bindir = find_pg_bindir()
    if bindir is None:
        cannot_run("bench_scale_idle: PostgreSQL binaries not found (run `sh .ci/system-deps`)")
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-scale-"))
    pg = PgCluster(bindir).start()
    if args.profile is not None:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    service = Service(root, pg, args.lease_ms, args.tree.resolve(), "info" if args.keep_logs else "warning",
                      args.profile)
    try:
        for broker_id in range(BROKERS):
            service.start(broker_id)
        started = time.monotonic()
        created = await create_topics(service, args.topics, args.partitions)
        log(f"{args.topics * args.partitions} partitions created and claimed in {time.monotonic() - started:.0f} s")
        print_figures(f"creating {args.topics * args.partitions} partitions on {BROKERS} brokers", created)
        if args.mode in ("idle", "both"):
            rule = SettleRule(args.window_s, args.flat_s, args.flat_cores, args.settle_s)
            cores, settled = measure_idle(service, rule, args.measure_s)
            print_idle(cores, settled, args.topics, args.partitions)
        if args.mode in ("failover", "both"):
            figures = await failover(service, args.sample, args.seed)
            print_figures(f"failover: kill -9 of broker {figures['killed broker']}", figures)
        if args.mode == "handover":
            figures = await handover(service, args.sample, args.seed)
            print_figures(f"handover: SIGTERM of broker {figures['stopped broker']}", figures)
        if args.mode in ("failover", "handover", "both"):
            checked, problems = await asyncio.to_thread(catalog_problems, service)
            print(f"\ncatalog check: {checked} partitions, {len(problems)} problems")
            for problem in problems[:20]:
                print(f"  {problem}")
            if problems:
                return 1
    finally:
        service.stop_all()
        pg.stop()
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for b, bp in service.brokers.items():
                shutil.copy(bp.log_path, args.keep_logs / f"broker{b}.log")
            log(f"the brokers' logs (level info) are in {args.keep_logs}")
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scale_idle", description=__doc__.split("\n")[0])
    add_size_options(parser, quick="4 topics x 256 partitions, 5 s settle, 10 s measured",
                     smoke="1 topic x 8 partitions, 1 s settle, 2 s measured, lease 2 s (figures mean nothing)")
    parser.add_argument("--topics", type=int, default=25)
    parser.add_argument("--partitions", type=int, default=4096, help="partitions per topic")
    parser.add_argument("--settle-s", type=float, default=300.0,
                        help="after the claims, the longest wait for the cluster to settle (the start-up work of each "
                             "claim, loading what is copied, ends): then measured anyway, and the table says so")
    parser.add_argument("--flat-s", type=float, default=20.0,
                        help="settled: every process's CPU flat over this long ...")
    parser.add_argument("--flat-cores", type=float, default=0.01, help="... within this many cores")
    parser.add_argument("--window-s", type=float, default=5.0, help="the CPU sampling window while settling")
    parser.add_argument("--measure-s", type=float, default=30.0)
    parser.add_argument("--mode", choices=("create", "idle", "failover", "handover", "both"), default="both",
                        help="both: idle, then failover; create: only the creation")
    parser.add_argument("--lease-ms", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=64, help="partitions of the killed broker produced to")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tree", type=Path, default=REPO,
                        help="the checkout whose brokers run (another commit's export, for a before/after)")
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="DIR",
                        help="the brokers log at level info, and their logs are copied into DIR at the end")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="broker 0 runs under bench.profiled_serve: its CPU over the measured window, per thread "
                             "and per function, into DIR (window.txt, window.prof); the profiler slows it")
    args = parser.parse_args(argv)
    for name in ("topics", "partitions", "lease_ms", "sample"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    size = size_of(args)
    if size is Size.QUICK:
        args.topics, args.partitions, args.settle_s, args.measure_s, args.flat_s = 4, 256, 60.0, 10.0, 10.0
    elif size is Size.SMOKE:
        args.topics, args.partitions, args.settle_s, args.measure_s, args.lease_ms = 1, 8, 1.0, 2.0, 2_000
        args.window_s, args.flat_s = 0.5, 0.5
        args.sample = min(args.sample, 4)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
