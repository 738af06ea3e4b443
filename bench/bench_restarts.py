"""The first remote fetch after a restart, over many restarts (issue 14, "no cold start").

    python -m bench.bench_restarts                  24 restarts, the broker as it is
    python -m bench.bench_restarts --no-freeze      the same without the heap's settle (tiered/heap.py)
    python -m bench.bench_restarts --quick | --smoke   8 restarts | 1 restart after 9 MiB (every step once)

bench.bench_remote's setup at a smaller size: moto in a child process, the broker in this one, the measuring client
in another. A topic of 4 MiB segments is produced and its sealed segments copied; then, each time, the broker is
stopped, its data directory emptied and the broker started again, and one fetch is made of a seq that only the block
runs hold (the first fetch after the restart), then a second one. Each first fetch is shown with the catalog query
and the GETs it made, and how long each took. The stall this was written to find is the cyclic garbage collector's
full pass over the start-up heap falling on the first request, which the heap's settle at start prevents: it depends on when the
collector's threshold is crossed, so compare series of the same length, run one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import bench_remote as br
from bench import format_table
from bench.remote_processes import ClientProcess, Moto
from bench.sizes import add_size_options, size_of

BUCKET = "bench-restarts"


class Steps:
    """The catalog reads and range GETs of the remote reader, timed (their bound methods wrapped on the instances)."""

    def __init__(self, app) -> None:
        self.taken: list[tuple[str, float]] = []
        catalog, store = app.tier.catalog, app.tier.remote.reader.store
        self._wrap(catalog, "read", lambda fn, *a, **k: f"query {getattr(fn, '__name__', fn)}")
        for name in ("get_range", "read_range_into"):
            self._wrap(store, name, lambda *a, _name=name, **k: _name)

    def _wrap(self, owner, name: str, label) -> None:
        method = getattr(owner, name)

        async def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                self.taken.append((label(*args, **kwargs), time.perf_counter() - started))
        setattr(owner, name, timed)


async def run(args) -> list[float]:
    import boto3

    if args.no_freeze:
        import tiered.heap

        tiered.heap.Heap.settle = lambda self, why: None  # type: ignore[method-assign]
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    moto = Moto()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": br.REGION,
                       "AWS_DEFAULT_REGION": br.REGION, "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_ENDPOINT_URL": moto.url})
    client = ClientProcess()
    workdir = Path(tempfile.mkdtemp(prefix="bench-restarts-"))
    firsts: list[float] = []
    try:
        boto3.client("s3", endpoint_url=moto.url, region_name=br.REGION).create_bucket(Bucket=BUCKET)
        catalog_url, data = f"sqlite:///{workdir / 'catalog.db'}", workdir / "data"
        app = await br.start_broker(data, catalog_url, BUCKET)
        await br.produce_and_tier(app, client, br.TOPIC, br.LATENCY_CONFIG, args.mib << 20)
        # Seqs of the old active segment, which no remote segment holds: only the block runs have them.
        first = max(r.last_seq for r in await br.copied_segments(app, br.TOPIC)) + 1
        last = max(first, app.broker.registry.get(br.TOPIC, 0).hwmark - br.MSGS_PER_FETCH)
        rng = random.Random(3)
        for i in range(args.restarts):
            await app.stop()
            shutil.rmtree(data)
            started = time.perf_counter()
            app = await br.start_broker(data, catalog_url, BUCKET)
            start_s = time.perf_counter() - started
            await client.call("connect", app.broker.port)
            steps = Steps(app)  # what the fetch made, and what ran beside it (the coordinator's first reads)
            row = br.Row("first after restart")
            await br.fetch_into(row, app, client, rng.randint(first, last))
            taken = list(steps.taken)
            await br.fetch_into(row, app, client, rng.randint(first, last))
            firsts.append(row.ttfb_s[0])
            parts = ", ".join(f"{label} {br.ms(s)}" for label, s in taken)
            print(f"restart {i + 1:>2}: started in {br.ms(start_s)} ms; first fetch {br.ms(row.ttfb_s[0])} ms "
                  f"({parts}); second {br.ms(row.ttfb_s[1])} ms", flush=True)
        await app.stop()
    finally:
        client.stop()
        moto.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return firsts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_restarts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restarts", type=int, help="default 24, 8 with --quick, 1 with --smoke")
    parser.add_argument("--mib", type=int, help="MiB produced before the restarts (default 12, 9 with --smoke: two "
                                                "sealed 4 MiB segments)")
    parser.add_argument("--no-freeze", action="store_true", help="start without the heap's settle")
    add_size_options(parser, quick="8 restarts", smoke="1 restart after 9 MiB")
    args = parser.parse_args(argv)
    size = size_of(args)
    args.restarts = args.restarts or size.pick(24, 8, 1)
    args.mib = args.mib or size.pick(12, 12, 9)
    print(f"first fetch after a restart, {time.strftime('%Y-%m-%d %H:%M %Z')}; load average {os.getloadavg()[0]:.2f}"
          f"{'; without the heap settle' if args.no_freeze else ''}")
    firsts = asyncio.run(run(args))
    print(format_table(("restarts", "first byte p50 ms", "p90 ms", "max ms"),
                       [(len(firsts), br.ms(br.quantile(firsts, .5)), br.ms(br.quantile(firsts, .9)),
                         br.ms(max(firsts)))]))
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
