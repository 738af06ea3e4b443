"""Where seq N is: a partition's bounds, and the one decision that maps (seq, bounds) to a source.

Every consume asks this and nothing else decides it: the fetch resolver (tiered.server.fetch) carries the choice
out, reading from the local log or asking the tier below. TANK's answers (docs/protocol.md §3.3, §3.4):
- seq 0 means "from the first available seq" (EOF when the partition holds nothing);
- UINT64_MAX, or the seq right after the high-water mark, is the tail: EOF, a long-poll may wait there;
- past the tail, or below the first available seq, is a boundary fault carrying the first available seq;
- anything else is served: from the local log when it lies within the local records, else from the tier below.
The local log may still turn a Local choice down (nothing visible at or after the seq in its segment: the seq falls
between two local segments, where another tier's seqs can be, or compaction removed it and nothing later is visible
yet); `local_miss` says what that means.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered.protocol.codes import UINT64_MAX


@dataclass(frozen=True, slots=True)
class PartitionBounds:
    """A snapshot of what a partition holds, taken once per consume of it.

    first_available  the lowest seq any tier holds (0: the partition holds nothing)
    hwmark           the highest seq consumers may see: the committed seq on a durable topic, else the last appended
    local_first      the first seq of the local log (0: no local records)
    local_last       the last seq of the newest local record (0: none)
    lower_tier       whether a tier below the local disk may hold seqs the local log does not
    """

    first_available: int
    hwmark: int
    local_first: int
    local_last: int
    lower_tier: bool


@dataclass(frozen=True, slots=True)
class Local:
    seq: int


@dataclass(frozen=True, slots=True)
class Remote:
    seq: int


@dataclass(frozen=True, slots=True)
class Boundary:
    """Consume error 0x01: the seq is not served; `first_available` is where the partition begins."""

    first_available: int
    hwmark: int


@dataclass(frozen=True, slots=True)
class Eof:
    """The tail: nothing to send yet (an immediate answer carries first_available as its base seq)."""

    first_available: int
    hwmark: int


Source = Local | Remote | Boundary | Eof


def locate(seq: int, b: PartitionBounds) -> Source:
    if seq == 0:
        if b.first_available == 0:
            return Eof(0, b.hwmark)
        seq = b.first_available
    if seq == UINT64_MAX or seq == b.hwmark + 1:
        return Eof(b.first_available, b.hwmark)
    if seq > b.hwmark + 1 or b.first_available == 0 or seq < b.first_available:
        return Boundary(b.first_available, b.hwmark)
    if b.local_first and b.local_first <= seq <= b.local_last:
        return Local(seq)
    if b.lower_tier:
        return Remote(seq)
    return Boundary(b.first_available, b.hwmark)


def local_miss(seq: int, b: PartitionBounds) -> Remote | Eof:
    """What a Local choice the local log turned down means: the tier below may hold the seq; without one, the seq is
    inside the local records with nothing visible at or after it (compaction removed it): the tail, as TANK says."""
    if b.lower_tier:
        return Remote(seq)
    return Eof(b.first_available, b.hwmark)
