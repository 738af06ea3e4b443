"""Key compaction benchmark (issue 15, local half): throughput of a pass over sealed segments and the space it
reclaims, on workloads with 10% distinct keys.

    python -m bench.bench_compaction            128 MiB of sealed history per workload (about 3 minutes)
    python -m bench.bench_compaction --quick    16 MiB per workload
    python -m bench --only compaction [--quick | --smoke]

Each workload writes a partition directly with tiered.storage.PartitionLog (no broker: the pass is what is
measured), `log.segment.bytes=32mb`, bundles of 100 messages produced as TANK's client would (snappy when it
chooses so), as many messages as `--mib` holds uncompressed, keys drawn uniformly from a pool of one tenth of
the message count: every key has ten versions on average, and a pass keeps about 10% of the messages. Then one
`compact_partition` pass runs, timed, in this process (the server runs it the same way, in a worker thread).
Workloads:
- 100 B values, random bytes (incompressible: bundles stay uncompressed);
- 100 B values of text (TANK's client compresses bundles over 1 KiB: every bundle is snappy);
- 1 KiB values, random bytes;
- a second pass over the first workload after 10% more messages (same keys): the compacted part is read again,
  and 10% of it is superseded by the new messages.
MB/s is input bytes (sealed segments and their indexes) per second of wall time. The directory's size is sampled
before every step of the pass (one of them is the moment a group's output is complete and its input still there):
"peak growth" is its largest growth over its size before the pass; "group extra" the largest growth during one
group over that group's input bytes (the bound is 1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import format_table
from bench.sizes import add_size_options, size_of
from tiered.protocol.bundle import Message, decode_bundle, encode_bundle, maybe_record
from tiered.storage import PartitionLog, TopicConfig
from tiered.storage.compaction import compact_partition

SEGMENT_BYTES = 32 << 20
PER_BUNDLE = 100
MESSAGE_OVERHEAD = 24  # bytes of an uncompressed message besides its value: flags, timestamp, 12-byte key, length
NOW = 1_800_000_000.0
CONFIG = TopicConfig(log_segment_bytes=SEGMENT_BYTES, log_cleanup_policy="cleanup", produce_ack="local")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Result:
    workload: str
    messages_in: int
    messages_out: int
    segments_in: int
    segments_out: int
    bytes_in: int
    bytes_out: int
    seconds: float
    cpu_seconds: float
    peak_growth_bytes: int  # the directory's largest growth over its size before the pass
    group_extra: float  # the largest (directory growth during one group) / (that group's input bytes)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 1e6 / self.seconds

    @property
    def reclaimed(self) -> float:
        return 1 - self.bytes_out / self.bytes_in



def text_value(rng: random.Random, size: int) -> bytes:
    words = b"user order item price status shipped pending region eu us cart total id".split()
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + b"=%d;" % rng.randrange(10_000)
    return bytes(out[:size])


def fill(partition: PartitionLog, messages: int, keys: int, value_bytes: int, text: bool, rng: random.Random) -> None:
    """Appends `messages` messages with keys drawn from `keys` keys, in bundles of PER_BUNDLE, and seals."""
    ts = 1_700_000_000_000
    for _ in range(0, messages, PER_BUNDLE):
        bundle = []
        for _ in range(PER_BUNDLE):
            value = text_value(rng, value_bytes) if text else rng.randbytes(value_bytes)
            bundle.append(Message(value, b"key-%08d" % rng.randrange(keys), ts))
            ts += 1
        partition.append(encode_bundle(bundle))
    partition.seal_active()


def directory_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def one_pass(name: str, partition: PartitionLog) -> Result:
    start = directory_bytes(partition.directory)
    peak = [0]
    group = {"start": 0, "input": 1, "extra": 0.0}

    def sample(step: str) -> None:
        size = directory_bytes(partition.directory)
        peak[0] = max(peak[0], size - start)
        if step.startswith("write "):
            base, last = map(int, step.split()[1].split("-"))
            group["start"] = size
            group["input"] = sum(s.size + s.index.size_bytes for s in partition.segments if base <= s.base <= last)
        group["extra"] = max(group["extra"], (size - group["start"]) / group["input"])

    messages_in = sum(1 for _ in _messages(partition))
    segments_in = len(partition.segments)
    bytes_in = _sealed_bytes(partition)
    started, cpu = time.perf_counter(), time.process_time()
    report = compact_partition(partition, NOW, force=True, on_step=sample)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    if report.stopped or report.skipped:
        raise RuntimeError(f"{name}: the pass did not complete: {report.stopped or report.skipped}")
    return Result(name, messages_in, sum(1 for _ in _messages(partition)), segments_in, len(partition.segments),
                  bytes_in, _sealed_bytes(partition), seconds, cpu_seconds, peak[0], group["extra"])


def _sealed_bytes(partition: PartitionLog) -> int:
    return sum(s.size + s.index.size_bytes for s in partition.segments)


def _messages(partition: PartitionLog):
    last = partition.segments[-1].last
    for record in partition.iter_records(partition.first_available, last):
        start, end = maybe_record(record.record)
        yield from decode_bundle(record.record[start:end], record.first_seq)


def run(total_bytes: int, root: Path) -> list[Result]:
    results = []
    workloads = (
        ("100 B random values", 100, False),
        ("100 B text values (snappy)", 100, True),
        ("1 KiB random values", 1024, False),
    )
    for i, (name, value_bytes, text) in enumerate(workloads):
        directory = str(root / f"w{i}")
        partition = PartitionLog.open(directory, CONFIG)
        messages = total_bytes // (value_bytes + MESSAGE_OVERHEAD) // PER_BUNDLE * PER_BUNDLE
        keys = messages // 10
        log(f"compaction: writing {messages} messages for {name} ...")
        fill(partition, messages, keys, value_bytes, text, random.Random(i))
        log(f"compaction: {name}: one pass over {len(partition.segments)} segments ...")
        results.append(one_pass(name, partition))
        if i == 0:
            fill(partition, messages // 10, keys, value_bytes, text, random.Random(99))
            log("compaction: second pass after 10% more history ...")
            results.append(one_pass("second pass, +10% history", partition))
        partition.close()
        shutil.rmtree(directory, ignore_errors=True)
    return results


def report(results: list[Result], total_bytes: int) -> str:
    title = (f"Key compaction: {total_bytes >> 20} MiB of sealed segments per workload, 10% distinct keys, "
             f"{SEGMENT_BYTES >> 20} MiB segments; {os.cpu_count()} cores")
    return format_table(
        ("workload", "MB in", "MB out", "reclaimed", "messages in", "messages out", "segments", "seconds",
         "MB/s in", "CPU s", "peak growth MB", "group extra"),
        [(r.workload, r.bytes_in / 1e6, r.bytes_out / 1e6, f"{r.reclaimed:.1%}", r.messages_in, r.messages_out,
          f"{r.segments_in} -> {r.segments_out}", r.seconds, r.mb_per_s, r.cpu_seconds, r.peak_growth_bytes / 1e6,
          f"{r.group_extra:.3f}")
         for r in results],
        title,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_compaction", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, quick="16 MiB per workload", smoke="1 MiB per workload")
    parser.add_argument("--mib", type=int, help="MiB of sealed history per workload (default 128, 16 with --quick, 1 with --smoke)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    size = size_of(args)
    total = (args.mib or size.pick(128, 16, 1)) << 20
    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="tiered-bench-compaction-"))
    try:
        results = run(total, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(results, total))
    print(f"load average before the run: {load:.2f}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "mb_per_s": r.mb_per_s, "reclaimed": r.reclaimed}
                                         for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
