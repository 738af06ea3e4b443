"""User-space instructions per produce request (issue 13): the append path's cost in a unit the machine does not move.

    python -m bench.bench_instructions [--quick | --smoke] [--tree PATH] [--server NAME ...] [--workload LABEL ...]
                                       [--repeats N]

CPU seconds per request differ by 3x between the VMs this project runs on (an AMD EPYC then, a 2.1 GHz Xeon now) for
the same code, so CPU figures of different sessions cannot be compared. Instructions executed can: each server runs
under `valgrind --tool=callgrind` and the figure is callgrind's Ir (instructions executed in user space, every thread
of the process) per produce request, and per GB of message content for bundles of 100. Kernel work (the socket, the
file writes, the page cache) is not counted: a figure here is the Python and C the process runs, not its whole cost.

Workloads are bench/bench_append.py's: 100 B x1 (window 256), 100 B x100 and 1 KiB x100 (window 64), one connection,
`produce.ack=local`. Servers: the whole broker (`tiered serve` on its embedded defaults), the broker without its
tiering layer (bench/local_broker.py), and bench/floor_server.py's asyncio and blocking floors.

Per server process: valgrind starts it with instrumentation off (`--instr-atstart=no`: start-up runs ~5x slower
instead of ~50x, and nothing before the measurement is counted), a warm-up of requests, instrumentation on
(`callgrind_control -i on`); then, `repeats` times: the counters zeroed (`-z`), a fixed number of requests, a settle
pause, a dump (`-d`), whose `summary:` line is the Ir of that window. The settle pause (also before the first window)
lets the blocks holding the window's records close (at `block_max_age_ms`, 250 ms) and be uploaded and committed
inside the window, so a whole-broker figure holds the tiering layer's work for its own records. Idle work is counted
too: the whole broker's cluster coordinator ticks every 250 ms of wall time with catalog reads, ~10^7 instructions a
second, and under valgrind a window lasts seconds, so in a 1-message window about a quarter of the count is that idle
work and none of it is per request. Hence two figures. "instr/request" is the window's whole count over its requests.
"net of idle" subtracts, from each counted window, the idle work of its wall length: each counted window has an idle
twin of the same length measured right after it (after a settle of its own, so the counted window's last block
commit is not in it), and the rate subtracted is the median of the twins' (instructions per second of wall time), so
a twin that caught a late commit or a slow tick moves no figure by itself; the net figure is the median of the
windows', and its spread is printed ("net spread %") to say whether the goal can be decided from it. That is the
background work that runs whether or not requests come. The catalog statements of both windows are printed (counted window / its idle twin)
to show the background ran at the same pace in both: the ticks are timers on the event loop and the catalog's thread,
so a loaded loop runs them late, not less often, as long as the window is seconds long. An earlier version took one
idle window after the warm-up and subtracted its rate; it held the warm-up's last commits and came out below the
broker without tiering, which is impossible. The net figure still holds the window's own blocks (upload, commit,
their catalog statements): that work is the requests'.

Caveat for the whole broker: blocks close by age, and under valgrind the broker runs ~50x slower, so a block holds
fewer requests than at full speed and the per-block work (upload, catalog commit) weighs more per request than it
does natively. The number of blocks in each window is printed (read from GET /metrics outside the counted window):
compare whole-broker figures only at similar requests per block.

`--smoke` counts one window of 50 requests of the first workload on the whole broker only (unless `--server` says
otherwise), after a warm-up of 50: every step once, figures that mean nothing.

`--keep DIR` copies each server's callgrind dumps (one per window, counted and idle, in the order taken) to
DIR/<workload>-<server>/ before its temporary directory is removed: where the instructions go, by function, is then
`callgrind_annotate --inclusive=yes DIR/.../callgrind.out.<pid>.<n>`.

`--tree PATH` runs the brokers from another checkout of this repository (working directory and PYTHONPATH; its
native extensions must be built): the before/after of a change, in instructions. The floor servers are always this
tree's. The spread is (max - min) / min over the `repeats` windows of one process.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import format_table
from bench.bench_broker import create_topic, produce
from bench.floor_server import MODES, FloorProcess
from bench.harness import REPO, BrokerProcess
from bench.loadgen import Shape
from bench.sizes import Size, add_size_options, cannot_run, size_of

SERVERS = ("whole", "no tiering", *(f"floor: {m}" for m in MODES if m != "null"))


@dataclass(frozen=True)
class Workload:
    shape: Shape
    window: int
    requests: int  # counted per window
    quick_requests: int

    @property
    def per_request_only(self) -> bool:
        return self.shape.bundle_msgs == 1


WORKLOADS = (
    Workload(Shape(100, 1), 256, 2000, 600),
    Workload(Shape(100, 100), 64, 300, 100),
    Workload(Shape(1024, 100), 64, 300, 100),
)
WARMUP_REQUESTS = 300
SMOKE_REQUESTS = 50  # per window and for the warm-up
SETTLE_S = 1.5  # wall time: more than block_max_age_ms (250 ms) plus an upload and commit at valgrind's speed
START_TIMEOUT_S = 300.0

# PYTHONHASHSEED fixed: str hashes (dict and set layouts, so probe counts) are otherwise random per process, and two
# processes of the same code would differ by that alone. PYTHONMALLOC is left to pymalloc, what the broker runs on:
# with PYTHONMALLOC=malloc the counts were no steadier (both within 1% over repeated windows, see docs/benchmarks.md)
# and glibc's malloc replaced pymalloc's cheaper paths, so the figure would measure an allocator nobody runs.
SERVER_ENV = {"PYTHONHASHSEED": "0"}


def valgrind_command(out_dir: Path) -> list[str]:
    """callgrind with instrumentation off until `callgrind_control -i on`; all threads in one count
    (`--separate-threads=no`); children not traced (the servers start none)."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=no", "--trace-children=no",
            f"--callgrind-out-file={out_dir}/callgrind.out", "--dump-instr=no", "--compress-strings=no",
            "--log-file=" + str(out_dir / "valgrind.log")]


def callgrind_control(pid: int, *args: str) -> None:
    done = subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or "Error" in done.stdout:
        raise RuntimeError(f"callgrind_control {' '.join(args)} {pid}: {done.stdout}{done.stderr}")


def dumped_ir(out_dir: Path, before: set[Path]) -> int:
    """Ir of the one dump file written since `before` (its `summary:` line, else `totals:`)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(out_dir.glob("callgrind.out*")) - before
        for path in new:
            text = path.read_text(errors="replace")
            found = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
            if found:
                return int(found.group(1))
        time.sleep(0.2)
    raise RuntimeError(f"no callgrind dump appeared in {out_dir}")


@dataclass
class Window:
    ir: int
    requests: int
    blocks: float  # blocks uploaded during the window (NaN: not a whole broker)
    seconds: float  # wall time from the zeroing to the dump
    idle_ir: int = 0  # Ir of the idle window of the same length measured right after it
    statements: float = float("nan")  # catalog statements in the window (NaN: not a whole broker)
    idle_statements: float = float("nan")  # ... and in its idle twin


@dataclass
class Result:
    workload: Workload
    server: str
    windows: list[Window] = field(default_factory=list)

    def per_request(self) -> list[float]:
        return [w.ir / w.requests for w in self.windows]

    def idle_rate(self) -> float:
        """The idle work's instructions per second of wall time: the median over the windows' idle twins, so that one
        twin holding a late commit or a slow coordinator tick does not move every figure."""
        return statistics.median(w.idle_ir / w.seconds for w in self.windows)

    def net_per_request(self) -> list[float]:
        """Each window less the idle work of its length (at the median idle rate), per request."""
        rate = self.idle_rate()
        return [(w.ir - rate * w.seconds) / w.requests for w in self.windows]


def _counters(server) -> tuple[float, float]:
    """(blocks uploaded, catalog statements) so far; NaN for a server that is not a whole broker. Read outside the
    counted windows: GET /metrics is work of the broker too."""
    if not isinstance(server, BrokerProcess) or server.program != ["tiered.cli.main", "serve"]:
        return float("nan"), float("nan")
    metrics = server.metrics()
    return (metrics.get("tiered_blocks_uploaded_total", float("nan")),
            metrics.get("tiered_catalog_statements_total", float("nan")))


def _dump(pid: int, out_dir: Path) -> int:
    """Dumps the counters and returns the Ir counted since they were last zeroed."""
    before = set(out_dir.glob("callgrind.out*"))
    callgrind_control(pid, "--dump")
    return dumped_ir(out_dir, before)


async def measure(w: Workload, server_name: str, tree: Path, root: Path, size: Size, repeats: int, log) -> Result:
    out_dir = root / "callgrind"
    out_dir.mkdir(parents=True)
    wrapper = valgrind_command(out_dir)
    topic = "instr"
    server: BrokerProcess | FloorProcess
    if server_name.startswith("floor: "):
        server = FloorProcess(root / "floor", server_name.removeprefix("floor: "), wrapper,
                              SERVER_ENV).start(timeout_s=START_TIMEOUT_S)
    else:
        server = BrokerProcess(root / "data", env=SERVER_ENV, local_only=server_name == "no tiering", tree=tree,
                               wrapper=wrapper).start(timeout_s=START_TIMEOUT_S)
        await create_topic(server.port, topic, 1, {"produce.ack": "local"})
    result = Result(w, server_name)
    count = size.pick(w.requests, w.quick_requests, SMOKE_REQUESTS)
    warmup = size.pick(WARMUP_REQUESTS, WARMUP_REQUESTS, SMOKE_REQUESTS)
    try:
        await _produce(server.port, topic, w, warmup)
        callgrind_control(server.pid, "--instr=on")
        await _produce(server.port, topic, w, min(warmup, count))  # freshly instrumented code, not counted
        await asyncio.sleep(SETTLE_S)
        for i in range(repeats):
            log(f"  {w.shape.label}, {server_name}: window {i + 1}/{repeats}, {count} requests ...")
            blocks0, statements0 = _counters(server)
            callgrind_control(server.pid, "--zero")
            started = time.monotonic()
            answered = await _produce(server.port, topic, w, count)
            await asyncio.sleep(SETTLE_S)
            seconds = time.monotonic() - started
            ir = _dump(server.pid, out_dir)
            blocks1, statements1 = _counters(server)
            # The idle twin: as long as the window, after a settle of its own (not counted).
            await asyncio.sleep(SETTLE_S)
            statements2 = _counters(server)[1]
            callgrind_control(server.pid, "--zero")
            started = time.monotonic()
            await asyncio.sleep(seconds)
            idle_seconds = time.monotonic() - started
            idle_ir = round(_dump(server.pid, out_dir) * seconds / idle_seconds)
            statements3 = _counters(server)[1]
            result.windows.append(Window(ir, answered, blocks1 - blocks0, seconds, idle_ir,
                                         statements1 - statements0, statements3 - statements2))
    finally:
        server.stop()
    return result


async def _produce(port: int, topic: str, w: Workload, requests: int) -> int:
    """`requests` produce requests, closed loop; the number answered (all of them, or an error)."""
    m = await produce(port, topic, w.shape, 1, 3600.0, lambda: 0.0, window=w.window, max_requests=requests)
    answered = m.messages // w.shape.bundle_msgs
    if m.errors or answered != requests:
        raise RuntimeError(f"{w.shape.label}: {answered} of {requests} requests answered, {m.errors} failed "
                           f"({m.first_error})")
    return answered


async def run(size: Size, tree: Path, servers: tuple[str, ...], repeats: int, log=print,
              workloads: tuple[str, ...] = (), keep: Path | None = None) -> list[Result]:
    results = []
    chosen = [w for w in WORKLOADS if w.shape.label in workloads] if workloads else list(WORKLOADS)
    for w in chosen[:1] if size is Size.SMOKE else chosen:
        for name in servers:
            root = Path(tempfile.mkdtemp(prefix="tiered-bench-instr-"))
            try:
                results.append(await measure(w, name, tree, root, size, repeats, log))
            finally:
                if keep is not None:
                    kept = keep / re.sub(r"[^A-Za-z0-9]+", "_", f"{w.shape.label}-{name}")
                    shutil.copytree(root / "callgrind", kept, dirs_exist_ok=True)
                    log(f"  callgrind dumps kept in {kept}")
                shutil.rmtree(root, ignore_errors=True)
    return results


HEADERS = ("workload", "window", "server", "requests", "instr/request", "spread %", "net of idle", "net spread %",
           "G instr/GB", "blocks", "statements", "idle Ir/s", "window s")


def spread(values: list[float]) -> float:
    """(max - min) / min, in percent."""
    return (max(values) - min(values)) / min(values) * 100 if min(values) > 0 else float("nan")


def report(results: list[Result], tree: Path) -> str:
    rows = []
    for r in results:
        w = r.workload
        per_request = r.per_request()
        median = statistics.median(per_request)
        nets = r.net_per_request()
        per_gb = "-" if w.per_request_only else median / (w.shape.bundle_msgs * w.shape.msg_bytes)  # = 10^9 instr per GB
        whole = r.windows[0].blocks == r.windows[0].blocks  # not NaN
        blocks = "/".join(f"{x.blocks:.0f}" for x in r.windows) if whole else "-"
        statements = ", ".join(f"{x.statements:.0f}/{x.idle_statements:.0f}" for x in r.windows) if whole else "-"
        rows.append([w.shape.label, w.window, r.server, r.windows[0].requests, median, spread(per_request),
                     statistics.median(nets), spread(nets), per_gb, blocks, statements, r.idle_rate(),
                     statistics.median(x.seconds for x in r.windows)])
    where = "" if tree == REPO else f", brokers from {tree}"
    return format_table(HEADERS, rows, "User-space instructions per produce request (callgrind Ir; kernel work not "
                        f"counted), produce.ack=local, 1 connection{where}; median of {len(results[0].windows)} "
                        "windows of one process, spread (max-min)/min; net of idle: each window less the idle work of "
                        "its length, at the median rate of the idle windows measured right after each; G instr/GB: 10^9 instructions per 10^9 bytes of message content "
                        "(whole count); blocks: uploaded in each window; statements: catalog statements in each "
                        "window / in its idle twin (whole broker)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_instructions", description=__doc__.split("\n\n")[0])
    add_size_options(parser, quick="fewer requests per window",
                     smoke="one window of 50 requests, the first workload, the whole broker only")
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout whose brokers run (default: this one)")
    parser.add_argument("--server", action="append", choices=SERVERS, help="only this server (repeatable)")
    parser.add_argument("--workload", action="append", choices=[w.shape.label for w in WORKLOADS],
                        help="only this workload (repeatable)")
    parser.add_argument("--repeats", type=int, help="counted windows per server process (default 3, 1 with --smoke)")
    parser.add_argument("--keep", type=Path, help="copy the callgrind dumps here (for callgrind_annotate)")
    args = parser.parse_args(argv)
    size = size_of(args)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        cannot_run("valgrind (with callgrind_control) is not installed")
    tree = args.tree.resolve()
    servers = tuple(args.server or (SERVERS[:1] if size is Size.SMOKE else SERVERS))
    repeats = max(1, args.repeats or size.pick(3, 3, 1))

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    print(report(asyncio.run(run(size, tree, servers, repeats, log, tuple(args.workload or ()),
                                 args.keep)), tree))
    return 0


if __name__ == "__main__":
    sys.exit(main())
