"""The sparse index of one segment: `<base>.index` (docs/protocol.md §7).

Index file layout, a sequence of fixed entries:

    rel_seq    u32 LE   first seq of the indexed bundle minus the segment's base
    position   u32 LE   file position of that bundle's varint length prefix in the segment

Both columns strictly increase. The rule that decides which bundles are indexed is TANK's
(`append_bundle()`): after a record is written, it is indexed iff `since_last_update > interval`, where
`since_last_update` is the bytes written since the start of the last indexed record, not counting the record
just written; it resets to 0 on each indexed record and then grows by each record's length. It starts at
NEVER_INDEXED on a new segment, so the first record of every segment is indexed.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from typing import Iterable, Iterator

ENTRY = struct.Struct("<II")
ENTRY_BYTES = ENTRY.size
NEVER_INDEXED = 0xFFFF_FFFF  # since_last_update of a segment with no record yet: forces the first entry


def should_index(since_last_update: int, interval: int) -> bool:
    return since_last_update > interval


class SparseIndex:
    """In-memory copy of one index file: two parallel u32 arrays, searched with bisect."""

    __slots__ = ("rel_seqs", "positions")

    def __init__(self, entries: Iterable[tuple[int, int]] = ()):
        self.rel_seqs = array("I")
        self.positions = array("I")
        for rel_seq, position in entries:
            self.append(rel_seq, position)

    def __len__(self) -> int:
        return len(self.rel_seqs)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.rel_seqs, self.positions)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SparseIndex) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"SparseIndex({list(self)!r})"

    @property
    def size_bytes(self) -> int:
        return len(self.rel_seqs) * ENTRY_BYTES

    def last(self) -> tuple[int, int] | None:
        if not self.rel_seqs:
            return None
        return self.rel_seqs[-1], self.positions[-1]

    def append(self, rel_seq: int, position: int) -> None:
        if self.rel_seqs and (rel_seq <= self.rel_seqs[-1] or position <= self.positions[-1]):
            raise ValueError(f"index entry ({rel_seq}, {position}) does not follow {self.last()}")
        self.rel_seqs.append(rel_seq)
        self.positions.append(position)

    def floor(self, rel_seq: int) -> tuple[int, int] | None:
        """The last entry whose rel_seq <= `rel_seq`, or None when every entry is above it."""
        i = bisect_right(self.rel_seqs, rel_seq) - 1
        if i < 0:
            return None
        return self.rel_seqs[i], self.positions[i]

    def ceiling_position(self, after: int, max_position: int, max_rel_seq: int) -> int | None:
        """The largest entry position p with after < p <= max_position whose rel_seq <= max_rel_seq, or None."""
        if max_rel_seq < 0:
            return None
        i = min(bisect_right(self.positions, max_position), bisect_right(self.rel_seqs, max_rel_seq)) - 1
        if i < 0 or self.positions[i] <= after:
            return None
        return self.positions[i]

    def to_bytes(self) -> bytes:
        return b"".join(ENTRY.pack(r, p) for r, p in self)

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[SparseIndex, int]:
        """Parses an index file: (index, bytes of a trailing partial entry that were left out).

        Raises ValueError when the entries do not strictly increase (the file is not an index of this segment).
        """
        whole = len(data) - len(data) % ENTRY_BYTES
        index = cls()
        for rel_seq, position in ENTRY.iter_unpack(data[:whole]):
            index.append(rel_seq, position)
        return index, len(data) - whole


class IndexBuilder:
    """Applies TANK's indexing rule to records in file order, starting on an empty segment."""

    __slots__ = ("interval", "since_last_update", "index")

    def __init__(self, interval: int, index: SparseIndex | None = None, since_last_update: int = NEVER_INDEXED):
        self.interval = interval
        self.index = index if index is not None else SparseIndex()
        self.since_last_update = since_last_update

    def add(self, rel_seq: int, position: int, record_len: int) -> tuple[int, int] | None:
        """Accounts for one record; returns the new entry when this record is indexed."""
        entry = None
        if should_index(self.since_last_update, self.interval):
            self.index.append(rel_seq, position)
            entry = (rel_seq, position)
            self.since_last_update = 0
        self.since_last_update += record_len
        return entry
