"""Which sealed segments retention deletes: TANK's DELETE policy (docs/protocol.md §10), as a pure function.

The oldest segments go first, while any limit is exceeded: more than `retention.segments.count` sealed segments,
more than `log.retention.bytes` of them, or the oldest frozen more than `log.retention.secs` ago (0 disables a
limit). Unlike TANK, `may_delete` can veto a segment (the tiering layer keeps a segment until it is copied to the
object store); a veto stops the pass there, so what is kept is always a contiguous run of the newest segments.
The active segment is never among the candidates.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence, TypeVar

from tiered.storage.topic_config import TopicConfig


class RetainedSegment(Protocol):
    size: int
    freeze_ts: int


S = TypeVar("S", bound=RetainedSegment)


def _always(_segment: RetainedSegment) -> bool:
    return True


def select_expired(
    segments: Sequence[S],
    *,
    max_count: int,
    max_bytes: int,
    max_age_s: int,
    now_s: float,
    may_delete: Callable[[S], bool] = _always,
) -> list[S]:
    """The oldest-first prefix of `segments` that the limits expire (0 = no limit)."""
    count = len(segments)
    total = sum(s.size for s in segments)
    chosen: list[S] = []
    for segment in segments:
        over_count = max_count and count > max_count
        over_bytes = max_bytes and total > max_bytes
        too_old = max_age_s and segment.freeze_ts + max_age_s < now_s
        if not (over_count or over_bytes or too_old):
            break
        if not may_delete(segment):
            break
        chosen.append(segment)
        count -= 1
        total -= segment.size
    return chosen


def select_for_deletion(
    segments: Sequence[S],
    config: TopicConfig,
    now_s: float,
    may_delete: Callable[[S], bool] = _always,
) -> list[S]:
    """Local retention of one partition's sealed segments (oldest first). The cleanup policy deletes nothing."""
    if config.log_cleanup_policy != "delete":
        return []
    return select_expired(
        segments,
        max_count=config.retention_segments_count,
        max_bytes=config.log_retention_bytes,
        max_age_s=config.log_retention_secs,
        now_s=now_s,
        may_delete=may_delete,
    )
