"""What writing a block's record bytes into the local-directory store costs, two ways (issue 26's third goal).

A block is its runs' record bytes back to back, then footer and trailer (docs/architecture.md, "Block layout"), and a
run is exactly a contiguous range of one segment file. So a block can be written either as the broker writes it now,
from the records the builder holds in memory (`LocalObjectStore.put` of the pieces: a copy into a page-aligned buffer,
then O_DIRECT writes and the fsync), or by the kernel from the segment files (`os.copy_file_range` of each run into the
block's file, the footer written after it, the same fsync and rename).

The segment file is written first and left in the page cache, as a segment is when its records' block is built a
quarter of a second later. Each block takes its runs from distinct offsets of the segment, none aligned to a page
(a run starts wherever the previous record ended). The two ways take turns for the rounds; each figure is the median
over rounds of the process's CPU (user + system, every thread) per GB of block bytes, and of the wall time per block.
The bytes of both files are compared once: they are the same block.

    python -m bench.bench_block_copy [--quick | --smoke] [--dir DIR]   # DIR: the store's filesystem (default: /tmp)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.sizes import add_size_options, cannot_run, size_of
from tiered.tiering.objects.local_store import LocalObjectStore

BLOCK_BYTES = 8 << 20  # block_max_bytes' default
FOOTER = bytes(range(256)) * 4  # a footer and trailer's worth of bytes; their content does not change the cost
RUN_SKEW = 123  # runs start off page boundaries, as records do


def runs_of(block: int, runs: int, segment_bytes: int) -> list[tuple[int, int]]:
    """(offset in the segment, length) of each run of block number `block`."""
    run_bytes = BLOCK_BYTES // runs
    per_block = runs * run_bytes + RUN_SKEW
    base = (block * per_block) % (segment_bytes - per_block)
    return [(base + RUN_SKEW + i * run_bytes, run_bytes) for i in range(runs)]


def copy_runs(segment_fd: int, runs: list[tuple[int, int]]) -> Callable[[int], None]:
    """The writer of a block's file from the segment by copy_file_range (the footer written after its runs)."""

    def write(fd: int) -> None:
        for offset, length in runs:
            src = offset
            left = length
            while left:
                n = os.copy_file_range(segment_fd, fd, left, src)
                if n == 0:
                    raise OSError("copy_file_range copied nothing: the segment is shorter than the run")
                src += n
                left -= n
        os.write(fd, FOOTER)

    return write


async def one_round(store: LocalObjectStore, segment: bytes, segment_fd: int, blocks: int, runs: int,
                    way: str, first_block: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of putting `blocks` blocks one way."""
    cpu = time.process_time()
    wall = time.perf_counter()
    view = memoryview(segment)
    for b in range(first_block, first_block + blocks):
        block_runs = runs_of(b, runs, len(segment))
        key = f"blocks/{way}-{b}"
        if way == "pieces":
            await store.put(key, [view[o:o + n] for o, n in block_runs] + [FOOTER])
        else:
            await asyncio.to_thread(store._write_atomically, store._path(key), copy_runs(segment_fd, block_runs))
        await store.delete_many([key])
    return time.process_time() - cpu, time.perf_counter() - wall


def same_bytes(store: LocalObjectStore, segment: bytes, segment_fd: int, runs: int) -> bool:
    async def both() -> bool:
        block_runs = runs_of(0, runs, len(segment))
        view = memoryview(segment)
        await store.put("check/pieces", [view[o:o + n] for o, n in block_runs] + [FOOTER])
        await asyncio.to_thread(store._write_atomically, store._path("check/copy"), copy_runs(segment_fd, block_runs))
        return (await store.get("check/pieces")) == (await store.get("check/copy"))

    return asyncio.run(both())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the segment and the store live")
    parser.add_argument("--runs", type=int, default=8, help="runs per block (partitions in a block)")
    add_size_options(parser, quick="64 MiB segment, 8 blocks a round, 3 rounds",
                     smoke="16 MiB segment, 1 block a round, 1 round")
    args = parser.parse_args()
    size = size_of(args)
    segment_mib = size.pick(256, 64, 16)
    blocks = size.pick(16, 8, 1)
    rounds = size.pick(6, 3, 1)
    if not hasattr(os, "copy_file_range"):
        cannot_run("os.copy_file_range is not available on this platform")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        segment = os.urandom(segment_mib << 20)
        segment_path = Path(tmp) / "segment.log"
        segment_path.write_bytes(segment)  # left in the page cache
        store = LocalObjectStore(Path(tmp) / "store")
        fd = os.open(segment_path, os.O_RDONLY)
        try:
            if not same_bytes(store, segment, fd, args.runs):
                raise SystemExit("the two ways wrote different bytes")
            results: dict[str, list[tuple[float, float]]] = {"pieces": [], "copy_file_range": []}
            block = 0
            for _ in range(rounds):
                for way in results:
                    results[way].append(asyncio.run(one_round(store, segment, fd, blocks, args.runs, way, block)))
                    block += blocks
        finally:
            os.close(fd)
    gb = blocks * (BLOCK_BYTES + len(FOOTER)) / 1e9
    print(f"blocks of {BLOCK_BYTES >> 20} MiB in {args.runs} runs, {blocks} blocks a round, {rounds} rounds, "
          f"store on {args.dir} (O_DIRECT: {store.direct_io})")
    print(f"{'way':<40} {'CPU s/GB':>9} {'ms/block':>9}")
    names = {"pieces": "as now: put of the pieces (aligned copy)", "copy_file_range": "copy_file_range from segment"}
    for way, rows in results.items():
        cpu = statistics.median(c for c, _ in rows) / gb
        wall = statistics.median(w for _, w in rows) / blocks * 1000
        print(f"{names[way]:<40} {cpu:>9.3f} {wall:>9.2f}")


if __name__ == "__main__":
    main()
