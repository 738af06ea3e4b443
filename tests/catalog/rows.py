"""Row builders shared by the catalog tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from tiered.catalog.blocks import RunRow
from tiered.catalog.segments import SegmentMeta

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def run(topic: str, partition: int, first_seq: int, last_seq: int, position: int = 0, length_bytes: int = 100, *,
        from_seq: int | None = None, epoch: int = 1):
    """A run answering from `from_seq` (default: its first seq), uploaded under `epoch`."""
    return RunRow(
        topic=topic,
        partition=partition,
        from_seq=first_seq if from_seq is None else from_seq,
        first_seq=first_seq,
        last_seq=last_seq,
        messages=last_seq - first_seq + 1,
        min_ts_ms=1_700_000_000_000 + first_seq,
        max_ts_ms=1_700_000_000_000 + last_seq,
        leader_epoch=epoch,
        position=position,
        length_bytes=length_bytes,
    )


def stamped(runs, epochs) -> list[RunRow]:
    """The runs with the epochs their partitions are held at (as the block builder stamps them)."""
    return [replace(r, leader_epoch=epochs.get((r.topic, r.partition), r.leader_epoch)) for r in runs]


def segment(
    topic: str, partition: int, base_seq: int, last_seq: int, epoch: int, size_bytes: int = 1000, freeze_ts=T0
) -> SegmentMeta:
    stem = f"seg/{topic}/{partition}/{base_seq:020d}-{last_seq:020d}"
    return SegmentMeta(
        topic=topic,
        partition=partition,
        base_seq=base_seq,
        last_seq=last_seq,
        object_key=f"{stem}.ilog",
        index_object_key=f"{stem}.index",
        size_bytes=size_bytes,
        index_size_bytes=size_bytes // 10,
        min_ts_ms=1_700_000_000_000 + base_seq,
        max_ts_ms=1_700_000_000_000 + last_seq,
        freeze_ts=freeze_ts,
        leader_epoch=epoch,
    )


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)
