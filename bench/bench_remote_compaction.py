"""Remote compaction benchmark (issue 15, remote half): throughput of a pass over a partition's remote segments and
the space it reclaims in the bucket and the extra space it takes meanwhile, on a workload with 10% distinct keys
(`--distinct 0.9`: one where compaction removes little).

    python -m bench.bench_remote_compaction            64 MiB of history (about 15 seconds)
    python -m bench.bench_remote_compaction --quick    16 MiB
    python -m bench.bench_remote_compaction --distinct 0.9    keys drawn from 90% of the message count
    python -m bench --only remote_compaction [--quick | --smoke]

moto's S3 server runs in a child process (bench/remote_processes.Moto), the catalog is SQLite. The history is
written with tiered.storage.PartitionLog (`log.segment.bytes=8mb`, bundles of 100 messages of 100 B random values,
keys drawn uniformly from one tenth of the message count, or the share `--distinct` gives), then recorded as the
durable path and the copier leave it: a committed block run per segment, then each segment uploaded and
COPY_FINISHED. Two passes are timed, each on
its own copy of that history (two topics):
- from local copies: the local pass runs first (not timed here: bench_compaction measures it), then the remote
  pass uploads the compacted local segments and swaps them in (tiered.tiering.compaction.remote_compaction);
- from the bucket: the broker's disk holds none of it; the remote pass streams the remote segments (range GETs),
  learns the keys, then rewrites them group by group in its work directory, uploading each group's output and
  swapping it in before the next group starts (tiered.tiering.compaction.bucket_compaction).
MB/s is the remote bytes replaced (segment and index objects) per second of wall time; "reclaimed" is the share of
those bytes the compacted segments no longer take (once the old objects' grace period is over). `tiered catalog
check`'s consistency check runs after each pass and must find nothing.

Space during a pass, sampled at every step of it (before each group's write, each upload and each swap): "disk
peak" is the most the pass's work directory held; "disk / its group" the most it held over the input of the group
being written (the bound is 1.2); "bucket peak" the most the partition's segment objects in the bucket (listed) held
over what they held when the pass started, which is what the pass wrote while the objects it replaces still exist
(they wait for their grace period), also given over the bytes the pass rewrote (the bound is 1.2).
The listing at each swap costs a few milliseconds, counted in the pass's time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench import format_table
from bench.bench_compaction import MESSAGE_OVERHEAD, NOW, PER_BUNDLE, fill, log
from bench.remote_processes import Moto
from bench.sizes import add_size_options, size_of
from tiered.catalog import Catalog
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import RunRow
from tiered.catalog.check import check_partition
from tiered.catalog.compaction import readable_segments
from tiered.catalog.migrate import upgrade
from tiered.catalog.segments import SegmentMeta
from tiered.storage import PartitionLog, TopicConfig
from tiered.storage.compaction import compact_partition
from tiered.tiering.objects import keys
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.compaction.remote_compaction import RemoteCompactor
from tiered.tiering.objects.s3_store import S3ObjectStore
from tiered.tiering.segments.segment_copier import segment_timestamp_bounds

REGION = "us-east-1"
SEGMENT_BYTES = 8 << 20
VALUE_BYTES = 100
CONFIG = TopicConfig(log_segment_bytes=SEGMENT_BYTES, log_cleanup_policy="cleanup", produce_ack="local")
BROKER = 1


@dataclass
class Result:
    source: str
    segments_in: int
    segments_out: int
    bytes_in: int
    bytes_out: int
    downloaded_bytes: int
    seconds: float
    cpu_seconds: float
    largest_group_bytes: int  # input of the largest group rewritten
    peak_disk_bytes: int
    disk_per_group: float  # the most the work directory held over the input of the group being written
    peak_bucket_bytes: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 1e6 / self.seconds

    @property
    def reclaimed(self) -> float:
        return 1 - self.bytes_out / self.bytes_in


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


class _Clock:
    def now_ms(self) -> float:
        return NOW * 1000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def copy_history(store: S3ObjectStore, cat: Catalog, topic: str, partition: PartitionLog) -> int:
    """What the durable path and the copier leave in the catalog and the bucket; returns the leader epoch."""
    catalog_topics.create_topic(cat, topic, 1, now=_at(NOW))
    epoch = catalog_partitions.claim_partitions(cat, BROKER, topic, [0])[0]
    committed = 0
    for s in partition.segments:
        block_id = catalog_blocks.insert_pending_block(cat, f"blocks/{topic}-{s.base}.blk", BROKER, 1, now=_at(NOW))
        run = RunRow(topic, 0, committed + 1, s.base, s.last, 1, 0, 0, epoch, 0, 1)
        catalog_blocks.commit_block(cat, block_id, BROKER, [run], {(topic, 0): epoch}, now=_at(NOW))
        committed = s.last
        low, high = segment_timestamp_bounds(s.path, s.base, s.size)
        meta = SegmentMeta(topic, 0, s.base, s.last, keys.segment_key(topic, 0, s.base, s.last, s.freeze_ts),
                           keys.segment_index_key(topic, 0, s.base, s.last, s.freeze_ts), s.size, s.index.size_bytes,
                           low, high, _at(s.freeze_ts), epoch)
        catalog_segments.segment_copy_started(cat, meta, now=_at(NOW))
        await store.put_file(meta.object_key, s.path)
        await store.put_file(meta.index_object_key, s.index_path)
        catalog_segments.segment_copy_finished(cat, topic, 0, s.base, epoch, now=_at(NOW))
    return epoch


class SpaceProbe:
    """The step hook of a pass: the work directory's bytes at every step, the partition's segment objects in the
    bucket at every swap (after the group's uploads, its peak), over the bytes there when the pass started."""

    def __init__(self, s3, topic: str, work: Path, rows: dict[int, int]):
        self.s3, self.work, self.rows = s3, work, rows
        self.prefix = f"tiered/{keys.partition_segments_prefix(topic, 0)}"
        self.baseline = self.bucket_bytes()
        self.largest_group = self.peak_disk = self.peak_bucket = self.group = 0
        self.disk_per_group = 0.0  # the most the work directory held over the input of the group being written

    def bucket_bytes(self) -> int:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=self.prefix)
        return sum(o["Size"] for page in pages for o in page.get("Contents", []))

    def __call__(self, step: str) -> None:
        kind, span = step.split(maxsplit=1)
        if kind in ("write", "swap"):
            base, last = map(int, span.split("-"))
            self.group = sum(b for s, b in self.rows.items() if base <= s <= last)
            self.largest_group = max(self.largest_group, self.group)
        if self.work.exists():
            disk = sum(f.stat().st_size for f in self.work.rglob("*") if f.is_file())
            self.peak_disk = max(self.peak_disk, disk)
            self.disk_per_group = max(self.disk_per_group, disk / self.group if self.group else 0.0)
        if kind == "swap":
            self.peak_bucket = max(self.peak_bucket, self.bucket_bytes() - self.baseline)


async def timed_pass(source: str, compactor: RemoteCompactor, cat: Catalog, topic: str, partition: PartitionLog,
                     epoch: int, s3) -> Result:
    rows = {r.base_seq: r.total_bytes for r in readable_segments(cat, topic, 0)}
    probe = SpaceProbe(s3, topic, Path(compactor.workdir) / f"{topic}.0", rows)
    started, cpu = time.perf_counter(), time.process_time()
    report = await compactor.compact(topic, 0, partition, epoch, force=True, on_step=probe)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    if report.stopped or not report.groups:
        raise RuntimeError(f"{source}: the pass did not complete: {report.stopped or 'no group swapped'}")
    problems = check_partition(cat, topic, 0).problems
    if problems:
        raise RuntimeError(f"{source}: the catalog check failed after the pass: {problems}")
    return Result(source, report.segments_before, report.segments_after, report.bytes_before, report.bytes_after,
                  report.downloaded_bytes, seconds, cpu_seconds, probe.largest_group, probe.peak_disk,
                  probe.disk_per_group, probe.peak_bucket)


async def run(total_bytes: int, root: Path, distinct: float = 0.1) -> list[Result]:
    import boto3

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    moto = Moto()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION,
                       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                       "AWS_EC2_METADATA_DISABLED": "true"})
    catalog_url = f"sqlite:///{root / 'catalog.db'}"
    upgrade(catalog_url)
    cat = Catalog.open(catalog_url)
    access = AsyncCatalog(cat)
    s3 = boto3.client("s3", endpoint_url=moto.url, region_name=REGION)
    s3.create_bucket(Bucket="bench")
    store = S3ObjectStore("bench", "tiered", endpoint_url=moto.url, region=REGION, path_style=True)
    compactor = RemoteCompactor(store, access, broker_id=BROKER, workdir=str(root / "work"), grace=timedelta(0),
                                clock=_Clock())
    results = []
    try:
        messages = total_bytes // (VALUE_BYTES + MESSAGE_OVERHEAD) // PER_BUNDLE * PER_BUNDLE
        local = PartitionLog.open(str(root / "local"), CONFIG)
        log(f"remote compaction: writing {messages} messages ...")
        fill(local, messages, max(1, int(messages * distinct)), VALUE_BYTES, False, random.Random(1))
        log(f"remote compaction: copying {len(local.segments)} segments to two topics ...")
        epochs = {topic: await copy_history(store, cat, topic, local) for topic in ("fromlocal", "frombucket")}
        compact_partition(local, NOW, force=True)
        log("remote compaction: from local copies ...")
        results.append(await timed_pass("from local copies", compactor, cat, "fromlocal", local, epochs["fromlocal"],
                                        s3))
        empty = PartitionLog.open(str(root / "empty"), CONFIG)
        log("remote compaction: from the bucket ...")
        results.append(await timed_pass("from the bucket", compactor, cat, "frombucket", empty, epochs["frombucket"],
                                        s3))
        local.close()
        empty.close()
    finally:
        await store.close()
        access.shutdown()
        cat.close()
        moto.stop()
    return results


def report(results: list[Result], total_bytes: int, distinct: float = 0.1) -> str:
    title = (f"Remote compaction: {total_bytes >> 20} MiB of history, {distinct:.0%} distinct keys, 100 B values, "
             f"{SEGMENT_BYTES >> 20} MiB segments, moto S3 (child process) and SQLite; {os.cpu_count()} cores")
    table = format_table(
        ("source", "MB in", "MB out", "reclaimed", "segments", "MB downloaded", "seconds", "MB/s in", "CPU s"),
        [(r.source, r.bytes_in / 1e6, r.bytes_out / 1e6, f"{r.reclaimed:.1%}", f"{r.segments_in} -> {r.segments_out}",
          r.downloaded_bytes / 1e6, r.seconds, r.mb_per_s, r.cpu_seconds) for r in results],
        title,
    )
    space = format_table(
        ("source", "largest group MB", "disk peak MB", "disk / its group", "bucket peak MB", "bucket peak / MB in"),
        [(r.source, r.largest_group_bytes / 1e6, r.peak_disk_bytes / 1e6, f"{r.disk_per_group:.3f}",
          r.peak_bucket_bytes / 1e6,
          f"{r.peak_bucket_bytes / r.bytes_in:.3f}") for r in results],
        "Extra space during the passes",
    )
    return f"{table}\n\n{space}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_remote_compaction", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, quick="16 MiB of history", smoke="1 MiB of history")
    parser.add_argument("--mib", type=int, help="MiB of history (default 64, 16 with --quick, 1 with --smoke)")
    parser.add_argument("--distinct", type=float, default=0.1, help="keys drawn from this share of the messages")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    size = size_of(args)
    total = (args.mib or size.pick(64, 16, 1)) << 20
    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-remote-compaction-"))
    try:
        results = asyncio.run(run(total, root, args.distinct))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(results, total, args.distinct))
    print(f"load average before the run: {load:.2f}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "mb_per_s": r.mb_per_s, "reclaimed": r.reclaimed}
                                         for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
