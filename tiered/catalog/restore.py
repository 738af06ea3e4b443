"""Restoring a catalog from the bucket (`tiered catalog rebuild`, tiered.tiering.recovery.rebuild): rows written directly.

The other modules hold the live broker's transitions: a block becomes `committed` only through
`blocks.commit_block`, which checks that the committing broker leads each partition at its epoch; a segment
becomes COPY_FINISHED only after COPY_STARTED; a partition's hwmark only rises with a commit. A rebuild has no
leader and restores finished history, so it writes those end states here, in batches, with the brokers stopped.
Each function is one transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import bindparam, delete, insert, literal, select, update

from tiered.catalog.blocks import RunRow
from tiered.catalog.engine import Catalog, utcnow
from tiered.catalog.models import BlockModel, BlockRunModel, PartitionEpochModel, PartitionModel, SegmentModel, TopicModel
from tiered.catalog.partitions import lock_partitions
from tiered.catalog.segments import SegmentMeta
from tiered.catalog.states import BlockState, SegmentState


@dataclass(frozen=True, slots=True)
class RestoredBlock:
    """A block found in the bucket, to be recorded `committed` with its runs."""

    object_key: str
    broker_id: int
    size_bytes: int
    created_at: datetime
    committed_at: datetime
    runs: Sequence[RunRow]


@dataclass(frozen=True, slots=True)
class PartitionBounds:
    topic: str
    partition: int
    first_available_seq: int
    hwmark_seq: int


def catalog_is_empty(cat: Catalog) -> bool:
    """True when the catalog holds no topic, block or segment (brokers may be registered). Three LIMIT 1 reads."""
    with cat.read() as conn:
        for model in (TopicModel, BlockModel, SegmentModel):
            if conn.execute(select(literal(1)).select_from(model).limit(1)).first() is not None:
                return False
    return True


def clear_catalog(cat: Catalog) -> None:
    """Deletes every topic, partition, block, run and segment row; brokers stay. What `rebuild --force` replaces."""
    with cat.write() as conn:
        for model in (BlockRunModel, BlockModel, SegmentModel, PartitionEpochModel, PartitionModel, TopicModel):  # children before their parents
            conn.execute(delete(model))


def insert_committed_blocks(cat: Catalog, blocks: Iterable[RestoredBlock]) -> list[int]:
    """Inserts blocks as `committed`, with their runs. Returns their new block ids, in order.

    Partitions are neither checked nor changed (no epoch, no hwmark): `restore_partition_bounds` sets those.
    Raises ValueError, inserting nothing, for a block without runs or a run with a bad seq range.
    """
    blocks = list(blocks)
    for block in blocks:
        if not block.runs:
            raise ValueError(f"block {block.object_key} has no runs: record it abandoned instead")
        for run in block.runs:
            if not 1 <= run.from_seq <= run.first_seq <= run.last_seq:
                raise ValueError(f"bad seq range {run.from_seq}/{run.first_seq}..{run.last_seq} in block "
                                 f"{block.object_key}")
    ids: list[int] = []
    with cat.write() as conn:
        for block in blocks:
            block_id = conn.execute(
                insert(BlockModel)
                .values(
                    object_key=block.object_key,
                    state=BlockState.COMMITTED,
                    broker_id=block.broker_id,
                    size_bytes=block.size_bytes,
                    created_at=block.created_at,
                    committed_at=block.committed_at,
                )
                .returning(BlockModel.block_id)
            ).scalar_one()
            # Written expanded (runs_pending stays NULL, tiered.catalog.blocks): the rebuild runs with the brokers
            # stopped, so no expansion or prune can meet these blocks half-written.
            conn.execute(insert(BlockRunModel), [{"block_id": block_id, **asdict(run)} for run in block.runs])
            ids.append(block_id)
    return ids


def insert_finished_segments(cat: Catalog, segments: Sequence[SegmentMeta], *,
                             from_seqs: Mapping[tuple[str, int, int], int] | None = None,
                             now: datetime | None = None) -> None:
    """Inserts remote segments as COPY_FINISHED (readable) and adds their bytes, object and index, to their
    partitions' remote_bytes, as `segments.segment_copy_finished` does. Leader epochs are recorded, not checked.
    `from_seqs[(topic, partition, base)]` is the seq a segment answers from (default: its base).
    Raises UnknownPartition, inserting nothing, for a partition that does not exist."""
    from_seqs = from_seqs or {}
    if not segments:
        return
    updated_at = utcnow(now)
    added: dict[tuple[str, int], int] = defaultdict(int)
    for segment in segments:
        added[(segment.topic, segment.partition)] += segment.size_bytes + segment.index_size_bytes
    with cat.write() as conn:
        lock_partitions(conn, added)  # the catalog's lock order: partitions, then segments
        conn.execute(
            insert(SegmentModel),
            [{**asdict(s), "state": SegmentState.COPY_FINISHED, "updated_at": updated_at,
              "from_seq": from_seqs.get((s.topic, s.partition, s.base_seq), s.base_seq)} for s in segments],
        )
        conn.execute(
            update(PartitionModel)
            .where(PartitionModel.topic == bindparam("k_topic"), PartitionModel.partition == bindparam("k_partition"))
            .values(remote_bytes=PartitionModel.remote_bytes + bindparam("k_bytes")),
            [{"k_topic": t, "k_partition": p, "k_bytes": n} for (t, p), n in sorted(added.items())],
        )


def restore_partition_bounds(cat: Catalog, bounds: Iterable[PartitionBounds]) -> None:
    """Sets each partition's first available seq and hwmark as given (either may move down: a rebuild replaces
    them). Partitions not listed keep theirs; a listed partition that does not exist is ignored."""
    changes = [
        {"k_topic": b.topic, "k_partition": b.partition, "k_first": b.first_available_seq, "k_hwmark": b.hwmark_seq}
        for b in bounds
    ]
    if not changes:
        return
    with cat.write() as conn:
        conn.execute(
            update(PartitionModel)
            .where(PartitionModel.topic == bindparam("k_topic"), PartitionModel.partition == bindparam("k_partition"))
            .values(first_available_seq=bindparam("k_first"), hwmark_seq=bindparam("k_hwmark")),
            changes,
        )
