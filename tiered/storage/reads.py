"""Consume reads inside one segment: where a chunk starts and where it ends (docs/protocol.md §3.4, §10).

A chunk is a byte range of a segment file made of whole records, so it can be streamed with sendfile:
- it starts at the record holding the requested seq (index floor lookup, then a short walk of record headers);
  a seq that falls in a gap between records starts at the next record;
- it always holds that first record, even when it is larger than fetch_size;
- its end is snapped to a record boundary: the rest of the segment if it fits in fetch_size, else the largest
  index entry within fetch_size, else a walk that stops before the first record that would not fit;
- it never holds a record whose last seq is above the visible seq (hwmark).
"""

from __future__ import annotations

from dataclasses import dataclass
from tiered.storage.records import RecordInfo, ReadAhead, iter_records, read_record_info
from tiered.storage.segment import ActiveSegment, SealedSegment, SegmentReader

Segment = ActiveSegment | SealedSegment


@dataclass(frozen=True, slots=True)
class ReadRange:
    """Bytes [start_position, end_position) of `segment`'s file: whole records, the first holding the seq asked."""

    segment: Segment
    file: SegmentReader  # the segment's shared reader: os.sendfile/os.pread with explicit positions only
    start_position: int
    end_position: int
    first_bundle_seq: int  # the consume response's base seq (absent from the response when the bundle is sparse)
    first_bundle_sparse: bool
    hwmark: int

    @property
    def size(self) -> int:
        return self.end_position - self.start_position


def find_start(segment: Segment, seq: int, size: int, fd: int) -> RecordInfo | None:
    """The first record of `segment` (within `size` bytes of file `fd`) whose last seq is >= `seq`, or None."""
    entry = segment.index.floor(seq - segment.base) if seq >= segment.base else None
    rel_seq, position = entry if entry is not None else (0, 0)
    for record in iter_records(fd, position, size, segment.base + rel_seq):
        if record.last_seq >= seq:
            return record
    return None


def range_end(
    segment: Segment, fd: int, first: RecordInfo, size: int, last: int, fetch_size: int, visible: int
) -> int:
    """End position of a chunk of file `fd` starting with record `first` (already known to be visible)."""
    start = first.position
    if last <= visible and size - start <= fetch_size:
        return size
    ceiling = min(size, start + fetch_size)
    # An index entry ends the chunk just before the bundle it points at; every earlier bundle ends below that
    # bundle's first seq, so the entry qualifies when its seq is at most visible + 1.
    end = segment.index.ceiling_position(start, ceiling, visible + 1 - segment.base)
    if end is not None and end >= first.end:
        return end
    return _walk_end(fd, first, size, ceiling, visible)


def _walk_end(fd: int, first: RecordInfo, size: int, ceiling: int, visible: int) -> int:
    window = ReadAhead(fd, size)
    end = first.end
    next_seq = first.last_seq + 1
    while end < ceiling:
        record = read_record_info(window, end, next_seq)
        if record.end > ceiling or record.last_seq > visible:
            break
        end = record.end
        next_seq = record.last_seq + 1
    return end
