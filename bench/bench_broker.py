"""Broker throughput (issue 3): produce and consume on loopback, and the broker's CPU seconds per GB.

Workloads: 100-byte and 1 KiB messages (random, incompressible, uncompressed bundles) in bundles of 1, 100 and 1000
messages, one bundle per produce request, over one connection (partition 0) and over eight (one partition each).
Produce is closed-loop with requests pipelined: each connection keeps `window` requests in flight (at most
WINDOW_REQUESTS, and at most WINDOW_BYTES of requests). Consume keeps one request in flight per connection with a
4 MiB fetch size, and reads the partitions from their first seq to their hwmark over and over (page cache hot).

The topic has `produce.ack=local` (TANK's behaviour: answered after the local append). The broker is the real
`tiered serve` with its embedded defaults, so the block builder still uploads every record to the local-directory
store and commits it to SQLite in the background; that work is part of the broker's CPU time, and its admission
limit (8 blocks in flight) can push back on producers.

Each row also shows the load generator measured alone, against `bench.loadgen`'s null server with the same
connections and windows, and the cores the load generator, the broker and everything else on the machine used
during the measurement (the machine is shared: "other" is CPU that neither the broker nor the load generator used).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import format_table
from bench.harness import REPO, BrokerProcess, die_with_parent, free_port, process_cpu_s, self_cpu_s, wait_for_port
from bench.loadgen import ConsumeConn, ProduceConn, Shape, make_bundle, open_conn, produce_frame
from bench.sizes import Size

SHAPES = tuple(Shape(m, b) for m in (100, 1024) for b in (1, 100, 1000))
CONNECTIONS = (1, 8)
WINDOW_REQUESTS = 256
WINDOW_BYTES = 8 << 20
PARTITIONS = 8
CLOCK_TICKS = 100  # USER_HZ: /proc/stat counts in these


def window_for(frame_bytes: int) -> int:
    return max(2, min(WINDOW_REQUESTS, WINDOW_BYTES // frame_bytes))


def machine_busy_s() -> float:
    """CPU seconds every core spent busy so far (the first line of /proc/stat, all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS


@dataclass
class Measurement:
    messages: int
    value_bytes: int
    seconds: float
    server_cpu_s: float  # the broker's (or the null server's) CPU seconds
    loadgen_cpu_s: float
    other_cpu_s: float
    errors: int = 0
    first_error: str = ""
    latencies_s: list[float] | None = None

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / self.seconds / 1e6

    @property
    def cpu_s_per_gb(self) -> float:
        return self.server_cpu_s / (self.value_bytes / 1e9) if self.value_bytes else float("nan")

    def cores(self, cpu_s: float) -> float:
        return cpu_s / self.seconds


async def measure(conns, server_cpu, stop_after_s: float) -> tuple[float, float, float, float]:
    """Runs every connection until `stop_after_s` from now; returns (seconds, server CPU, load generator CPU,
    other CPU). Time runs until the last response of the last connection has arrived."""
    busy0, lg0, srv0 = machine_busy_s(), self_cpu_s(), server_cpu()
    t0 = time.monotonic()
    await asyncio.gather(*(c.run(t0 + stop_after_s) for c in conns))
    seconds = time.monotonic() - t0
    srv, lg = server_cpu() - srv0, self_cpu_s() - lg0
    other = max(0.0, machine_busy_s() - busy0 - srv - lg)
    return seconds, srv, lg, other


async def produce(port: int, topic: str, shape: Shape, conns: int, seconds: float, server_cpu, *,
                  window: int | None = None, warmup_s: float = 0.0, rate_per_s: float | None = None,
                  max_requests: int | None = None) -> Measurement:
    """Closed loop (or open loop at `rate_per_s`) for `seconds`; with `max_requests`, each connection also stops after
    that many requests (`seconds` is then a bound on the time)."""
    bundle = make_bundle(shape)
    frames = [produce_frame(topic, p, bundle) for p in range(conns)]
    window = window or window_for(len(frames[0]))
    rate = None if rate_per_s is None else rate_per_s / conns
    if warmup_s:
        warm = [await open_conn(lambda f=f: ProduceConn(f, shape.bundle_msgs, window=window), port) for f in frames]
        await asyncio.gather(*(c.run(time.monotonic() + warmup_s) for c in warm))
        for c in warm:
            c.transport.close()
    made = [await open_conn(lambda f=f: ProduceConn(f, shape.bundle_msgs, window=window, rate_per_s=rate,
                                                     max_requests=max_requests), port)
            for f in frames]
    try:
        elapsed, srv, lg, other = await measure(made, server_cpu, seconds)
    finally:
        for c in made:
            c.transport.close()
    messages = sum(c.stats.messages for c in made)
    errors = [c.stats for c in made if c.stats.errors]
    latencies = sorted(x for c in made for x in c.stats.latencies_s) if rate is not None else None
    return Measurement(messages, messages * shape.msg_bytes, elapsed, srv, lg, other,
                       sum(s.errors for s in errors), errors[0].first_error if errors else "", latencies)


async def consume(port: int, topic: str, shape: Shape, conns: int, seconds: float, server_cpu) -> Measurement:
    made = [await open_conn(lambda p=p: ConsumeConn(topic, p, shape.msg_bytes), port) for p in range(conns)]
    try:
        elapsed, srv, lg, other = await measure(made, server_cpu, seconds)
    finally:
        for c in made:
            c.transport.close()
    messages = sum(c.stats.messages for c in made)
    errors = [c.stats for c in made if c.stats.errors]
    return Measurement(messages, messages * shape.msg_bytes, elapsed, srv, lg, other,
                       sum(s.errors for s in errors), errors[0].first_error if errors else "")


async def create_topic(port: int, topic: str, partitions: int, config: dict[str, str]) -> None:
    from tiered.client import Client

    client = await Client.connect("127.0.0.1", port)
    try:
        await client.create_topic(topic, partitions, config)
    finally:
        await client.close()


class NullServerProcess:
    def __init__(self):
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "NullServerProcess":
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.loadgen", "null-server", "--port", str(self.port)],
                                     cwd=REPO, preexec_fn=die_with_parent)
        wait_for_port(self.port, self.proc, 30.0, "the null server", Path("/dev/null"))
        return self

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class Row:
    shape: Shape
    conns: int
    window: int
    broker: Measurement
    alone: Measurement


def _check(m: Measurement, what: str) -> None:
    if m.errors:
        raise RuntimeError(f"{what}: {m.errors} failed requests, the first: {m.first_error}")
    if not m.messages:
        raise RuntimeError(f"{what}: nothing was acknowledged")


async def run(size: Size, profile_dir: Path | None = None, log=print) -> dict:
    produce_s, consume_s, alone_s, warmup_s = size.pick((3.0, 2.0, 1.0, 0.5), (0.8, 0.5, 0.4, 0.2),
                                                        (0.2, 0.2, 0.1, 0.0))
    # The smoke size: one shape and one connection count, every step once.
    shapes, connections = size.pick((SHAPES, CONNECTIONS), (SHAPES, CONNECTIONS), (SHAPES[1:2], CONNECTIONS[:1]))
    produce_rows: list[Row] = []
    consume_rows: list[Row] = []
    null = NullServerProcess().start()
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-broker-"))
    try:
        for shape in shapes:
            topic = f"m{shape.msg_bytes}b{shape.bundle_msgs}"
            profile = profile_dir / f"broker-{topic}.prof" if profile_dir else None
            broker = BrokerProcess(root / topic / "data", profile_path=profile).start()
            try:
                await create_topic(broker.port, topic, PARTITIONS, {"produce.ack": "local"})
                for conns in connections:
                    where = f"{shape.label}, {conns} connection(s)"
                    window = window_for(len(produce_frame(topic, 0, make_bundle(shape))))
                    log(f"  produce {where} ...")
                    p = await produce(broker.port, topic, shape, conns, produce_s, broker.cpu_s, warmup_s=warmup_s)
                    _check(p, f"produce {where}")
                    p_alone = await produce(null.port, topic, shape, conns, alone_s, null.cpu_s)
                    _check(p_alone, f"produce {where} against the null server")
                    produce_rows.append(Row(shape, conns, window, p, p_alone))
                    log(f"  consume {where} ...")
                    c = await consume(broker.port, topic, shape, conns, consume_s, broker.cpu_s)
                    _check(c, f"consume {where}")
                    c_alone = await consume(null.port, topic, shape, conns, alone_s, null.cpu_s)
                    _check(c_alone, f"consume {where} against the null server")
                    consume_rows.append(Row(shape, conns, 1, c, c_alone))
                # Each consumer asks for seq 0 once; anything more read from the bucket is worth knowing about.
                remote_gets = broker.metrics().get("tiered_remote_gets_total", 0)
                if remote_gets > sum(connections):
                    log(f"  note: {remote_gets:.0f} consume requests of {topic} were served from the object store")
            finally:
                broker.stop()
                shutil.rmtree(root / topic, ignore_errors=True)
    finally:
        null.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {"produce": produce_rows, "consume": consume_rows}


HEADERS = ("workload", "conns", "window", "msgs/s", "MB/s", "broker cores", "CPU s/GB", "CPU µs/req",
           "loadgen cores", "other cores", "loadgen alone msgs/s", "alone MB/s")


def table_rows(rows: list[Row], per_request: bool) -> list[list]:
    """`per_request`: broker CPU per request (one bundle each), for produce; consume rows show "-" there."""
    out = []
    for r in rows:
        b, a = r.broker, r.alone
        us_per_request = b.server_cpu_s / (b.messages / r.shape.bundle_msgs) * 1e6 if per_request else "-"
        out.append([r.shape.label, r.conns, r.window, b.msgs_per_s, b.mb_per_s, b.cores(b.server_cpu_s),
                    b.cpu_s_per_gb, us_per_request, b.cores(b.loadgen_cpu_s), b.cores(b.other_cpu_s), a.msgs_per_s,
                    a.mb_per_s])
    return out


def report(results: dict) -> str:
    return "\n\n".join((
        format_table(HEADERS, table_rows(results["produce"], True),
                     "Produce, produce.ack=local (MB = 10^6 bytes of message content; window = requests in flight "
                     "per connection)"),
        format_table(HEADERS, table_rows(results["consume"], False),
                     "Consume, 4 MiB fetches, one request in flight per connection"),
    ))
