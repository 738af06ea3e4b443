"""Range reads of block runs by their bundle index (block format version 3; docs/architecture.md, data path step 6).

A run's bundle index lives in its block's footer, at the end of the object, and nowhere else: the catalog locates a
run (tiered.catalog.blocks.find_run, which also gives the object's size) and the footer locates its bundles, so
`tiered catalog rebuild` still restores everything from the bucket alone and no migration is needed. A reader GETs a
block's footer once (`read_footer`: the object's last TAIL_GUESS_BYTES, and a second GET only for a bigger footer)
and keeps the indexes of all its runs (`BlockIndexes`, in the remote reader's cache within the read budget); a block
of version 1 or 2 is remembered as having none, and its runs are read whole as before.

With the index, a fetch GETs `run_window`: from the entry at or before the seq to where any answer starting in the
bundle holding the seq must end. That bundle starts by the next entry, so the window reads at most one index interval
(INDEX_EVERY_BYTES) plus one bundle more than the answer, which ends as a whole-run read's does (trim_chunk's rule:
the last bundle ending within the fetch size of the answer's start, the first bundle whole).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tiered.catalog.blocks import RunLocation
from tiered.tiering.block_format import FOOTER_TRAILER_BYTES, RunIndex, block_tail_bytes, read_block_indexes

# One GET reads the footer of a block of up to ~40 runs with full indexes (8 MiB of records has ~128 entries of
# 3 to 5 bytes); a bigger footer takes a second GET of exactly its size.
TAIL_GUESS_BYTES = 4096
_HELD_BYTES_PER_ENTRY = 64  # what a cached index entry or run costs in memory, about: counted against the budget


@dataclass(frozen=True, slots=True)
class BlockIndexes:
    """The bundle index of each run of one block object, by the run's position (None: a block of version 1 or 2)."""

    by_position: dict[int, RunIndex | None]
    size_bytes: int  # memory held, roughly

    @classmethod
    def of(cls, indexes: dict[int, RunIndex | None]) -> BlockIndexes:
        entries = sum(len(index.seqs) for index in indexes.values() if index is not None)
        return cls(indexes, _HELD_BYTES_PER_ENTRY * (entries + len(indexes)))


async def read_footer(get: Callable[[str, int, int], Awaitable[bytes | None]], run: RunLocation) -> BlockIndexes | None:
    """The indexes of the runs of `run`'s block, from the object's tail (`get(key, start, end)` is a range GET that
    answers None for a missing object, then so does this). Raises ProtocolError for a footer that is not one."""
    size = run.block_size_bytes
    if size < FOOTER_TRAILER_BYTES:
        return BlockIndexes.of({})  # not a size a block can have: read the run whole, which checks its records
    tail = await get(run.object_key, size - min(size, TAIL_GUESS_BYTES), size)
    if tail is None:
        return None
    needed = block_tail_bytes(tail)
    if needed > len(tail) and needed <= size:
        tail = await get(run.object_key, size - needed, size)
        if tail is None:
            return None
    return BlockIndexes.of({row.position: index for row, index in read_block_indexes(tail, size)})


@dataclass(frozen=True, slots=True)
class RunWindow:
    """The range GET for a seq of a run, in positions relative to the run's start: [floor, end), floor an index entry
    whose bundle starts at floor_seq."""

    floor_seq: int
    floor: int
    end: int


def run_window(index: RunIndex, seq: int, fetch_size: int) -> RunWindow:
    """The GET window of `seq` in the run `index` describes.

    Entry i is the last whose seq is <= `seq` (entry 0, the run's start, for a seq in a jump before the run's first
    record). The bundle holding the seq (the first whose last seq is >= seq) starts at or after entry i and no later
    than entry i + 1, whose first seq is past the seq; so it ends by entry i + 2, and an answer starting there ends
    within `fetch_size` of entry i + 1 or with that bundle. When the seq is at or before entry i's seq, the bundle
    at entry i holds it: the answer starts at the floor and its first bundle ends by entry i + 1."""
    seqs, positions, size = index.seqs, index.positions, index.length_bytes
    i = max(bisect_right(seqs, seq) - 1, 0)
    floor, floor_seq = positions[i], seqs[i]
    next_entry = positions[i + 1] if i + 1 < len(positions) else size
    if seq <= floor_seq:
        return RunWindow(floor_seq, floor, min(size, max(floor + fetch_size, next_entry)))
    hold_end = positions[i + 2] if i + 2 < len(positions) else size
    return RunWindow(floor_seq, floor, min(size, max(next_entry + fetch_size, hold_end)))
