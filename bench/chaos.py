"""The durability promise under attack: a seeded, bounded loop of kill -9, disk wipes and takeovers by another volume,
with every acknowledged message read back byte for byte after each round.

One broker process at a time (broker id 0) serves a durable topic, on PostgreSQL and moto's S3. Each round, producers
(two per partition, each sending numbered values in order and remembering what was acknowledged) run while the
round's action hits the broker:
    kill      kill -9, restart on the same disk
    wipe      kill -9, the disk is lost: restart on an empty data directory
    takeover  kill -9, another volume (a new one, or one that served before: a fail-back) takes the partitions over
    stop      SIGTERM: a graceful stop, restart on the same disk
    damage    kill -9, then one partition directory (the seed picks which) is damaged in a way recovery cannot
              repair, restart on the same disk: garbage over the head of a sealed segment (and of its index, or
              not), which recovery refuses (when no partition has a sealed segment, one gets instead a copy of its
              active segment under a name whose seqs overlap it, refused too), a file where the directory should
              be, or the directory removed. The partition is moved aside and opened again empty, its history served from the bucket
              after its claim (tiered.server.registry); /readyz must name it, and it is read back as any other. A
              removed directory is named only when it is the topic's last partition's: the others' directories are
              made at their first write, so a disk without one reads as never written there (opened empty, served
              from the bucket, read back as any other), which is what a removed one then is.
Then every partition is read from its first seq to its end and checked:
    - every acknowledged value is there exactly once;
    - a value's seq never changes once read (nothing is overwritten or moved);
    - each producer's acknowledged values appear in the order it sent them;
    - the catalog's consistency check passes (every seq has exactly one location).
Values the broker answered with an error may or may not be there (the outcome of such a produce is unknown); none
may be there twice.

With `--remote-retention-secs N` the topics are created with remote copy on, 2 KiB segments, 8 of them kept on the
local disk and `remote.retention.secs=N`, and the broker runs remote retention every second
(`--remote-retention-interval-ms 1000`), so segments expire in the bucket while the rounds attack the broker, and the
disk still holds some of what expired. Each partition is then read from its first available seq as the broker reports
it (DiscoverPartitions; a boundary answer met while reading moves it on), and:
    - the first available seq only moves forward, round after round, and is never below the catalog's (read just
      before the broker is asked);
    - every acknowledged value at or above it is there, as above;
    - an acknowledged value missing is expired when it is shown to be below it: it was read before at a seq
      below it, or a value its producer sent after it was (seqs grow in a producer's order);
    - one that expired before any read saw it (its seq is not known: a produce's answer carries none) is counted
      apart, as expired unread, only when none its producer sent before it is there at or above the first
      available seq and the seqs read at or above it run without a gap to the end (so no seq there could have held
      it); else it is lost;
    - no seq is ever answered with other bytes than those read at it before (below the first available seq too: the
      seq just below it is asked for, and must be refused or answered with the same bytes);
    - an expired value never comes back.
The table counts the acknowledged values that expired.

The brokers run with `--block-expand-in-commit-runs 0` (the chaos flag `--expand-in-commit-runs N` changes it): every
block's commit writes its runs packed in the block's row, and they reach `block_runs` only by the expansion after the
acks, or by the sweep of the next broker when a kill -9 fell between the two. A broker's default (64) would expand
nearly every block of these rounds inside its commit, the path the catalog has always had, and leave the unexpanded
state, its readers and its sweep unattacked. An expansion takes a few milliseconds, so a kill would seldom fall in
that window by chance: for the last EXPANSION_HOLD_S before each action the loop holds the expansions back, as a
slow catalog would. Every HOLD_REPEAT_S it takes a FOR KEY SHARE lock on every block row not yet committed or not yet
expanded, in one transaction: a commit's mark (a FOR NO KEY UPDATE of its block row) goes on, acks are answered,
readers read, prunes and copies proceed, but an expansion's claim (FOR UPDATE of the block row) waits, so that the
blocks committed meanwhile are unexpanded when the broker is killed. (A SHARE lock on block_runs would do it too, but
it also stops the copies' and prunes' deletes, whose transactions then hold partition rows that the commits wait
for: with remote retention no block would be committed during the hold.) A SIGTERM's locks are let go at once, so
that the graceful stop may finish the expansions. After each action, before the restart, the blocks the broker
left unexpanded are counted; after each round's checks the loop waits for the new broker's sweep to expand them (a
catalog problem if it has not within SWEEP_WAIT_S), then checks the catalog again. The table shows the blocks
committed and those left to the sweep.

`python -m bench.chaos [--rounds N | --quick | --smoke] [--seed S] [--local-store] [--topics T --partitions P]
[--remote-retention-secs N] [--expand-in-commit-runs N]` prints
the table; tests/durability/test_chaos.py runs a few rounds. `--local-store` puts the objects in a local directory
beside the volumes instead of moto's S3 (the same filesystem: sealed segments are stored as hard links to the volume's
files, blocks written with O_DIRECT).

At scale (`--topics T --partitions P`, T x P partitions; the default is one topic of 3): past SPREAD_ABOVE partitions
there is one producer per partition instead of two, and `--writers` connections (16) each send multi-partition
produces (up to 64 of its partitions at a time, 1-2 values each, every partition's outcome its own), so that produce
is spread over every partition without a connection per producer; every partition is read back the same way and the
catalog checked for every topic after each round. The seed decides the rounds (actions, durations, which disk takes
over, which partition is damaged and how); the values produced do not draw from it, so a seed's rounds are the same
run after run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench import format_table
from bench.harness import BrokerProcess, MotoProcess, PgCluster, find_pg_bindir
from bench.sizes import add_size_options, cannot_run, size_of

TOPIC = "chaos"
PARTITIONS = 3
PRODUCERS_PER_PARTITION = 2
SPREAD_ABOVE = 64  # more partitions than this: one producer per partition, on `writers` multi-partition connections
WRITERS = 16
PARTITIONS_PER_PRODUCE = 64
READERS = 32  # partitions read back at once
TOPIC_CONFIG = {"log.segment.bytes": "16k", "log.index.interval.bytes": "512", "retention.segments.count": "2",
                "produce.ack": "durable"}
ACTIONS = ("kill", "wipe", "takeover", "stop", "damage")
DAMAGES = ("garbage", "file", "removed")  # the damage action's kinds (module docstring)
RETENTION_INTERVAL_MS = 1000  # the broker's remote retention pass, with --remote-retention-secs
RETENTION_SEGMENT_BYTES = "2k"  # with --remote-retention-secs: many segments, so that some expire in a short run
# ... and kept on the local disk for longer than in the bucket: the disk holds seqs remote retention expired, which
# must never be served again (after a restart either) nor lower the first available seq a broker reports.
RETENTION_LOCAL_SEGMENTS = "8"
# The brokers' block_expand_in_commit_runs (module docstring): every block left to the expansion after its acks.
EXPAND_IN_COMMIT_RUNS = 0
# How long after a round's checks the blocks a kill left unexpanded may take to be expanded by the new broker's sweep
# (it runs every 2 s over blocks committed more than 5 s before: tiered.tiering.blocks.block_pipeline).
SWEEP_WAIT_S = 60.0
# How long before each action the expansions are held back (module docstring): well below the catalog's lock timeout
# (10 s), so that the expansions waiting wait, they do not fail.
EXPANSION_HOLD_S = 0.4
HOLD_REPEAT_S = 0.01  # well below a PUT's time: a block's intent row is locked before its commit
_HOLD = ("SELECT block_id FROM blocks WHERE committed_at IS NULL OR runs_pending IS NOT NULL "
         "ORDER BY block_id FOR KEY SHARE")


@dataclass
class ChaosReport:
    rounds: int = 0
    acks: int = 0
    unconfirmed: int = 0  # produces answered with an error or cut off: their outcome is unknown
    losses: list[str] = field(default_factory=list)  # acknowledged values missing, moved, doubled or out of order
    catalog_problems: list[str] = field(default_factory=list)
    start_faults: list[str] = field(default_factory=list)  # a first available seq moved back or below the catalog's
    damaged: Counter = field(default_factory=Counter)  # the damage action's kinds, as done
    damage_faults: list[str] = field(default_factory=list)  # a damaged partition /readyz did not name as reopened
    partitions_checked: int = 0  # by the catalog check, summed over the rounds
    retention: bool = False  # --remote-retention-secs: the rows below are shown
    expired: int = 0  # acknowledged values shown below their partition's first available seq
    expired_unread: int = 0  # acknowledged values that expired before a read saw them (see the module docstring)
    first_available: int = 0  # the first available seqs at the end, summed over the partitions
    expand_in_commit_runs: int = EXPAND_IN_COMMIT_RUNS  # the brokers' setting
    blocks_committed: int = 0  # committed blocks met in the catalog after the rounds
    left_unexpanded: int = 0  # blocks a broker left unexpanded when it was killed (or stopped), summed over the rounds
    actions: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.losses and not self.catalog_problems and not self.start_faults and not self.damage_faults

    def table(self) -> str:
        actions = ", ".join(f"{a} {n}" for a, n in sorted(self.actions.items()))
        rows = [("rounds", str(self.rounds)), ("actions", actions), ("acknowledged messages", str(self.acks)),
                ("unconfirmed produces", str(self.unconfirmed)), ("acknowledged messages lost", str(len(self.losses))),
                ("catalog problems", str(len(self.catalog_problems))),
                ("partitions damaged (garbage over a sealed segment's head / overlapping segment / file for "
                 "directory / removed)", " / ".join(str(self.damaged[k]) for k in (*DAMAGES[:1], "overlap",
                                                                                    *DAMAGES[1:]))),
                ("  of which /readyz did not name as opened again from the bucket", str(len(self.damage_faults))),
                ("blocks committed" + (" (all packed, expanded after their acks)" if self.expand_in_commit_runs == 0
                                       else f" (up to {self.expand_in_commit_runs} runs expanded in the commit)"),
                 str(self.blocks_committed)),
                ("  of which left unexpanded by a kill or stop, expanded by the sweep", str(self.left_unexpanded)),
                ("partitions checked (all rounds)", str(self.partitions_checked)), ("seconds", f"{self.seconds:.0f}")]
        if self.retention:
            rows[3:3] = [("acknowledged messages expired by remote retention", str(self.expired)),
                         ("  of which expired before a read saw them", str(self.expired_unread)),
                         ("first available seqs at the end (sum)", str(self.first_available)),
                         ("first available seqs moved back or below the catalog's", str(len(self.start_faults)))]
        lines = [format_table(("figure", "value"), rows)]
        lines += [f"  lost: {loss}" for loss in self.losses[:20]]
        lines += [f"  catalog: {problem}" for problem in self.catalog_problems[:20]]
        lines += [f"  start: {fault}" for fault in self.start_faults[:20]]
        lines += [f"  damage: {fault}" for fault in self.damage_faults[:20]]
        return "\n".join(lines)


@dataclass
class Producer:
    partition: int
    name: str
    topic: str = TOPIC
    next_number: int = 0
    acked: list[bytes] = field(default_factory=list)  # in the order they were sent

    def value(self) -> bytes:
        self.next_number += 1
        return b"%s-%06d-" % (self.name.encode(), self.next_number) + b"x" * 40


def topic_names(topics: int) -> list[str]:
    return [TOPIC] + [f"{TOPIC}{t}" for t in range(1, topics)]


class Chaos:
    def __init__(self, root: Path, catalog_url: str, env: dict[str, str], store_url: str, seed: int, log=print, *,
                 topics: int = 1, partitions: int = PARTITIONS, writers: int = WRITERS, remote_retention_secs: int = 0,
                 expand_in_commit_runs: int = EXPAND_IN_COMMIT_RUNS):
        self.root = root
        self.catalog_url = catalog_url
        self.env = env
        self.store_url = store_url
        self.rng = random.Random(seed)  # the rounds: actions, durations, disks
        self.values_rng = random.Random(seed + 1)  # how many values a produce carries, which partitions it spans
        self.log = log
        self.report = ChaosReport()
        self.topics = topic_names(topics)
        self.partitions = partitions
        self.spread = topics * partitions > SPREAD_ABOVE
        self.writers = writers
        per_partition = 1 if self.spread else PRODUCERS_PER_PARTITION
        self.producers = [Producer(p, f"{t}p{p}w{w}" if t != TOPIC else f"p{p}w{w}", t)
                          for t in self.topics for p in range(partitions) for w in range(per_partition)]
        self.seen_at: dict[bytes, tuple[str, int, int]] = {}  # value -> (topic, partition, seq) where first read
        self.retention_secs = remote_retention_secs
        self.report.retention = bool(remote_retention_secs)
        self.topic_config = dict(TOPIC_CONFIG)
        if remote_retention_secs:
            self.topic_config.update({"remote.copy": "true", "remote.retention.secs": str(remote_retention_secs),
                                      "log.segment.bytes": RETENTION_SEGMENT_BYTES,
                                      "retention.segments.count": RETENTION_LOCAL_SEGMENTS})
        self.value_at: dict[tuple[str, int, int], bytes] = {}  # (topic, partition, seq) -> the bytes read there
        self.first: dict[tuple[str, int], int] = {}  # the first available seq last reported, per partition
        self.expired: set[bytes] = set()  # acknowledged values shown below the first available seq
        self.expired_unread: set[bytes] = set()  # of those, the ones no read saw (module docstring)
        self.disks: list[Path] = []
        self.broker: BrokerProcess | None = None
        self.expand_in_commit_runs = self.report.expand_in_commit_runs = expand_in_commit_runs
        self.last_block_id = 0  # the highest committed block counted so far
        self.engine = None  # for the lock that holds the expansions back (_hold_expansions)

    def _start(self, disk: Path) -> BrokerProcess:
        retention = ("--remote-retention-interval-ms", str(RETENTION_INTERVAL_MS)) if self.retention_secs else ()
        self.broker = BrokerProcess(disk, "--catalog", self.catalog_url, "--store", self.store_url, "--s3-path-style",
                                    "--broker-id", "0", "--block-max-age-ms", "50", *retention,
                                    "--block-expand-in-commit-runs", str(self.expand_in_commit_runs), env=self.env
                                    ).start(timeout_s=60.0 if not self.spread else 900.0)
        return self.broker

    def _new_disk(self) -> Path:
        disk = self.root / f"disk{len(self.disks)}"
        self.disks.append(disk)
        return disk

    async def run(self, rounds: int) -> ChaosReport:
        from tiered.client import Client

        started = time.monotonic()
        disk = self._new_disk()
        broker = self._start(disk)
        async with await Client.connect("127.0.0.1", broker.port) as client:
            for topic in self.topics:
                await client.create_topic(topic, self.partitions, self.topic_config)
        for number in range(1, rounds + 1):
            action = self.rng.choice(ACTIONS)
            self.report.actions[action] += 1
            disk, unexpanded = await self._round(number, action, disk)
            when = f"round {number} ({action})"
            await self.verify(when)
            if unexpanded:
                await self._swept(when, unexpanded)
            self.report.rounds += 1
        self.report.blocks_committed += (await asyncio.to_thread(self._count_blocks))[0]
        if self.engine is not None:
            self.engine.dispose()
        self.broker.stop()
        self.report.seconds = time.monotonic() - started
        return self.report

    async def _round(self, number: int, action: str, disk: Path) -> tuple[Path, int]:
        """Returns the disk the broker restarted on and how many blocks the action left unexpanded."""
        broker = self.broker
        stop_producing = asyncio.Event()
        if self.spread:
            slices = [self.producers[w::self.writers] for w in range(self.writers)]
            tasks = [asyncio.ensure_future(self._produce_spread(broker.port, mine, stop_producing))
                     for mine in slices if mine]
        else:
            tasks = [asyncio.ensure_future(self._produce(broker.port, p, stop_producing)) for p in self.producers]
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        hold = await asyncio.to_thread(self._hold_expansions)
        try:
            until = time.monotonic() + EXPANSION_HOLD_S
            while time.monotonic() < until:
                await asyncio.to_thread(self._hold_more, hold)
                await asyncio.sleep(HOLD_REPEAT_S)
            if action == "stop":
                broker.proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(hold.rollback)  # the graceful stop may expand what it committed
                broker.proc.wait(60)
            else:
                broker.proc.send_signal(signal.SIGKILL)
                broker.proc.wait(30)
        finally:
            await asyncio.to_thread(hold.close)
        stop_producing.set()
        await asyncio.gather(*tasks)
        committed, unexpanded = await asyncio.to_thread(self._count_blocks)
        self.report.blocks_committed += committed
        self.report.left_unexpanded += unexpanded
        damaged = None
        if action == "wipe":
            shutil.rmtree(disk, ignore_errors=True)
        elif action == "damage":
            damaged = self._damage(disk)
        elif action == "takeover":
            others = [d for d in self.disks if d != disk and d.exists()]
            disk = self.rng.choice(others) if others and self.rng.random() < 0.5 else self._new_disk()
        self.log(f"round {number}: {action}, {committed} blocks committed, {unexpanded} left unexpanded, "
                 f"restarting on {disk.name}")
        self._start(disk)
        if damaged is not None:
            await self._damage_named(number, *damaged)
        return disk, unexpanded

    def _damage(self, disk: Path) -> tuple[str, int, str]:
        """Damages one partition directory of the killed broker's disk, as the seed picks (module docstring).
        Returns (topic, partition, kind)."""
        kind = self.rng.choice(DAMAGES)
        everyone = [(t, p) for t in self.topics for p in range(self.partitions)]
        # Garbage goes over a sealed segment: a partition that has one, if any does. Garbage and a removal need a
        # directory (a partition never written on this disk has none; the topic's last one always has one).
        made = [(t, p) for t, p in everyone if disk.joinpath(t, str(p)).is_dir()]
        holding = [(t, p) for t, p in made if kind == "garbage" and any(disk.joinpath(t, str(p)).glob("*.ilog"))]
        topic, partition = self.rng.choice(holding or (everyone if kind == "file" else made))
        directory = disk / topic / str(partition)
        sealed = sorted(directory.glob("*.ilog")) if kind == "garbage" else []
        with_index = kind == "garbage" and self.rng.random() < 0.5
        if sealed:
            segment = self.rng.choice(sealed)
            with open(segment, "r+b") as f:
                f.write(b"\xff" * 64)
            index = directory / f"{segment.name.split('-')[0]}.index"
            if with_index and index.is_file():
                with open(index, "r+b") as f:
                    f.write(b"\xff" * 16)
        elif kind == "garbage":
            kind = "overlap"
            # A copy of its newest segment whose name claims its seqs and one below: the ranges overlap.
            segments = sorted((p for p in directory.iterdir() if p.name.endswith((".log", ".ilog"))),
                              key=lambda p: int(p.name.split("-")[0].split("_")[0].split(".")[0]))
            if segments:
                newest = segments[-1]
                base = int(newest.name.split("-")[0].split("_")[0].split(".")[0])
                shutil.copy(newest, directory / f"{max(base - 1, 1)}-{base}.ilog")
            else:  # nothing written yet: a segment overlapping a copy of itself
                (directory / "1-2.ilog").write_bytes(b"\0" * 64)
                (directory / "2-3.ilog").write_bytes(b"\0" * 64)
        elif kind == "file":
            shutil.rmtree(directory, ignore_errors=True)
            directory.write_text("not a directory")
        else:
            shutil.rmtree(directory)
        self.report.damaged[kind] += 1
        self.log(f"damaged {topic}/{partition}: {kind}")
        return topic, partition, kind

    async def _damage_named(self, number: int, topic: str, partition: int, kind: str) -> None:
        """The restarted broker's /readyz names the damaged partition as opened again, served from the bucket (a
        removed directory only when it is the topic's last partition's: module docstring)."""
        import urllib.error
        import urllib.request

        if kind == "removed" and partition != self.partitions - 1:
            return

        def get() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.broker.http_port}/readyz", timeout=30) as r:
                    return r.read().decode()
            except urllib.error.HTTPError as exc:  # not ready yet (503): the text names the damage all the same
                return exc.read().decode()

        text = await asyncio.to_thread(get)
        line = next((l for l in text.splitlines() if l.startswith(f"partition {topic}/{partition} could not be")),
                    None)
        if line is None or "opened again empty, its history served from the bucket" not in line:
            self.report.damage_faults.append(f"round {number} ({kind} {topic}/{partition}): /readyz said {text!r}")

    async def _produce(self, port: int, producer: Producer, stop: asyncio.Event) -> None:
        from tiered.client import Client, TankError

        try:
            client = await Client.connect("127.0.0.1", port)
        except OSError:
            return
        try:
            while not stop.is_set():
                values = [producer.value() for _ in range(self.values_rng.randint(1, 4))]
                try:
                    await asyncio.wait_for(client.produce(producer.topic, producer.partition, values), 15)
                except TankError:
                    self.report.unconfirmed += len(values)
                    continue
                except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, EOFError):
                    self.report.unconfirmed += len(values)
                    return
                producer.acked.extend(values)
                self.report.acks += len(values)
        finally:
            try:
                await client.close()
            except Exception:  # the broker was killed under it
                pass

    async def _produce_spread(self, port: int, producers: list[Producer], stop: asyncio.Event) -> None:
        """One connection producing to many partitions: each request carries a bundle for up to
        PARTITIONS_PER_PRODUCE of `producers` (each producer in one request at a time, so its acknowledged values
        keep the order it sent them), and each partition's status decides its own values."""
        from tiered.client import Client, TankError
        from tiered.client.client import as_messages
        from tiered.protocol.codes import ProduceStatus

        try:
            client = await Client.connect("127.0.0.1", port)
        except OSError:
            return
        try:
            while not stop.is_set():
                chosen = self.values_rng.sample(producers, min(len(producers), PARTITIONS_PER_PRODUCE))
                bundles = [(p, [p.value() for _ in range(self.values_rng.randint(1, 2))]) for p in chosen]
                try:
                    statuses = await asyncio.wait_for(client.produce_many(
                        {(p.topic, p.partition): as_messages(values) for p, values in bundles}), 15)
                except TankError:
                    self.report.unconfirmed += sum(len(values) for _, values in bundles)
                    continue
                except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, EOFError):
                    self.report.unconfirmed += sum(len(values) for _, values in bundles)
                    return
                for p, values in bundles:
                    if statuses[(p.topic, p.partition)] == ProduceStatus.OK:
                        p.acked.extend(values)
                        self.report.acks += len(values)
                    else:
                        self.report.unconfirmed += len(values)
        finally:
            try:
                await client.close()
            except Exception:  # the broker was killed under it
                pass

    def _hold_expansions(self):
        """A connection in a transaction that locks the rows of the blocks not yet committed or expanded
        (_hold_more; the module docstring says why these locks stop the expansions only)."""
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        if self.engine is None:
            self.engine = create_engine(self.catalog_url, poolclass=NullPool)
        conn = self.engine.connect()
        self._hold_more(conn)
        return conn

    @staticmethod
    def _hold_more(conn) -> None:
        """Locks (FOR KEY SHARE) the block rows written since the last call, in the hold's transaction."""
        from sqlalchemy import text

        conn.execute(text(_HOLD))

    def _count_blocks(self) -> tuple[int, int]:
        """The blocks committed since the last count (by block id: ids only grow) and the committed blocks whose
        runs are still unexpanded (blocks.runs_pending), read from the catalog."""
        from sqlalchemy import func, select

        from tiered.catalog import Catalog
        from tiered.catalog.models import BlockModel

        with Catalog.open(self.catalog_url) as catalog, catalog.read() as conn:
            committed = BlockModel.committed_at.is_not(None)
            count, highest = conn.execute(select(func.count(), func.max(BlockModel.block_id))
                                          .where(committed, BlockModel.block_id > self.last_block_id)).one()
            unexpanded = conn.execute(select(func.count())
                                      .where(committed, BlockModel.runs_pending.is_not(None))).scalar_one()
        self.last_block_id = max(self.last_block_id, highest or 0)
        return count, unexpanded

    async def _swept(self, when: str, left: int) -> None:
        """Waits (at most SWEEP_WAIT_S) for the new broker's sweep to expand the blocks the action left unexpanded,
        then checks the catalog again: the sweep's rows must keep every seq's one location."""
        from tiered.catalog import Catalog
        from tiered.catalog.check import check_catalog

        deadline = time.monotonic() + SWEEP_WAIT_S
        while True:
            committed, unexpanded = await asyncio.to_thread(self._count_blocks)
            self.report.blocks_committed += committed
            if not unexpanded:
                break
            if time.monotonic() > deadline:
                self.report.catalog_problems.append(
                    f"{when}: {unexpanded} blocks still unexpanded {SWEEP_WAIT_S:.0f} s after the restart ({left} left "
                    "by the action)")
                return
            await asyncio.sleep(0.5)
        catalog = Catalog.open(self.catalog_url)
        try:
            for topic in self.topics:
                report = await asyncio.to_thread(check_catalog, catalog, topic)
                self.report.catalog_problems += [f"{when}, after the sweep: {problem}" for problem in report.problems]
        finally:
            catalog.close()

    def _catalog_first(self) -> dict[tuple[str, int], int]:
        from tiered.catalog import Catalog
        from tiered.catalog.partitions import get_partition_states

        with Catalog.open(self.catalog_url) as catalog:
            return {(s.topic, s.partition): s.first_available_seq for topic in self.topics
                    for s in get_partition_states(catalog, topic)}

    async def verify(self, when: str) -> None:
        from tiered.catalog import Catalog
        from tiered.catalog.check import check_catalog
        from tiered.client import BoundaryError, Client

        async with await Client.connect("127.0.0.1", self.broker.port) as client:
            found: dict[tuple[str, int], dict[bytes, int]] = {}
            first: dict[tuple[str, int], int] = {}  # per partition: the highest first available seq met reading it
            if self.retention_secs:
                # The catalog's start, read before the broker is asked: it only moves forward, so the broker's
                # answer may be later, never lower (history below it expired, whatever a disk still holds).
                catalog_first = await asyncio.to_thread(self._catalog_first)
                for topic in self.topics:
                    ranges = await client.discover_partitions(topic)
                    for partition, bounds in enumerate(ranges):
                        first[(topic, partition)] = bounds.first_available
                        if bounds.first_available < catalog_first.get((topic, partition), 0):
                            self.report.start_faults.append(
                                f"{when}: {topic}/{partition} reported first available seq {bounds.first_available}, "
                                f"below the catalog's {catalog_first[(topic, partition)]}")
            readers = asyncio.Semaphore(READERS)

            def seen(topic: str, partition: int, seq: int, value: bytes) -> None:
                before = self.value_at.setdefault((topic, partition, seq), value)
                if before != value:
                    self.report.losses.append(f"{when}: seq {seq} of {topic}/{partition} answered {value[:16]!r}, "
                                              f"was {before[:16]!r}")

            async def read(topic: str, partition: int) -> None:
                values: dict[bytes, int] = {}
                key = (topic, partition)
                async with readers:
                    start = first.get(key, 0)
                    if start:  # the seq just below the first available: refused, or the bytes it held
                        try:
                            got = await client.consume(topic, partition, start - 1, fetch_bytes=64 << 10)
                            for message in got.messages:
                                if message.seq < start:
                                    seen(topic, partition, message.seq, message.value)
                        except BoundaryError:
                            pass
                    while True:
                        try:
                            async for message in client.drain(topic, partition, start, fetch_bytes=256 << 10):
                                if message.value in values:
                                    self.report.losses.append(
                                        f"{when}: {message.value[:16]!r} twice in partition {topic}/{partition}")
                                values[message.value] = message.seq
                                seen(topic, partition, message.seq, message.value)
                                start = message.seq + 1
                            break
                        except BoundaryError as exc:
                            if not self.retention_secs or exc.first_available <= start:
                                raise
                            start = first[key] = exc.first_available  # retention moved it while reading: go on
                found[key] = values

            await asyncio.gather(*(read(t, p) for t in self.topics for p in range(self.partitions)))
        # Whether the seqs read run without a gap from the first available seq (a missing value had no seq there).
        # (Only the seqs at or above it: a read the start moved past while it went on read some below it.)
        whole = {}
        for key, values in found.items():
            if key in first:
                above = sorted(seq for seq in values.values() if seq >= first[key])
                whole[key] = above == list(range(first[key], first[key] + len(above)))
        for key, seq in first.items():
            if seq < self.first.get(key, 0):
                self.report.start_faults.append(f"{when}: the first available seq of {key[0]}/{key[1]} moved back from "
                                          f"{self.first[key]} to {seq}")
            else:
                self.first[key] = seq
        for producer in self.producers:
            key = (producer.topic, producer.partition)
            values = found[key]
            start = first.get(key, 0)
            # Backwards: a value missing is expired if it is shown below the first available seq, or if a value sent
            # after it by the same producer is (its seq is then lower still).
            below = [False] * len(producer.acked)
            later_below = False
            for i in range(len(producer.acked) - 1, -1, -1):
                value = producer.acked[i]
                where = self.seen_at.get(value)
                if value not in values and (later_below or where is not None and where[2] < start):
                    below[i] = later_below = True
                elif where is not None and where[2] < start:
                    later_below = True
            previous = 0
            for i, value in enumerate(producer.acked):
                seq = values.get(value)
                if seq is None:
                    if below[i]:
                        self.expired.add(value)
                    elif previous < start and whole.get(key) and value not in self.seen_at:
                        self.expired.add(value)
                        self.expired_unread.add(value)
                    else:
                        read_from = min(values.values(), default=None)
                        self.report.losses.append(
                            f"{when}: {value[:16]!r} acknowledged, missing" + (
                                f" (first available seq {start}, read from {read_from} to "
                                f"{max(values.values(), default=None)}, {len(values)} values, gap-free "
                                f"{whole.get(key)})" if start else ""))
                    continue
                if value in self.expired:
                    self.report.losses.append(f"{when}: {value[:16]!r} expired, back at seq {seq}")
                if seq <= previous:
                    self.report.losses.append(f"{when}: {value[:16]!r} out of order (seq {seq} after {previous})")
                previous = seq
                where = (producer.topic, producer.partition, seq)
                if self.seen_at.setdefault(value, where) != where:
                    self.report.losses.append(f"{when}: {value[:16]!r} moved from {self.seen_at[value]} to {where}")
        self.report.expired = len(self.expired)
        self.report.expired_unread = len(self.expired_unread)
        self.report.first_available = sum(self.first.values())
        catalog = Catalog.open(self.catalog_url)
        try:
            for topic in self.topics:
                report = await asyncio.to_thread(check_catalog, catalog, topic)
                self.report.catalog_problems += [f"{when}: {problem}" for problem in report.problems]
                self.report.partitions_checked += len(report.partitions)
        finally:
            catalog.close()


async def run_chaos(root: Path, catalog_url: str, env: dict[str, str], store_url: str, *, rounds: int, seed: int,
                    log=print, topics: int = 1, partitions: int = PARTITIONS, writers: int = WRITERS,
                    remote_retention_secs: int = 0, expand_in_commit_runs: int = EXPAND_IN_COMMIT_RUNS) -> ChaosReport:
    chaos = Chaos(root, catalog_url, env, store_url, seed, log, topics=topics, partitions=partitions, writers=writers,
                  remote_retention_secs=remote_retention_secs, expand_in_commit_runs=expand_in_commit_runs)
    try:
        return await chaos.run(rounds)
    finally:
        if chaos.broker is not None:
            chaos.broker.stop()


def keep_broker_logs(root: Path) -> Path | None:
    """A failed run's broker logs (one per broker process started, in the order started), moved out of the run's
    directory before it is removed: what a failure needs to be understood. None when there were none."""
    logs = sorted(root.glob("broker-*.log"), key=lambda path: path.stat().st_mtime)
    if not logs:
        return None
    kept = Path(tempfile.mkdtemp(prefix="tiered-chaos-logs-"))
    for number, log_path in enumerate(logs):
        shutil.move(str(log_path), kept / f"{number:02d}-{log_path.name}")
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=20261123)
    add_size_options(parser, quick="5 rounds", smoke="1 round")
    parser.add_argument("--local-store", action="store_true", help="a local-directory store instead of moto's S3")
    parser.add_argument("--topics", type=int, default=1, help="topics (the first named chaos, then chaos1, ...)")
    parser.add_argument("--partitions", type=int, default=PARTITIONS, help="partitions per topic")
    parser.add_argument("--writers", type=int, default=WRITERS,
                        help=f"producing connections when there are more than {SPREAD_ABOVE} partitions")
    parser.add_argument("--remote-retention-secs", type=int, default=0,
                        help="create the topics with remote.retention.secs=N (and run remote retention every "
                             f"{RETENTION_INTERVAL_MS} ms), so that segments expire during the rounds (default: off)")
    parser.add_argument("--expand-in-commit-runs", type=int, default=EXPAND_IN_COMMIT_RUNS,
                        help="the brokers' --block-expand-in-commit-runs (default 0: every block is expanded after "
                             "its acks, so that kills fall between commits and expansions; 64 is a broker's default)")
    args = parser.parse_args(argv)
    if args.expand_in_commit_runs < 0:
        parser.error("--expand-in-commit-runs must not be negative")
    if args.remote_retention_secs < 0:
        parser.error("--remote-retention-secs must not be negative")
    for name in ("topics", "partitions", "writers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    rounds = size_of(args).pick(args.rounds, 5, 1)
    bindir = find_pg_bindir()
    if bindir is None:
        cannot_run("PostgreSQL server binaries are missing (Debian package postgresql; make system-deps)")
    root = Path(tempfile.mkdtemp(prefix="tiered-chaos-"))
    pg = PgCluster(bindir).start()
    moto = MotoProcess(root).start()
    report = None
    try:
        from tiered.catalog.migrate import upgrade

        upgrade(pg.url())
        store_url = f"file://{root / 'objects'}" if args.local_store else f"s3://{moto.bucket}/chaos"
        report = asyncio.run(run_chaos(root, pg.url(), moto.env, store_url, rounds=rounds, seed=args.seed,
                                       log=lambda text: print(text, file=sys.stderr, flush=True), topics=args.topics,
                                       partitions=args.partitions, writers=args.writers,
                                       remote_retention_secs=args.remote_retention_secs,
                                       expand_in_commit_runs=args.expand_in_commit_runs))
    finally:
        moto.stop()
        pg.stop()
        if report is None or not report.ok:
            kept = keep_broker_logs(root)
            if kept is not None:
                print(f"chaos: the brokers' logs are kept in {kept}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
    print(f"chaos: seed {args.seed}, {args.topics} x {args.partitions} partitions"
          + (", local-directory store" if args.local_store else "")
          + (f", remote.retention.secs={args.remote_retention_secs}" if args.remote_retention_secs else ""))
    print(report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
