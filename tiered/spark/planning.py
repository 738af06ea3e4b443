"""Replay planning: catalog rows in, splits out. Pure: no catalog, no store, no Spark.

A replay of one partition reads two kinds of objects (docs/architecture.md "Replay on Spark"):
- remote segments (COPY_FINISHED), TANK `.ilog` files with their `.index`; everything at or below the partition's
  highest copied seq lives in them (runs are pruned only once a segment holding them is COPY_FINISHED);
- block runs, for the tail above the highest copied seq that is not sealed and copied yet.

The driver turns those rows into pieces, then packs consecutive pieces into splits, one Spark task each:
- a piece per remote segment, or, for a segment larger than `max_split_bytes`, one per byte window of it. A window
  is resolved at index entries by the executor that reads it (`resolve_segment_range`): window [a, b) reads the
  records from the first indexed record at or after a to the first indexed record at or after b, so the windows of a
  segment tile it exactly (no record read twice, none skipped) without the driver fetching any `.index` object;
- a piece per block run (runs are small: one per block, per partition);
- splits of about equal size, none above `max_split_bytes` (`_pack`): a Spark task costs time before it reads a
  byte (about 0.1 s for a Python data source task in local mode), so small segments and runs share a task rather
  than paying that each.

Every piece carries the exact seq window it contributes ([min_seq, max_seq], inclusive), so decoding keeps exactly
the wanted messages even where a run straddles the highest copied seq or two segments were to overlap. Seq and
time ranges prune segments and runs from their catalog min/max values before any byte is read.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tiered.protocol.errors import ProtocolError
from tiered.storage.index import SparseIndex

U64_MAX = (1 << 64) - 1
# The largest message timestamp (ms) a Spark timestamp (int64 microseconds) holds; above it the column is null, and
# a null timestamp is inside no time range (as Spark's comparisons with null are never true).
MAX_TIMESTAMP_MS = (2**63 - 1) // 1000
DEFAULT_MAX_SPLIT_BYTES = 128 << 20
MIN_SPLIT_BYTES = 4096


@dataclass(frozen=True, slots=True)
class SeqRange:
    """Seqs first..last, both inclusive. Empty when first > last."""

    first: int = 1
    last: int = U64_MAX

    @property
    def empty(self) -> bool:
        return self.first > self.last

    def narrow(self, first: int | None = None, last: int | None = None) -> SeqRange:
        return SeqRange(
            self.first if first is None else max(self.first, first),
            self.last if last is None else min(self.last, last),
        )

    def overlaps(self, first: int, last: int) -> bool:
        return first <= self.last and last >= self.first


@dataclass(frozen=True, slots=True)
class TimeRange:
    """Message timestamps in microseconds since the epoch, start inclusive, end exclusive (None: unbounded).

    Microseconds because Spark's timestamps and pushed filters are; the catalog and the bundles hold milliseconds.
    """

    start_us: int = 0
    end_us: int | None = None

    @property
    def empty(self) -> bool:
        return self.end_us is not None and self.end_us <= self.start_us

    @property
    def unbounded(self) -> bool:
        return self.start_us <= 0 and self.end_us is None

    def narrow(self, start_us: int | None = None, end_us: int | None = None) -> TimeRange:
        start = self.start_us if start_us is None else max(self.start_us, start_us)
        end = self.end_us
        if end_us is not None:
            end = end_us if end is None else min(end, end_us)
        return TimeRange(start, end)

    def overlaps_ms(self, min_ts_ms: int, max_ts_ms: int) -> bool:
        """Whether some timestamp in [min_ts_ms, max_ts_ms] (milliseconds) may fall in the range."""
        return max_ts_ms * 1000 >= self.start_us and (self.end_us is None or min_ts_ms * 1000 < self.end_us)

    def contains_ms(self, ts_ms: int) -> bool:
        if ts_ms > MAX_TIMESTAMP_MS:
            return False
        ts_us = ts_ms * 1000
        return ts_us >= self.start_us and (self.end_us is None or ts_us < self.end_us)


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """A COPY_FINISHED remote segment as the catalog lists it."""

    base_seq: int
    last_seq: int
    object_key: str
    index_object_key: str
    size_bytes: int
    min_ts_ms: int
    max_ts_ms: int


@dataclass(frozen=True, slots=True)
class RunEntry:
    """A committed block run as the catalog lists it."""

    first_seq: int
    last_seq: int
    object_key: str
    position: int
    length_bytes: int
    min_ts_ms: int
    max_ts_ms: int


@dataclass(frozen=True, slots=True)
class SegmentPiece:
    """Byte window [window_start, window_end) of a remote segment, resolved at index entries by the reader."""

    object_key: str
    index_object_key: str
    base_seq: int
    last_seq: int
    size_bytes: int
    window_start: int
    window_end: int
    min_seq: int  # exact seq window this piece contributes, inclusive
    max_seq: int

    @property
    def needs_index(self) -> bool:
        """Whether the reader must fetch the `.index` object: a partial window, or a seq window that lets it skip."""
        whole = self.window_start == 0 and self.window_end >= self.size_bytes
        return not whole or self.min_seq > self.base_seq or self.max_seq < self.last_seq

    @property
    def planned_bytes(self) -> int:
        return self.window_end - self.window_start


@dataclass(frozen=True, slots=True)
class RunPiece:
    """One block run: a single range GET of [position, position + length_bytes) of the block object."""

    object_key: str
    position: int
    length_bytes: int
    first_seq: int  # seq of the run's first message (its first bundle, when not sparse)
    min_seq: int
    max_seq: int

    @property
    def planned_bytes(self) -> int:
        return self.length_bytes


Piece = SegmentPiece | RunPiece


@dataclass(frozen=True, slots=True)
class Split:
    """One Spark task's work: pieces of one partition, in seq order."""

    topic: str
    partition: int
    pieces: tuple[Piece, ...]

    @property
    def planned_bytes(self) -> int:
        return sum(p.planned_bytes for p in self.pieces)

    @property
    def min_seq(self) -> int:
        return self.pieces[0].min_seq

    @property
    def max_seq(self) -> int:
        return self.pieces[-1].max_seq


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """What a reader fetches of a segment piece: bytes [start, end), whose first record holds seq `first_seq`."""

    start: int
    end: int
    first_seq: int


def plan_partition(
    topic: str,
    partition: int,
    segments: Iterable[SegmentEntry],
    runs: Iterable[RunEntry],
    copied_seq: int,
    seqs: SeqRange,
    times: TimeRange = TimeRange(),
    max_split_bytes: int = DEFAULT_MAX_SPLIT_BYTES,
) -> list[Split]:
    """The splits that read `seqs` of one partition, in seq order.

    `segments`: the partition's COPY_FINISHED segments (any order; those outside `seqs` are pruned here too).
    `runs`: its committed runs; only seqs above `copied_seq` (the highest seq held by a COPY_FINISHED segment) are
    read from them. Seq windows never overlap: a piece starts after the previous one's last seq.
    """
    if max_split_bytes < MIN_SPLIT_BYTES:
        raise ValueError(f"max split size must be at least {MIN_SPLIT_BYTES} bytes, not {max_split_bytes}")
    if seqs.empty or times.empty:
        return []
    pieces: list[Piece] = []
    next_seq = seqs.first  # the lowest seq no earlier piece covers
    for seg in sorted(segments, key=lambda s: s.base_seq):
        if seg.last_seq < next_seq or seg.base_seq > seqs.last:
            continue
        if not times.overlaps_ms(seg.min_ts_ms, seg.max_ts_ms):
            continue
        low, high = max(next_seq, seg.base_seq), min(seqs.last, seg.last_seq)
        for start, end in _windows(seg.size_bytes, max_split_bytes):
            pieces.append(SegmentPiece(
                seg.object_key, seg.index_object_key, seg.base_seq, seg.last_seq, seg.size_bytes, start, end, low, high
            ))  # fmt: skip
        next_seq = high + 1
    next_seq = max(next_seq, copied_seq + 1)
    for run in sorted(runs, key=lambda r: r.first_seq):
        if run.last_seq < next_seq or run.first_seq > seqs.last:
            continue
        if not times.overlaps_ms(run.min_ts_ms, run.max_ts_ms):
            continue
        piece = RunPiece(
            run.object_key, run.position, run.length_bytes, run.first_seq,
            max(next_seq, run.first_seq), min(seqs.last, run.last_seq),
        )  # fmt: skip
        pieces.append(piece)
        next_seq = piece.max_seq + 1
    return [Split(topic, partition, group) for group in _pack(pieces, max_split_bytes)]


def _pack(pieces: Sequence[Piece], max_split_bytes: int) -> list[tuple[Piece, ...]]:
    """Consecutive pieces in groups of about equal size, none above max_split_bytes unless one piece alone is.

    The fewest groups that fit are ceil(total / max_split_bytes); a piece joins the group its middle byte falls in
    when the bytes are cut into that many equal shares, and a group that would pass max_split_bytes ends early.
    """
    total = sum(p.planned_bytes for p in pieces)
    share = total / max(1, -(-total // max_split_bytes))
    groups: list[tuple[Piece, ...]] = []
    group: list[Piece] = []
    group_bytes = position = 0
    group_share = -1
    for piece in pieces:
        size = piece.planned_bytes
        piece_share = int((position + size / 2) // share) if share else 0
        if group and (group_bytes + size > max_split_bytes or piece_share != group_share):
            groups.append(tuple(group))
            group, group_bytes = [], 0
        if not group:
            group_share = piece_share
        group.append(piece)
        group_bytes += size
        position += size
    if group:
        groups.append(tuple(group))
    return groups


def _windows(size_bytes: int, max_split_bytes: int) -> list[tuple[int, int]]:
    """[start, end) windows of equal size tiling [0, size_bytes), none larger than max_split_bytes."""
    count = max(1, -(-size_bytes // max_split_bytes))
    return [(k * size_bytes // count, (k + 1) * size_bytes // count) for k in range(count)]


def load_segment_index(data: bytes, piece: SegmentPiece) -> SparseIndex:
    """The `.index` object of `piece`'s segment, checked against the segment (ProtocolError if it does not fit)."""
    try:
        index, partial = SparseIndex.from_bytes(data)
    except ValueError as exc:
        raise ProtocolError(f"index {piece.index_object_key}: {exc}") from None
    if partial:
        raise ProtocolError(f"index {piece.index_object_key} ends with a partial entry of {partial} bytes")
    last = index.last()
    if last is not None and (last[1] >= piece.size_bytes or piece.base_seq + last[0] > piece.last_seq):
        raise ProtocolError(f"index {piece.index_object_key} entry {last} lies outside its segment")
    return index


def resolve_segment_range(piece: SegmentPiece, index: SparseIndex | None) -> SegmentRange | None:
    """The bytes a reader fetches for `piece`, or None when the piece holds nothing to read.

    Without an index the piece must not need one (`piece.needs_index`): the whole segment is read. With one, the
    window's ends move to index entries (see the module docstring), then the start moves up to the last indexed
    record at or below `min_seq` and the end down to the first indexed record above `max_seq`: the records skipped
    hold only seqs outside the piece's seq window, because a segment's records are in seq order.
    """
    if index is None:
        if piece.needs_index:
            raise ValueError(f"segment piece of {piece.object_key} needs its index")
        return SegmentRange(0, piece.size_bytes, piece.base_seq)
    positions, rel_seqs = index.positions, index.rel_seqs
    start, first_seq = 0, piece.base_seq
    if piece.window_start > 0:
        i = bisect_left(positions, piece.window_start)
        if i == len(positions):
            return None
        start, first_seq = positions[i], piece.base_seq + rel_seqs[i]
    end = piece.size_bytes
    if piece.window_end < piece.size_bytes:
        i = bisect_left(positions, piece.window_end)
        if i < len(positions):
            end = positions[i]
    if piece.min_seq > piece.base_seq:
        floor = index.floor(piece.min_seq - piece.base_seq)
        if floor is not None and floor[1] > start:
            first_seq, start = piece.base_seq + floor[0], floor[1]
    if piece.max_seq < piece.last_seq:
        i = bisect_right(rel_seqs, piece.max_seq - piece.base_seq)
        if i < len(positions):
            end = min(end, positions[i])
    if start >= end:
        return None
    return SegmentRange(start, end, first_seq)


def cut_segment_range(found: SegmentRange, index: SparseIndex | None, base_seq: int, part_bytes: int) -> list[SegmentRange]:
    """`found` cut at index entries into consecutive ranges of at least `part_bytes` (the last may be shorter).

    Each range ends at the first indexed record at or past `part_bytes` from its start, so it holds whole records
    and the index names the seq of its first: a reader GETs and decodes them one by one. Without an index, or when
    `found` is short, `found` itself.
    """
    if index is None or found.end - found.start <= part_bytes:
        return [found]
    positions, rel_seqs = index.positions, index.rel_seqs
    parts: list[SegmentRange] = []
    start, first_seq = found.start, found.first_seq
    while True:
        i = bisect_left(positions, start + part_bytes)
        if i == len(positions) or positions[i] >= found.end:
            parts.append(SegmentRange(start, found.end, first_seq))
            return parts
        parts.append(SegmentRange(start, positions[i], first_seq))
        start, first_seq = positions[i], base_seq + rel_seqs[i]


def order_splits(splits: Sequence[Split]) -> list[Split]:
    """Splits in (partition, seq) order: the order a sequential replay (and `tiered replay`) must produce them in."""
    return sorted(splits, key=lambda s: (s.partition, s.min_seq))
