"""Several brokers as one service (docs/cluster.md): failover time, the stall of a rolling restart, and the durable
produce throughput of one and of two brokers.

    python -m bench.bench_cluster [--quick | --smoke] [--kills N] [--lease-ms MS]

- failover: three brokers, a 6-partition durable topic, one producer task per partition through a client that
  follows redirects. `kill -9` of a broker that leads partitions; for each of its partitions, the time from the kill
  to the first acknowledged produce on it (through the redirects to its new leader). The broker is restarted and the
  leaderships rebalanced before the next kill. Goal: within the lease plus 2 s.
- rolling restart: the same producers; SIGTERM of each broker in turn, restarted once its partitions have moved.
  Per partition, the longest gap between two acknowledgements during the restart. Goal: at most 1 s.
- throughput: durable produce of the same load (8 partitions, one pipelined connection each to the partition's
  leader, window 1024 (a durable ack waits ~250 ms), 100 messages of 100 bytes per bundle) against one broker and against two (4 partitions each),
  on PostgreSQL and a local-directory store the brokers share (moto, one Python process, caps any number of brokers
  at the same rate). Goal: two brokers at least 1.7x one (two processes can use both cores). The CPU of the brokers
  and of the load generator is printed beside it: they share the 2 cores.
Real parts: PostgreSQL (a temp cluster) and moto in its own process, brokers as `tiered serve` processes.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.bench_broker import machine_busy_s
from bench.harness import BrokerProcess, MotoProcess, PgCluster, find_pg_bindir
from bench.loadgen import ProduceConn, Shape, make_bundle, open_conn, produce_frame
from bench.sizes import Size, add_size_options, cannot_run, size_of

TOPIC = "ev"
TP_PARTITIONS, TP_WINDOW, TP_MESSAGE_BYTES, TP_BUNDLE_MESSAGES = 8, 1024, 100, 100
# moto is one Python process: behind it, one broker and two reach the same ~115 MB/s (measured), so the throughput
# runs share a local-directory store instead, and the brokers' CPU is what they compare. A real S3 scales out.
TP_STORE = "file"


class Service:
    def __init__(self, root: Path, pg: PgCluster, moto: MotoProcess, lease_ms: int, store: str = "s3"):
        self.root = root
        self.catalog_url = pg.url()
        self.moto = moto
        self.lease_ms = lease_ms
        self.brokers: dict[int, BrokerProcess] = {}
        # "s3": moto's server; "file": one local directory every broker shares (an object store on this host).
        self.store_args = (("--store", f"s3://{moto.bucket}/cluster", "--s3-path-style") if store == "s3"
                           else ("--store", f"file://{root}/objects"))

    def start(self, broker_id: int) -> BrokerProcess:
        bp = BrokerProcess(self.root / f"disk{broker_id}", "--catalog", self.catalog_url, *self.store_args,
                           "--broker-id", str(broker_id), "--cluster-lease-ms", str(self.lease_ms),
                           env=self.moto.env)
        self.brokers[broker_id] = bp
        return bp.start()

    def catalog(self):
        from tiered.catalog import Catalog

        return Catalog.open(self.catalog_url)

    def leaders(self) -> dict[int, int | None]:
        from tiered.catalog import cluster

        with self.catalog() as cat:
            return {a.partition: a.leader_broker for a in cluster.assignments(cat, TOPIC) if a.leader_epoch}

    async def wait_leaders(self, among: set[int], timeout_s: float = 60.0) -> dict[int, int]:
        deadline = time.monotonic() + timeout_s
        while True:
            leaders = await asyncio.to_thread(self.leaders)
            if leaders and all(b in among for b in leaders.values()):
                return leaders
            if time.monotonic() > deadline:
                raise RuntimeError(f"leaders {leaders} not among {among}")
            await asyncio.sleep(0.1)

    async def rebalance(self) -> None:
        from tiered.catalog import cluster
        from tiered.tiering.cluster.cluster_decision import plan_rebalance

        def ask() -> int:
            with self.catalog() as cat:
                live = [m.broker_id for m in cluster.members(cat) if m.live]
                moves = plan_rebalance(cluster.assignments(cat), live)
                for (topic, partition), target in moves.items():
                    cluster.request_handover(cat, topic, partition, target)
                return len(moves)

        await asyncio.to_thread(ask)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            counts = Counter((await asyncio.to_thread(self.leaders)).values())
            if len(counts) == len(self.brokers) and max(counts.values()) - min(counts.values()) <= 1:
                return
            await asyncio.sleep(0.2)

    def stop_all(self) -> None:
        for bp in self.brokers.values():
            bp.proc.kill()
            bp.proc.wait(10)


class AckClock:
    """One producer task per partition; the time of every ack, per partition."""

    def __init__(self, client, partitions: int):
        self.client = client
        self.acks: dict[int, list[float]] = {p: [] for p in range(partitions)}
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._run(p)) for p in range(partitions)]

    async def _run(self, partition: int) -> None:
        from tiered.client import TankError

        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                await self.client.produce(TOPIC, partition, [f"p{partition}-{n}"], timeout_s=60.0)
            except (TankError, ConnectionError):
                continue
            self.acks[partition].append(time.monotonic())
            await asyncio.sleep(0.01)

    def first_ack_after(self, partition: int, moment: float) -> float | None:
        return next((t for t in self.acks[partition] if t > moment), None)

    async def wait_first_acks(self, partitions: list[int], moment: float, timeout_s: float) -> list[float | None]:
        """Each partition's first ack after `moment`, waiting until all have one or `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        while any(self.first_ack_after(p, moment) is None for p in partitions) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return [self.first_ack_after(p, moment) for p in partitions]

    async def settle(self, seconds: float) -> None:
        """Until every partition has an ack, then `seconds` more (0 at --smoke: its figures mean nothing)."""
        await self.wait_first_acks(list(self.acks), 0.0, 30)
        await asyncio.sleep(seconds)

    def longest_gap(self, partition: int, start: float, end: float) -> float:
        times = [start, *(t for t in self.acks[partition] if start < t < end), end]
        return max(b - a for a, b in zip(times, times[1:]))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def failover(service: Service, kills: int, log, pauses: float = 1.0) -> list[float]:
    from tiered.client import Client

    for broker_id in range(3):
        service.start(broker_id)
    client = await Client.connect_any([f"127.0.0.1:{bp.port}" for bp in service.brokers.values()])
    await client.create_topic(TOPIC, 6, {"produce.ack": "durable"})
    await service.wait_leaders({0, 1, 2})
    clock = AckClock(client, 6)
    samples: list[float] = []
    try:
        await clock.settle(2 * pauses)
        for i in range(kills):
            leaders = await asyncio.to_thread(service.leaders)
            victim = i % 3
            theirs = [p for p, b in leaders.items() if b == victim]
            killed_at = time.monotonic()
            service.brokers[victim].proc.kill()
            service.brokers[victim].proc.wait(10)
            await service.wait_leaders(set(service.brokers) - {victim})
            took = await clock.wait_first_acks(theirs, killed_at, service.lease_ms / 1000 + 30)
            samples += [t - killed_at for t in took if t is not None]
            log(f"kill {i + 1}/{kills}: broker {victim}, partitions {theirs}: "
                f"{', '.join(f'{t - killed_at:.2f}' if t else 'never' for t in took)} s")
            service.start(victim)
            await service.rebalance()
            await asyncio.sleep(pauses)
    finally:
        await clock.stop()
        await client.close()
    return samples


async def rolling_restart(service: Service, log, restarts: int | None = None, pauses: float = 1.0) -> list[float]:
    """SIGTERM of each broker in turn (of the first `restarts` of them, when given). `pauses` scales the settling
    sleeps (0 at --smoke)."""
    from tiered.client import Client

    client = await Client.connect_any([f"127.0.0.1:{bp.port}" for bp in service.brokers.values()])
    clock = AckClock(client, 6)
    gaps: list[float] = []
    try:
        await clock.settle(2 * pauses)
        for broker_id in sorted(service.brokers)[:restarts]:
            leaders = await asyncio.to_thread(service.leaders)
            theirs = [p for p, b in leaders.items() if b == broker_id]
            started = time.monotonic()
            await asyncio.to_thread(service.brokers[broker_id].stop)
            # The stall ends at each partition's first ack after the broker is gone (bounded by 30 s).
            stopped = time.monotonic()
            firsts = await clock.wait_first_acks(theirs, stopped, 30)
            ended = max([time.monotonic(), *(t or 0 for t in firsts)])
            gaps += [clock.longest_gap(p, started, ended) for p in theirs]
            log(f"SIGTERM broker {broker_id}: partitions {theirs}, longest gaps "
                f"{', '.join(f'{g:.2f}' for g in gaps[-len(theirs):])} s")
            service.start(broker_id)
            await service.rebalance()
            await asyncio.sleep(pauses)
    finally:
        await clock.stop()
        await client.close()
    return gaps


async def throughput(root: Path, pg: PgCluster, moto: MotoProcess, brokers: int, seconds: float, log) -> dict:
    from tiered.catalog.migrate import upgrade
    from tiered.client import Client

    dbname = f"tp{brokers}"
    pg_url = pg.url()
    import sqlalchemy

    engine = sqlalchemy.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {dbname}"))
    engine.dispose()
    url = pg.url(dbname)
    await asyncio.to_thread(upgrade, url)
    service = Service(root / f"tp{brokers}", pg, moto, 10_000, store=TP_STORE)
    service.catalog_url = url
    try:
        for broker_id in range(brokers):
            service.start(broker_id)
        async with await Client.connect_any([f"127.0.0.1:{bp.port}" for bp in service.brokers.values()]) as c:
            await c.create_topic(TOPIC, TP_PARTITIONS, {"produce.ack": "durable"})
        leaders = await service.wait_leaders(set(range(brokers)))
        shape = Shape(TP_MESSAGE_BYTES, TP_BUNDLE_MESSAGES)
        bundle = make_bundle(shape)
        conns = [await open_conn(lambda p=p: ProduceConn(produce_frame(TOPIC, p, bundle), TP_BUNDLE_MESSAGES,
                                                         window=TP_WINDOW),
                                 service.brokers[leaders[p]].port) for p in range(TP_PARTITIONS)]
        cpu_before = {b: bp.cpu_s() for b, bp in service.brokers.items()}
        moto_before, own_before, busy_before = moto.cpu_s(), time.process_time(), machine_busy_s()
        started = time.monotonic()
        await asyncio.gather(*(c.run(started + seconds) for c in conns))
        elapsed = time.monotonic() - started
        messages = sum(c.stats.messages for c in conns)
        errors = sum(c.stats.errors for c in conns)
        cpu = sum(bp.cpu_s() - cpu_before[b] for b, bp in service.brokers.items())
        own = time.process_time() - own_before
        others = max(0.0, machine_busy_s() - busy_before - cpu - own)
        for c in conns:
            c.transport.close()
        result = {"brokers": brokers, "msgs_per_s": messages / elapsed,
                  "mb_per_s": messages * TP_MESSAGE_BYTES / elapsed / 1e6, "errors": errors,
                  "broker_cpu": cpu / elapsed, "moto_cpu": (moto.cpu_s() - moto_before) / elapsed,
                  "loadgen_cpu": own / elapsed, "other_cpu": others / elapsed}
        log(f"{brokers} broker(s): {result['msgs_per_s']:.0f} msg/s, broker CPU {result['broker_cpu']:.2f} cores")
        return result
    finally:
        service.stop_all()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cluster", description=__doc__.split("\n\n")[0])
    add_size_options(parser, quick="3 kills, 3 s lease, 5 s throughput runs",
                     smoke="1 kill, 2 s lease, 1 broker restarted, 1 s throughput runs")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--lease-ms", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=15.0, help="each throughput run")
    parser.add_argument("--only", choices=["moves", "throughput"],
                        help="only the failover and rolling restart, or only the throughput runs")
    args = parser.parse_args(argv)
    size = size_of(args)
    kills, lease_ms, seconds = size.pick((args.kills, args.lease_ms, args.seconds), (3, 3000, 5.0), (1, 2000, 1.0))
    bindir = find_pg_bindir()
    if bindir is None:
        cannot_run("PostgreSQL server binaries are missing (Debian package postgresql; make system-deps)")

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    root = Path(tempfile.mkdtemp(prefix="tiered-cluster-bench-"))
    pg = PgCluster(bindir).start()
    moto = MotoProcess(root).start()
    try:
        from tiered.catalog.migrate import upgrade

        upgrade(pg.url())
        service = Service(root, pg, moto, lease_ms)

        async def everything():
            takeovers: list[float] = []
            gaps: list[float] = []
            one = two = None
            if args.only != "throughput":
                try:
                    pauses = size.pick(1.0, 1.0, 0.0)
                    takeovers = await failover(service, kills, log, pauses)
                    gaps = await rolling_restart(service, log, 1 if size is Size.SMOKE else None, pauses)
                finally:
                    service.stop_all()
            if args.only != "moves":
                one = await throughput(root, pg, moto, 1, seconds, log)
                two = await throughput(root, pg, moto, 2, seconds, log)
            return takeovers, gaps, one, two

        takeovers, gaps, one, two = asyncio.run(everything())
    finally:
        moto.stop()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    if args.only != "throughput":
        print_moves(takeovers, gaps, kills, lease_ms)
    if one is not None and two is not None:
        print_throughput(one, two)
    return 0


def print_moves(takeovers: list[float], gaps: list[float], kills: int, lease_ms: int) -> None:
    lease_s = lease_ms / 1000
    print(f"cluster: lease {lease_s:g} s, {kills} kills, {len(takeovers)} partitions taken over")
    print("| measure | p50 | p99 | max | goal |")
    print("|---|---:|---:|---:|---|")
    print(f"| kill -9 to first ack on a taken-over partition (s) | {pct(takeovers, .5):.2f} | {pct(takeovers, .99):.2f} "
          f"| {max(takeovers, default=float('nan')):.2f} | ≤ {lease_s + 2:g} (lease + 2 s) |")
    print(f"| rolling restart: longest gap between acks per partition (s) | {pct(gaps, .5):.2f} | {pct(gaps, .99):.2f} "
          f"| {max(gaps, default=float('nan')):.2f} | ≤ 1 |")
    print()


def print_throughput(one: dict, two: dict) -> None:
    print("| brokers | durable msg/s | MB/s | errors | brokers' CPU | load generator's CPU | everything else "
          "(PostgreSQL, other processes) (cores) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in (one, two):
        print(f"| {r['brokers']} | {r['msgs_per_s']:.0f} | {r['mb_per_s']:.1f} | {r['errors']} | {r['broker_cpu']:.2f} "
              f"| {r['loadgen_cpu']:.2f} | {r['other_cpu']:.2f} |")
    print(f"two / one: {two['msgs_per_s'] / one['msgs_per_s']:.2f}x (goal ≥ 1.7x)")


if __name__ == "__main__":
    sys.exit(main())
