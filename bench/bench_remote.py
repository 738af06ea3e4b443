"""Remote fetch benchmark (issue 5): latency of local, cold and warm remote fetches, S3 GETs and catalog queries per
fetch, and replay of history from the bucket through the broker, all in one run.

    python -m bench.bench_remote                 1 GiB replay, 100 fetches per latency row, SQLite and PostgreSQL
    python -m bench.bench_remote --quick         64 MiB replay, 30 fetches per row (under a minute)
    python -m bench.bench_remote --smoke         8 MiB replay at the default read-ahead only, 3 fetches per row,
                                                 SQLite only: every step once, figures that mean nothing
    python -m bench.bench_remote --profile       also cProfile the broker's event loop over warm fetches and a
                                                 second replay pass, and print the top costs

Three processes, so that no figure pays for another part's CPU under the GIL:
- this one runs the broker in-process (its Metrics counters and caches are read and reset between fetches);
- moto's S3 server (`ThreadedMotoServer`) runs in a child process, with a bucket;
- the measuring client runs in another (bench/remote_processes.py): a blocking socket for first-byte timing, the
  project's asyncio Client for producing and replaying.

Rows of the latency table (fetches of FETCH_BYTES, one at a time; the first five interleaved sample by sample):
- local:          seqs still on the local disk (sendfile of page-cached segment bytes);
- remote cold:    the remote reader's segment-row and index caches emptied first, as after a restart;
- remote index cached: only the segment-row cache emptied (a row past its TTL, the index still cached): the case
                  of the goal "at most one GET and one catalog query per cold fetch once the index is cached";
- remote warm:    both caches hold the segment;
- moto GET:       a same-sized range GET of the same objects straight from moto with boto3: the floor under every
                  remote row;
- first after restart, block run: after a restart on an empty disk, seqs of the old active segment, which no
                  remote segment holds yet; the first such fetch after each of several restarts, then further ones.

The replay drains every remote seq of a topic whose sealed segments were copied and then deleted locally, with the
project's Client at REPLAY_FETCH_BYTES per fetch, checking that each seq arrives once and in order; once at each
read-ahead depth of REPLAY_DEPTHS (the broker's default last, whose figures are the replay table's), with the bulk
consumer (Client.consume_chunk); then at the default depth with the consumers that build a Message per message
(Client.consume, its chunk reader native, then pure Python as before), to show what the consumer's CPU costs the
replay on a machine whose cores it shares with the broker and moto.

Then isolation: a second client process produces one small message every PROBE_INTERVAL_S with durable acks and
tails the same partition, timing each ack and each delivery, first with the broker otherwise idle, then while
replays run back to back. The last table puts the figures issue 14 sets goals for next to their references from the
same run: replay against sequential range GETs of the same objects, first byte against a bare GET's, bytes GET per
byte answered, produce ack and tail delivery p99 during replays against idle.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import io
import os
import platform
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.remote_processes import ClientProcess, Moto, Postgres, own_cpu_s
from bench.sizes import Size, add_size_options, size_of
from tiered.topic_partition import TopicPartition

REPO = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
TOPIC = "lat"
REPLAY_TOPIC = "replay"
FETCH_BYTES = 1 << 20
REPLAY_FETCH_BYTES = 16 << 20
REPLAY_DEPTHS = (1, 2, 3)  # read-ahead depths the replay is run at (the reader's default among them)
CONSUMERS = ("chunks", "messages", "messages, pure Python")  # bench/remote_processes.py _Session.drain
VALUE_BYTES = 1000
PER_BUNDLE = 64  # ~64 KiB bundles
MSGS_PER_FETCH = FETCH_BYTES // (VALUE_BYTES + 16)  # each message costs its value and about 16 bytes of framing
# Latency data: 4 MiB segments, 2 sealed ones kept locally: the older ones are remote only.
LATENCY_CONFIG = {"log.segment.bytes": "4m", "retention.segments.count": "2"}
# Replay data: every sealed segment leaves the local disk once copied; only the active one stays.
REPLAY_CONFIG = {"log.retention.bytes": "128"}
COUNTERS = ("tiered_remote_gets_total", "tiered_remote_catalog_queries_total", "tiered_remote_cache_hits_total",
            "tiered_remote_cache_misses_total", "tiered_remote_bytes_total", "tiered_remote_read_ahead_hits_total")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the broker ----------------------------------------------------------------------------------------------------

async def start_broker(data_dir: Path, catalog_url: str, bucket: str):
    from tiered.config import Settings
    from tiered.server.app import App, tiering_service

    settings = Settings(data_dir=data_dir, listen="127.0.0.1:0", http_listen="off", catalog_url=catalog_url,
                        store_url=f"s3://{bucket}/t", s3_path_style=True)
    app = App(settings, tier=tiering_service())
    await app.start()
    app.probe = ReaderProbe(app.tier.remote.reader)  # the benchmark's own attribute, for this run only
    return app


class ReaderProbe:
    """Wall time inside the remote reader's fetch and the store's GETs (whole or streamed), and the bytes the GETs
    returned (the store's own counter): the bound methods are wrapped on their instances (the broker's code is not
    changed)."""

    def __init__(self, reader) -> None:
        self.seconds = {"fetch": 0.0, "get_range": 0.0}
        self.store = reader.store
        for owner, name, key in ((reader, "fetch", "fetch"), (reader.store, "get_range", "get_range"),
                                 (reader.store, "read_range_into", "get_range")):
            setattr(owner, name, self._timed(getattr(owner, name), key))

    @property
    def get_bytes(self) -> int:
        return self.store.counters.get_bytes

    def _timed(self, method, key: str):
        async def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - started
        return timed


async def copied_segments(app, topic: str) -> list:
    from tiered.catalog import segments as catalog_segments
    from tiered.catalog.states import SegmentState

    return await app.tier.catalog.read(catalog_segments.list_segments, topic, 0,
                                                 states=(SegmentState.COPY_FINISHED,))


async def produce_and_tier(app, client: ClientProcess, topic: str, config: dict, total_bytes: int) -> dict:
    """Produces `total_bytes` of messages, waits until every sealed segment is copied, then applies local retention.
    Returns the seq ranges: remote only, and still local."""
    port = app.broker.port
    await client.call("create_topic", port, topic, config)
    size, _, seconds = await client.call("produce", port, topic, total_bytes, VALUE_BYTES, PER_BUNDLE)
    log(f"{topic}: produced {size / 1e6:.0f} MB of values in {seconds:.1f} s with durable acks")
    part = app.broker.registry.get(topic, 0)
    copier = app.tier.remote.copier
    deadline = time.monotonic() + 600
    # The copier's own record of finished copies is what local retention asks (may_delete), so wait on it.
    while not all(copier.is_copied(TopicPartition(topic, 0), segment.base) for segment in part.log.segments):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: sealed segments not copied within 600 s")
        await asyncio.sleep(0.2)
    app.broker.enforce_retention()
    rows = await copied_segments(app, topic)
    local_first = part.log.first_available
    return {
        "remote_first": part.first_available,
        "remote_last": local_first - 1,
        "local_first": local_first,
        "hwmark": part.hwmark,
        "segments": [r for r in rows if r.last_seq < local_first],
    }


# -- latency -------------------------------------------------------------------------------------------------------

@dataclass
class Row:
    name: str
    ttfb_s: list[float] = field(default_factory=list)
    full_s: list[float] = field(default_factory=list)
    bytes: int = 0
    fetches: int = 0
    gets: list[int] = field(default_factory=list)
    queries: list[int] = field(default_factory=list)
    read_bytes: int = 0  # bytes the broker's GETs returned

    def add(self, ttfb_s: float, full_s: float, size: int, gets: int | None = None, queries: int | None = None,
            read_bytes: int = 0):
        self.ttfb_s.append(ttfb_s)
        self.full_s.append(full_s)
        self.bytes += size
        self.fetches += 1
        self.read_bytes += read_bytes
        if gets is not None:
            self.gets.append(gets)
            self.queries.append(queries)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def fetch_into(row: Row, app, client: ClientProcess, seq: int, reset=None) -> None:
    """One timed fetch, with the remote GETs and catalog queries the broker counted for it."""
    if reset is not None:
        reset()
    counters = app.broker.metrics.counters
    gets, queries = counters["tiered_remote_gets_total"], counters["tiered_remote_catalog_queries_total"]
    read_bytes = app.probe.get_bytes
    ttfb, full, size = await client.call("fetch", TOPIC, seq, FETCH_BYTES)
    row.add(ttfb, full, size, int(counters["tiered_remote_gets_total"] - gets),
            int(counters["tiered_remote_catalog_queries_total"] - queries), app.probe.get_bytes - read_bytes)


async def latency_rows(app, client: ClientProcess, ranges: dict, samples: int, rng: random.Random, moto_url: str,
                       bucket: str) -> list[Row]:
    """Local, remote cold, remote with the index cached, remote warm, and moto's own GET, interleaved sample by
    sample so that a change in the machine's load during the run hits every row alike."""
    from tiered.tiering.reads.caches import RangeCache, SizedLru

    remote = app.tier.remote.reader
    await client.call("connect", app.broker.port)

    def empty_all():
        remote.segments = RangeCache(remote.clock.monotonic)
        remote.indexes = SizedLru(64 << 20, lambda index: index.size_bytes)

    def empty_rows():
        remote.segments = RangeCache(remote.clock.monotonic)

    local, cold, index_cached, warm = Row("local"), Row("remote cold"), Row("remote index cached"), Row("remote warm")
    moto = Row("moto GET (no broker)")
    for _ in range(samples):
        await fetch_into(local, app, client, rng.randint(ranges["local_first"], ranges["hwmark"] - MSGS_PER_FETCH))
        segment = rng.choice(ranges["segments"])
        seqs = [rng.randint(segment.base_seq, segment.last_seq) for _ in range(3)]
        await fetch_into(cold, app, client, seqs[0], empty_all)  # leaves the segment's index cached
        await fetch_into(index_cached, app, client, seqs[1], empty_rows)  # leaves its row cached too
        await fetch_into(warm, app, client, seqs[2])
        start = rng.randint(0, max(0, segment.size_bytes - FETCH_BYTES))
        moto.add(*await client.call("s3get", moto_url, bucket, f"t/{segment.object_key}", start,
                                    min(segment.size_bytes, start + FETCH_BYTES)))
    return [local, cold, index_cached, warm, moto]


async def profile_warm(app, client: ClientProcess, ranges: dict, samples: int, rng: random.Random) -> str:
    """cProfile of the broker's event loop over warm remote fetches (apart from the measured rows)."""
    seqs = [rng.randint(ranges["remote_first"], ranges["remote_last"]) for _ in range(samples)]
    for seq in seqs:  # every segment's row and index into the caches
        await client.call("fetch", TOPIC, seq, FETCH_BYTES)
    profile = cProfile.Profile()
    profile.enable()
    for seq in reversed(seqs):
        await client.call("fetch", TOPIC, seq, FETCH_BYTES)
    profile.disable()
    return profile_table(f"{samples} warm remote fetches under cProfile", profile)


async def first_after_restart(app, client: ClientProcess, rng: random.Random, first_fetch: Row) -> None:
    """One fetch of a seq no segment holds yet (the active segment of a broker restarted on an empty disk), which
    only the block runs have: the first fetch after a restart."""
    segments = await copied_segments(app, TOPIC)
    first = max(r.last_seq for r in segments) + 1
    last = max(first, app.broker.registry.get(TOPIC, 0).hwmark - MSGS_PER_FETCH)
    await client.call("connect", app.broker.port)
    await fetch_into(first_fetch, app, client, rng.randint(first, last))


async def block_run_rows(app, client: ClientProcess, samples: int, rng: random.Random) -> Row:
    """Fetches of seqs only the block runs have, after the first fetch after the restart."""
    segments = await copied_segments(app, TOPIC)
    first = max(r.last_seq for r in segments) + 1
    last = max(first, app.broker.registry.get(TOPIC, 0).hwmark - MSGS_PER_FETCH)
    row = Row("block run (empty disk)")
    for _ in range(samples):
        await fetch_into(row, app, client, rng.randint(first, last))
    return row


# -- replay --------------------------------------------------------------------------------------------------------

@dataclass
class Replay:
    messages: int
    payload_bytes: int
    remote_bytes: int
    seconds: float
    gets: int
    queries: int
    fetches: int
    broker_cpu_s: float
    moto_cpu_s: float
    client_cpu_s: float
    cache_hits: int
    cache_misses: int
    reader_s: float  # wall time inside RemoteReader.fetch
    get_s: float  # wall time inside the object store's GETs (they overlap the fetches with read-ahead)
    get_bytes: int  # bytes the GETs returned
    ahead_hits: int
    moto_ceiling_mb_s: float = 0.0


async def replay(app, client: ClientProcess, moto: Moto, ranges: dict, consumer: str = CONSUMERS[0]) -> Replay:
    counters = app.broker.metrics.counters
    before = {name: counters[name] for name in COUNTERS}
    cpu0, moto0 = own_cpu_s(), moto.cpu_s()
    probe = app.probe
    reader_s, get_s, get_bytes = probe.seconds["fetch"], probe.seconds["get_range"], probe.get_bytes
    messages, payload, seconds, fetches, client_cpu = await client.call(
        "drain", app.broker.port, REPLAY_TOPIC, ranges["remote_first"], ranges["remote_last"], REPLAY_FETCH_BYTES,
        consumer)
    if messages != ranges["remote_last"] - ranges["remote_first"] + 1:
        raise RuntimeError(f"replay returned {messages} messages, expected "
                           f"{ranges['remote_last'] - ranges['remote_first'] + 1}")
    delta = {name: counters[name] - before[name] for name in COUNTERS}
    return Replay(messages, payload, int(delta["tiered_remote_bytes_total"]), seconds,
                  int(delta["tiered_remote_gets_total"]), int(delta["tiered_remote_catalog_queries_total"]), fetches,
                  own_cpu_s() - cpu0, moto.cpu_s() - moto0, client_cpu, int(delta["tiered_remote_cache_hits_total"]),
                  int(delta["tiered_remote_cache_misses_total"]), probe.seconds["fetch"] - reader_s,
                  probe.seconds["get_range"] - get_s, probe.get_bytes - get_bytes,
                  int(delta["tiered_remote_read_ahead_hits_total"]))


async def moto_ceiling(client: ClientProcess, moto_url: str, bucket: str, segments: list) -> float:
    """MB/s of sequential REPLAY_FETCH_BYTES range GETs over the same objects, straight from moto (one stream)."""
    total, seconds = 0, 0.0
    for segment in segments:
        for start in range(0, segment.size_bytes, REPLAY_FETCH_BYTES):
            _, full, size = await client.call("s3get", moto_url, bucket, f"t/{segment.object_key}", start,
                                              min(segment.size_bytes, start + REPLAY_FETCH_BYTES))
            total += size
            seconds += full
    return total / seconds / 1e6


# -- isolation -----------------------------------------------------------------------------------------------------

PROBE_TOPIC = "probe"
PROBE_INTERVAL_S = 0.02


class HotPathProbe:
    """Where a durable ack's time goes, block by block: the block's age when it was closed (the age limit plus the
    block timer's lateness), the intent row, the PUT and the commit (waiting for the earlier block's commit
    included). The pipeline's store and catalog are wrapped for the pipeline alone (the copier and the remote
    reader keep the originals), so only the hot path's own calls are timed."""

    STEPS = ("age at close", "intent row", "PUT", "commit", "loop lag")
    LAG_TICK_S = 0.005

    def __init__(self, durable) -> None:
        self.samples: dict[str, list[float]] = {step: [] for step in self.STEPS}
        pipeline = durable.pipeline
        probe = self

        class Store:
            def __getattr__(self, name):
                return getattr(pipeline_store, name)

            async def put(self, *args, **kwargs):
                return await probe._timed("PUT", pipeline_store.put(*args, **kwargs))

        class Catalog:
            def __getattr__(self, name):
                return getattr(pipeline_catalog, name)

            async def write(self, fn, *args, **kwargs):
                step = "commit" if getattr(fn, "__name__", "") == "commit_block" else "intent row"
                return await probe._timed(step, pipeline_catalog.write(fn, *args, **kwargs))

        pipeline_store, pipeline_catalog, submit = pipeline.store, pipeline.catalog, pipeline.submit
        pipeline.store, pipeline.catalog = Store(), Catalog()

        def submitted(block):
            self.samples["age at close"].append(max(0.0, durable.clock.now_ms() - block.opened_ms) / 1000)
            return submit(block)
        pipeline.submit = submitted
        self._lag = asyncio.ensure_future(self._lag_loop())

    async def _lag_loop(self) -> None:
        """How late the broker's event loop wakes from a LAG_TICK_S sleep: what any ready callback waits."""
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.LAG_TICK_S)
            self.samples["loop lag"].append(max(0.0, time.perf_counter() - started - self.LAG_TICK_S))

    def stop(self) -> None:
        self._lag.cancel()

    async def _timed(self, step: str, awaitable):
        started = time.perf_counter()
        try:
            return await awaitable
        finally:
            self.samples[step].append(time.perf_counter() - started)

    def take(self) -> dict[str, list[float]]:
        taken, self.samples = self.samples, {step: [] for step in self.STEPS}
        return taken


@dataclass
class Isolation:
    idle_acks: list[float]
    idle_deliveries: list[float]
    busy_acks: list[float]
    busy_deliveries: list[float]
    replays: int
    replay_mb_s: float
    idle_steps: dict[str, list[float]] = field(default_factory=dict)
    busy_steps: dict[str, list[float]] = field(default_factory=dict)
    off_acks: list[float] = field(default_factory=list)  # during replays that do not give way (--yield-off)
    off_deliveries: list[float] = field(default_factory=list)
    off_replay_mb_s: float = 0.0


async def isolation(app, client: ClientProcess, prober: ClientProcess, moto: Moto, ranges: dict,
                    seconds: float, yield_off: bool) -> Isolation:
    """A producer with durable acks and a tail consumer on their own topic (bench/remote_processes.py "probe"), for
    `seconds` with the broker otherwise idle, then for `seconds` while full-speed replays run back to back, then
    (`yield_off`) for `seconds` more with replays that do not give way to the hot path (remote_read_yield_ms 0)."""
    port = app.broker.port
    await prober.call("create_topic", port, PROBE_TOPIC, {})
    steps = HotPathProbe(app.tier.durable)
    idle_acks, idle_deliveries = await prober.call("probe", port, PROBE_TOPIC, seconds, PROBE_INTERVAL_S)
    idle_steps = steps.take()
    busy_acks, busy_deliveries, replays, replay_mb_s = await probe_during_replays(app, client, prober, moto, ranges,
                                                                                   seconds)
    iso = Isolation(idle_acks, idle_deliveries, busy_acks, busy_deliveries, replays, replay_mb_s, idle_steps,
                    steps.take())
    if yield_off:
        gate = app.tier.hot_path
        max_pause_s, gate.max_pause_s = gate.max_pause_s, 0.0
        try:
            iso.off_acks, iso.off_deliveries, _, iso.off_replay_mb_s = await probe_during_replays(
                app, client, prober, moto, ranges, seconds)
        finally:
            gate.max_pause_s = max_pause_s
    steps.stop()
    return iso


async def probe_during_replays(app, client: ClientProcess, prober: ClientProcess, moto: Moto, ranges: dict,
                               seconds: float) -> tuple[list[float], list[float], int, float]:
    """The probe's acks and deliveries while replays run back to back, how many replays, and their MB/s."""
    probing = asyncio.ensure_future(prober.call("probe", app.broker.port, PROBE_TOPIC, seconds, PROBE_INTERVAL_S))
    replays, mb, replay_s = 0, 0.0, 0.0
    while not probing.done():
        r = await replay(app, client, moto, ranges)
        replays += 1
        mb += r.remote_bytes / 1e6
        replay_s += r.seconds
    acks, deliveries = await probing
    return acks, deliveries, replays, mb / replay_s


# -- report --------------------------------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def latency_table(backend: str, rows: list[Row]) -> str:
    head = (f"{'fetch (' + backend + ')':<24}{'n':>4}{'first byte p50':>15}{'p99':>7}{'full p50':>9}{'p99':>7}"
            f"{'MB/s':>6}{'GETs/fetch':>14}{'queries/fetch':>15}{'KiB read/fetch':>16}{'GET/answer':>11}")
    lines = [head, "-" * len(head)]
    for row in rows:
        mb_s = row.bytes / sum(row.full_s) / 1e6
        if row.gets:
            gets = f"{statistics.mean(row.gets):.2f} (max {max(row.gets)})"
            queries = f"{statistics.mean(row.queries):.2f} (max {max(row.queries)})"
            read = f"{row.read_bytes / row.fetches / 1024:.0f}"
            ratio = f"{row.read_bytes / row.bytes:.2f}"
        else:
            gets = queries = read = ratio = "-"
        lines.append(f"{row.name:<24}{row.fetches:>4}{ms(quantile(row.ttfb_s, .5)):>15}"
                     f"{ms(quantile(row.ttfb_s, .99)):>7}{ms(quantile(row.full_s, .5)):>9}"
                     f"{ms(quantile(row.full_s, .99)):>7}{mb_s:>6.0f}{gets:>14}{queries:>15}{read:>16}{ratio:>11}")
    for row in rows:
        if row.name == "first after restart":
            lines.append(f"(first after restart, first byte of each restart in order, ms: "
                         f"{' '.join(ms(t) for t in row.ttfb_s)})")
    sizes = ", ".join(f"{row.name} {row.bytes // row.fetches >> 10}" for row in rows)
    lines.append(textwrap.fill(f"(times in ms; {FETCH_BYTES >> 20} MiB fetches; KiB per answer on average: {sizes})",
                               len(head)))
    return "\n".join(lines)


def replay_table(backend: str, segment_bytes: int, r: Replay) -> str:
    mb = r.remote_bytes / 1e6
    return "\n".join([
        f"replay from the bucket ({backend}, {segment_bytes >> 20} MiB segments, {REPLAY_FETCH_BYTES >> 20} MiB "
        f"fetches, one consumer)",
        f"  {r.messages} messages, {mb:.0f} MB of segment bytes in {r.seconds:.1f} s: {mb / r.seconds:.0f} MB/s "
        f"({r.payload_bytes / 1e6 / r.seconds:.0f} MB/s of message values)",
        f"  {r.fetches} fetches: {r.gets} GETs ({r.gets / r.fetches:.2f}/fetch), {r.queries} catalog queries "
        f"({r.queries / r.fetches:.2f}/fetch); segment-row cache {r.cache_hits} hits, {r.cache_misses} misses",
        f"  {r.ahead_hits} fetches served by a read-ahead; GETs returned {r.get_bytes / 1e6:.0f} MB: "
        f"{r.get_bytes / r.remote_bytes:.3f} bytes GET per byte answered",
        f"  wall time inside the broker's remote reader {r.reader_s:.2f} s; inside S3 GETs {r.get_s:.2f} s "
        f"(GETs overlap the fetches)",
        f"  CPU during the replay: broker {r.broker_cpu_s:.2f} s, moto {r.moto_cpu_s:.2f} s, client "
        f"{r.client_cpu_s:.2f} s (of {r.seconds:.2f} s wall, {os.cpu_count()} cores)",
        f"  moto alone, same objects, sequential {REPLAY_FETCH_BYTES >> 20} MiB range GETs with boto3: "
        f"{r.moto_ceiling_mb_s:.0f} MB/s",
    ])


def depth_table(by_depth: dict, default: int, ceiling_mb_s: float) -> str:
    lines = [f"replay by read-ahead depth (windows read ahead of the consumer; {default} is the default), one after "
             f"another in this run", f"  {'depth':>5}{'MB/s':>7}{'x seq. GETs':>13}{'GETs':>6}{'ahead hits':>12}"
             f"{'in GETs s':>11}{'broker CPU s':>14}"]
    for depth in sorted(by_depth):
        r = by_depth[depth]
        mb_s = r.remote_bytes / 1e6 / r.seconds
        lines.append(f"  {depth:>5}{mb_s:>7.0f}{mb_s / ceiling_mb_s:>13.2f}{r.gets:>6}{r.ahead_hits:>12}"
                     f"{r.get_s:>11.2f}{r.broker_cpu_s:>14.2f}")
    return "\n".join(lines)


def consumer_table(by_consumer: dict, ceiling_mb_s: float) -> str:
    lines = [f"replay by consumer (read-ahead depth the default; the first is the replay above), one after another "
             f"in this run",
             f"  {'consumer':<44}{'MB/s':>6}{'x seq. GETs':>13}{'client CPU s':>14}{'broker CPU s':>14}"
             f"{'moto CPU s':>12}"]
    names = {"chunks": "Client.consume_chunk (bulk, checked natively)",
             "messages": "Client.consume, a Message per message",
             "messages, pure Python": "Client.consume, pure-Python reader (before)"}
    for consumer, r in by_consumer.items():
        mb_s = r.remote_bytes / 1e6 / r.seconds
        lines.append(f"  {names[consumer]:<44}{mb_s:>6.0f}{mb_s / ceiling_mb_s:>13.2f}{r.client_cpu_s:>14.2f}"
                     f"{r.broker_cpu_s:>14.2f}{r.moto_cpu_s:>12.2f}")
    return "\n".join(lines)


def goals_table(backend: str, rows: list[Row], r: Replay, iso: Isolation | None) -> str:
    """The figures issue 14 sets goals for, each against its reference measured in the same run."""
    by = {row.name: row for row in rows}
    warm, bare, run = by["remote warm"], by["moto GET (no broker)"], by["block run (empty disk)"]
    replay_mb_s = r.remote_bytes / 1e6 / r.seconds
    lines = [f"remote reads against the goals of issue 14 ({backend}; every reference measured in the same run)",
             f"  {'figure':<58}{'measured':>10}{'reference':>11}{'ratio':>7}  goal"]

    def line(name: str, measured: str, reference: str, ratio: str, goal: str) -> None:
        lines.append(f"  {name:<58}{measured:>10}{reference:>11}{ratio:>7}  {goal}")

    line(f"replay MB/s vs sequential {REPLAY_FETCH_BYTES >> 20} MiB range GETs of the same objects",
         f"{replay_mb_s:.0f}", f"{r.moto_ceiling_mb_s:.0f}", f"{replay_mb_s / r.moto_ceiling_mb_s:.2f}", ">= 0.8")
    a, b = quantile(warm.ttfb_s, .5), quantile(bare.ttfb_s, .5)
    line("first byte p50 (ms), 1 MiB warm remote fetch vs a bare GET", ms(a), ms(b), f"{a / b:.2f}", "<= 1.2")
    a = quantile(by["remote cold"].ttfb_s, .5)
    line("first byte p50 (ms), 1 MiB cold remote fetch vs a bare GET", ms(a), ms(b), f"{a / b:.2f}", "-")
    first = by["first after restart"]
    a = quantile(first.ttfb_s, .5)
    line(f"first byte p50 (ms), first remote fetch after a restart (n={first.fetches}) vs a bare GET", ms(a), ms(b),
         f"{a / b:.2f}", "no cold start")
    a, c = quantile(first.ttfb_s, 1.0), quantile(by["block run (empty disk)"].ttfb_s, .5)
    line("first byte (ms), max of those vs p50 of later block-run fetches", ms(a), ms(c), f"{a / c:.2f}", "-")
    line("bytes GET per byte answered: replay", f"{r.get_bytes / r.remote_bytes:.3f}", "", "", "<= 1.25")
    for row in (by["remote warm"], by["remote cold"], run):
        line(f"bytes GET per byte answered: {row.name}", f"{row.read_bytes / row.bytes:.3f}", "", "", "<= 1.25")
    if iso is not None:
        for name, idle, busy in (("durable produce ack", iso.idle_acks, iso.busy_acks),
                                 ("tail consumer delivery", iso.idle_deliveries, iso.busy_deliveries)):
            a, b = quantile(busy, .99), quantile(idle, .99)
            line(f"{name} p99 (ms), during replay vs idle (n={len(busy)}/{len(idle)})", ms(a), ms(b),
                 f"{a / b:.2f}", "<= 1.10")
            a, b = quantile(busy, .5), quantile(idle, .5)
            line(f"{name} p50 (ms), during replay vs idle", ms(a), ms(b), f"{a / b:.2f}", "-")
        lines.append(f"  (during the probe: {iso.replays} replays back to back at {iso.replay_mb_s:.0f} MB/s)")
        if iso.off_acks:
            for name, idle, off in (("durable produce ack", iso.idle_acks, iso.off_acks),
                                    ("tail consumer delivery", iso.idle_deliveries, iso.off_deliveries)):
                a, b = quantile(off, .99), quantile(idle, .99)
                line(f"{name} p99 (ms), replays not giving way, vs idle", ms(a), ms(b), f"{a / b:.2f}", "-")
            lines.append(f"  (replays not giving way ran at {iso.off_replay_mb_s:.0f} MB/s)")
        lines.append(f"  where a durable ack's time goes, per block (ms), idle -> during replay (loop lag: how late the "
                     f"broker's loop wakes from a {HotPathProbe.LAG_TICK_S * 1000:.0f} ms sleep, per wake):")
        for step in HotPathProbe.STEPS:
            idle, busy = iso.idle_steps.get(step) or [0.0], iso.busy_steps.get(step) or [0.0]
            lines.append(f"    {step:<14} p50 {ms(quantile(idle, .5)):>6} -> {ms(quantile(busy, .5)):>6}   "
                         f"p99 {ms(quantile(idle, .99)):>6} -> {ms(quantile(busy, .99)):>6}   "
                         f"(blocks {len(iso.idle_steps.get(step, []))} -> {len(iso.busy_steps.get(step, []))})")
    return "\n".join(lines)


def profile_table(title: str, profile: cProfile.Profile, top: int = 12) -> str:
    """The functions with the most own time, then the project's and the S3 client's with the most cumulative time."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():
        short = path.replace(str(REPO) + "/", "")
        for marker in ("site-packages/", f"/lib/python{sys.version_info[0]}.{sys.version_info[1]}/"):
            if marker in short:
                short = short.split(marker, 1)[1]
        rows.append((tottime, cumtime, calls, f"{short}:{line}({name})"))
    total = sum(r[0] for r in rows) or 1.0
    lines = [f"{title}: the broker's event loop thread, {total:.2f} s profiled",
             f"  {'own s':>7}{'share':>7}{'cum s':>8}{'calls':>9}  function (by own time)"]
    for tottime, cumtime, calls, where in sorted(rows, reverse=True)[:top]:
        lines.append(f"  {tottime:>7.2f}{tottime / total:>7.0%}{cumtime:>8.2f}{calls:>9}  {where}")
    lines.append(f"  {'':>7}{'':>7}{'cum s':>8}{'calls':>9}  tiered/ and aiobotocore/ functions (by cumulative time)")
    ours = [r for r in rows if r[3].startswith(("tiered/", "aiobotocore/")) and r[1] < total * 0.99]
    for tottime, cumtime, calls, where in sorted(ours, key=lambda r: r[1], reverse=True)[:top]:
        lines.append(f"  {'':>7}{cumtime / total:>7.0%}{cumtime:>8.2f}{calls:>9}  {where}")
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------------------------------------------

async def run_backend(backend: str, catalog_url: str, moto: Moto, client: ClientProcess, prober: ClientProcess,
                      bucket: str, args, workdir: Path) -> list[str]:
    size = args.size
    samples = size.pick(100, 30, 3)
    rng = random.Random(5)
    out = []
    data_dir = workdir / f"data-{backend}"
    app = await start_broker(data_dir, catalog_url, bucket)
    try:
        log(f"{backend}: producing the latency topic ...")
        ranges = await produce_and_tier(app, client, TOPIC, LATENCY_CONFIG, size.pick(63, 23, 13) << 20)
        log(f"{backend}: remote {ranges['remote_first']}..{ranges['remote_last']} in {len(ranges['segments'])} "
            f"segments, local {ranges['local_first']}..{ranges['hwmark']}; measuring fetches ...")
        rows = await latency_rows(app, client, ranges, samples, rng, moto.url, bucket)
        profiled = await profile_warm(app, client, ranges, samples, rng) if args.profile else None
        restarts = size.pick(12, 5, 1)
        log(f"{backend}: restarting the broker on an empty disk, {restarts} times ...")
        first_fetch = Row("first after restart")
        for _ in range(restarts):
            await app.stop()
            shutil.rmtree(data_dir)
            app = await start_broker(data_dir, catalog_url, bucket)
            await first_after_restart(app, client, rng, first_fetch)
        rows.extend([first_fetch, await block_run_rows(app, client, samples, rng)])
        out.append(latency_table(backend, rows))
        if profiled is not None:
            out.append(profiled)
        if backend != args.replay_backend:
            return out
        replay_bytes, segment = size.pick((1024 << 20, 64 << 20), (64 << 20, 16 << 20), (8 << 20, 2 << 20))
        log(f"{backend}: producing {replay_bytes >> 20} MiB in {segment >> 20} MiB segments for the replay ...")
        started = time.monotonic()
        config = {"log.segment.bytes": str(segment), **REPLAY_CONFIG}
        ranges = await produce_and_tier(app, client, REPLAY_TOPIC, config, replay_bytes + segment // 2)
        log(f"{backend}: produced and tiered in {time.monotonic() - started:.0f} s; replaying "
            f"{ranges['remote_first']}..{ranges['remote_last']} ...")
        from tiered.tiering.reads.remote_fetch import AHEAD_DEPTH

        reader = app.tier.remote.reader
        by_depth = {}
        depths = [] if size is Size.SMOKE else [d for d in REPLAY_DEPTHS if d != AHEAD_DEPTH]
        for depth in (*depths, AHEAD_DEPTH):  # the default's last
            reader.ahead_depth = depth
            by_depth[depth] = await replay(app, client, moto, ranges)
        result = by_depth[AHEAD_DEPTH]
        by_consumer = {CONSUMERS[0]: result}
        for consumer in CONSUMERS[1:]:
            by_consumer[consumer] = await replay(app, client, moto, ranges, consumer)
        result.moto_ceiling_mb_s = await moto_ceiling(client, moto.url, bucket, ranges["segments"])
        out.append(replay_table(backend, segment, result))
        out.append(depth_table(by_depth, AHEAD_DEPTH, result.moto_ceiling_mb_s))
        out.append(consumer_table(by_consumer, result.moto_ceiling_mb_s))
        log(f"{backend}: produce and tail latency, idle then during replays ...")
        iso = await isolation(app, client, prober, moto, ranges, size.pick(15.0, 6.0, 1.0), args.yield_off)
        out.append(goals_table(backend, rows, result, iso))
        if args.profile:
            log(f"{backend}: replaying again under cProfile ...")
            profile = cProfile.Profile()
            profile.enable()
            again = await replay(app, client, moto, ranges)
            profile.disable()
            out.append(profile_table(f"replay under cProfile ({again.seconds:.1f} s, "
                                     f"{again.remote_bytes / 1e6 / again.seconds:.0f} MB/s profiled)", profile))
        return out
    finally:
        await app.stop()


async def main_async(args) -> list[str]:
    import boto3

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    moto = Moto()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION,
                       "AWS_DEFAULT_REGION": REGION, "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_ENDPOINT_URL": moto.url})
    client = ClientProcess()
    prober = ClientProcess()
    workdir = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    postgres = None
    out = []
    try:
        for backend in args.backend:
            bucket = f"bench-{backend}"
            boto3.client("s3", endpoint_url=moto.url, region_name=REGION).create_bucket(Bucket=bucket)
            if backend == "postgresql":
                log("starting a throwaway PostgreSQL cluster ...")
                postgres = Postgres()
                catalog_url = postgres.url()
            else:
                catalog_url = f"sqlite:///{workdir / 'catalog.db'}"
            out.extend(await run_backend(backend, catalog_url, moto, client, prober, bucket, args, workdir))
    finally:
        client.stop()
        prober.stop()
        moto.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def machine() -> str:
    model = platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()} cores ({model}), Linux {platform.release()}, Python {platform.python_version()}; "
            f"load average before the run {load:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_remote", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, quick="64 MiB replay, 30 fetches per row",
                     smoke="8 MiB replay, 3 fetches per row, SQLite only (default backend)")
    parser.add_argument("--backend", action="append", choices=("sqlite", "postgresql"),
                        help="catalog backend (repeatable; default: both, sqlite only with --smoke; the replay runs "
                             "on the first)")
    parser.add_argument("--profile", action="store_true", help="cProfile the broker over warm fetches and a replay")
    parser.add_argument("--yield-off", action="store_true",
                        help="probe produce and tail latency once more during replays that do not give way to the "
                             "hot path (remote_read_yield_ms 0)")
    args = parser.parse_args(argv)
    args.size = size_of(args)
    args.backend = args.backend or (["sqlite"] if args.size is Size.SMOKE else ["sqlite", "postgresql"])
    args.replay_backend = args.backend[0]
    started = time.monotonic()
    print(f"remote fetch benchmark, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
    print(f"machine: {machine()}")
    print(f"command: python -m bench.bench_remote {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    for block in asyncio.run(main_async(args)):
        print()
        print(block)
    print(f"\ntook {time.monotonic() - started:.0f} s; load average after the run {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
