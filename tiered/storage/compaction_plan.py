"""What a compaction pass keeps and which sealed segments it rewrites together: TANK's CLEANUP policy
(docs/protocol.md §10), as pure functions over messages and segment sizes.

What is kept, over the compacted range (a run of the oldest sealed segments; the active segment is never part of it):
- every message without a key. As in TANK, an empty key is no key (`strwlen8_t` is falsy when empty). TANK's own
  pass also drops keyless messages with an empty value; docs/protocol.md keeps every keyless message, and so do we;
- of the messages with a key, the one with the highest seq in the range (the latest value), unless it is a
  tombstone (an empty value) whose retention has passed: `delete_retention_ms` after the first pass that compacted
  it (compaction_checkpoint.py). Earlier messages of a key are removed whatever they hold.
- If nothing at all would be left (the range holds only expired tombstones), its last message stays, so that the
  range, and with it the partition's first available seq, keeps existing.

Segments are rewritten in groups of consecutive segments, oldest first, each group swapped in on its own
(compaction_swap.py), so that the extra disk space a pass needs is that of one group's output. A group holds at
most `limit_bytes` of input unless one segment alone is larger, spans at most MAX_REL_SEQ seqs (so its output can
be one segment with u32 relative seqs), and keeps at least one message (its output needs a first record). A group
of one segment from which nothing is removed is left as it is.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Sequence

from tiered.protocol.bundle import Message
from tiered.storage.compaction_checkpoint import Checkpoint
from tiered.storage.segment import SealedSegment
from tiered.storage.appender import MAX_REL_SEQ


def dirty_ratio(segments: Sequence[SealedSegment], cleaned_upto: int) -> float:
    """TANK's trigger: bytes of sealed segments not compacted yet over all sealed bytes (0 when there are none)."""
    total = sum(s.size for s in segments)
    if not total:
        return 0.0
    return sum(s.size for s in segments if s.last > cleaned_upto) / total


@dataclass
class SegmentTally:
    """Messages of one input segment: all of them, and how many carry no key."""

    segment: SealedSegment
    messages: int = 0
    keyless: int = 0
    kept: int = 0  # filled in by kept_per_segment
    index_bytes: int | None = None  # of the segment's index; None: read from the segment's index file when needed

    @property
    def stored_bytes(self) -> int:
        """Segment and index bytes: what rewriting the segment frees."""
        index_bytes = self.index_bytes if self.index_bytes is not None else self.segment.index.size_bytes
        return self.segment.size + index_bytes


class KeyIndex:
    """The latest seq of every key in the compacted range. A negative seq marks a latest message that is a tombstone."""

    def __init__(self) -> None:
        self.latest: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self.latest)

    def add_messages(self, messages: Sequence[Message]) -> int:
        """Learns the keys of a record's messages, which must come in seq order (the range is read oldest first);
        returns how many carry no key. One call per record, its loop on locals: it runs for every message."""
        latest = self.latest
        keyless = 0
        for m in messages:
            if m.key:
                latest[m.key] = m.seq if m.value else -m.seq
            else:
                keyless += 1
        return keyless


@dataclass
class KeepRule:
    """Whether a message of the compacted range survives the pass."""

    keys: KeyIndex
    checkpoint: Checkpoint
    now_ms: int
    delete_retention_ms: int
    # The range's last message, kept whatever the rule says when nothing else would be (an expired tombstone); 0: none
    forced: int = 0

    def tombstone_expired(self, seq: int) -> bool:
        compacted_ms = self.checkpoint.first_compacted_ms(seq)
        if compacted_ms is None:
            compacted_ms = self.now_ms  # this pass is the first to compact it
        return compacted_ms + self.delete_retention_ms <= self.now_ms

    def live_tombstones(self) -> int:
        """Tombstones the range keeps after the pass."""
        live = sum(1 for seq in self.keys.latest.values() if seq < 0 and not self.tombstone_expired(-seq))
        return live + bool(self.forced)

    def split(self, messages: Sequence[Message]) -> tuple[list[Message], int]:
        """(the messages of a record that survive, how many tombstones it loses). A message survives when it has no
        key, is the latest of its key (a tombstone only until its retention passed) or is the forced one. One call
        per record, its loop on locals: it runs for every message."""
        latest = self.keys.latest
        forced = self.forced
        kept = []
        dropped_tombstones = 0
        for m in messages:
            key = m.key
            if not key or m.seq == forced:
                kept.append(m)
                continue
            seq = latest[key]
            if seq == m.seq or (seq == -m.seq and not self.tombstone_expired(m.seq)):
                kept.append(m)
            elif not m.value:  # not kept, so it has a key: a tombstone
                dropped_tombstones += 1
        return kept, dropped_tombstones


def kept_per_segment(tallies: Sequence[SegmentTally], rule: KeepRule) -> KeepRule:
    """Fills in `kept` of every tally from the key index alone (no second read); returns the rule to use, which
    forces the range's last message when nothing else would be left."""
    bases = [t.segment.base for t in tallies]
    for t in tallies:
        t.kept = t.keyless
    for seq in rule.keys.latest.values():
        if seq < 0 and rule.tombstone_expired(-seq):
            continue
        _tally_for(tallies, bases, abs(seq)).kept += 1
    if tallies and not any(t.kept for t in tallies):
        last = _last_keyed_seq(rule.keys)
        _tally_for(tallies, bases, last).kept = 1
        return KeepRule(rule.keys, rule.checkpoint, rule.now_ms, rule.delete_retention_ms, last)
    return rule


def _tally_for(tallies: Sequence[SegmentTally], bases: list[int], seq: int) -> SegmentTally:
    return tallies[bisect_right(bases, seq) - 1]


def _last_keyed_seq(keys: KeyIndex) -> int:
    return max(abs(seq) for seq in keys.latest.values())


@dataclass
class Group:
    tallies: list[SegmentTally] = field(default_factory=list)
    messages: int = 0
    kept: int = 0
    kept_segment_bytes: int = 0  # input bytes of the segments that keep something: what the output can grow to

    @property
    def segments(self) -> list[SealedSegment]:
        return [t.segment for t in self.tallies]

    @property
    def base(self) -> int:
        return self.tallies[0].segment.base

    @property
    def last(self) -> int:
        return self.tallies[-1].segment.last

    @property
    def input_bytes(self) -> int:
        """Segment and index bytes of the group: what the swap frees."""
        return sum(t.stored_bytes for t in self.tallies)

    @property
    def changes_something(self) -> bool:
        return len(self.tallies) > 1 or self.kept < self.messages

    def add(self, tally: SegmentTally) -> None:
        self.tallies.append(tally)
        self.messages += tally.messages
        self.kept += tally.kept
        if tally.kept:
            self.kept_segment_bytes += tally.segment.size


def plan_groups(tallies: Sequence[SegmentTally], limit_bytes: int) -> list[Group]:
    """Consecutive groups over the whole range, oldest first, including the ones that change nothing.

    A segment that keeps nothing rides with the group after it (or the one before, at the end of the range); its
    bytes count towards no limit, since it adds nothing to the output.
    """
    groups: list[Group] = []
    current = Group()
    carried: list[SegmentTally] = []  # segments keeping nothing, waiting for the next group
    for tally in tallies:
        if not tally.kept:
            carried.append(tally)
            continue
        if current.tallies and not _fits(current, tally.segment, limit_bytes):
            groups.append(current)
            current = Group()
        for waiting in (*carried, tally):
            current.add(waiting)
        carried = []
    if carried and not current.tallies and groups:
        current = groups.pop()
    for waiting in carried:
        current.add(waiting)
    if current.tallies:
        groups.append(current)
    return groups


def _fits(group: Group, segment: SealedSegment, limit_bytes: int) -> bool:
    return group.kept_segment_bytes + segment.size <= limit_bytes and segment.last - group.base <= MAX_REL_SEQ
