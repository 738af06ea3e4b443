"""Builds a partition's history in a catalog and a bucket as a broker leaves it, without a broker.

`PartitionHistory` appends bundles to a real PartitionLog (TANK segment files), commits the records appended since
the last commit as a block run (encode_block, insert_pending_block, commit_block), and tiers the active segment as
the segment copier does (seal, upload `.ilog` and `.index` unchanged at keys.segment_key/segment_index_key,
COPY_STARTED then COPY_FINISHED, prune the runs it covers). It keeps the messages it wrote, with their seqs, as the
expected answer of any replay. `append_compactable` appends a keyed history for compaction to work on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tiered.catalog import Catalog
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog.blocks import RunRow
from tiered.catalog.segments import SegmentMeta
from tiered.protocol.bundle import (
    CODEC_NONE,
    CODEC_SNAPPY,
    Message,
    decode_bundle,
    encode_bundle,
    maybe_record,
    timestamp_bounds,
)
from tiered.storage.partition_log import PartitionLog
from tiered.storage.topic_config import TopicConfig
from tiered.tiering.objects import keys
from tiered.catalog.blocks import RunMeta
from tiered.tiering.blocks.block_format import encode_block

from tests.support.compaction import random_workload

BROKER_ID = 1
T0_MS = 1_750_000_000_000


class FileObjects:
    """Writes objects into a local store directory (what file:// store URLs name)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = f"file://{self.root}"

    def put(self, object_key: str, data: bytes) -> None:
        path = self.root / object_key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


class S3Objects:
    """Writes objects into a bucket under a prefix, through a boto3 client."""

    def __init__(self, client, bucket: str, prefix: str = "store"):
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/"
        self.url = f"s3://{bucket}/{prefix.strip('/')}"

    def put(self, object_key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + object_key, Body=data)


@dataclass
class PartitionHistory:
    cat: Catalog
    objects: FileObjects | S3Objects
    topic: str
    partition: int
    directory: Path
    index_interval_bytes: int = 128
    messages: list[Message] = field(default_factory=list)  # everything appended, with seqs
    segments: list[SegmentMeta] = field(default_factory=list)  # tiered ones
    runs: list[RunRow] = field(default_factory=list)  # committed ones (pruned ones included)
    cleanup_policy: str = "delete"  # "cleanup": a compacted topic's log (compact_partition passes over it)

    def __post_init__(self) -> None:
        # Segments never roll by size: only tier_segment seals one, so every sealed segment gets copied.
        config = TopicConfig(log_index_interval_bytes=self.index_interval_bytes, log_segment_bytes=1 << 30,
                             log_cleanup_policy=self.cleanup_policy)
        self.log = PartitionLog.open(str(self.directory), config)
        self.epoch = catalog_partitions.claim_partitions(self.cat, BROKER_ID, self.topic, [self.partition])[
            self.partition
        ]
        self._pending: list[tuple[int, int, bytes, list[Message]]] = []  # (first, last, record, messages)

    def append(self, bundle: bytes) -> list[Message]:
        result = self.log.append(bundle)
        decoded = decode_bundle(bundle, result.first_seq)
        self.messages += decoded
        self._pending.append((result.first_seq, result.last_seq, result.record, decoded))
        return decoded

    def commit_run(self) -> RunRow | None:
        """Commits the records appended since the last commit as one block run (a block of one run)."""
        if not self._pending:
            return None
        first, last = self._pending[0][0], self._pending[-1][1]
        records = b"".join(p[2] for p in self._pending)
        stamps = [m.ts_ms for p in self._pending for m in p[3]]
        count = sum(len(p[3]) for p in self._pending)
        from_seq = self.runs[-1].last_seq + 1 if self.runs else 1
        meta = RunMeta(self.topic, self.partition, from_seq, first, last, count, min(stamps), max(stamps), self.epoch)
        data, (row,) = encode_block([(meta, records)])
        object_key = keys.block_key(BROKER_ID, keys.new_block_id(T0_MS))
        block_id = catalog_blocks.insert_pending_block(self.cat, object_key, BROKER_ID, len(data))
        self.objects.put(object_key, data)
        catalog_blocks.commit_block(self.cat, block_id, BROKER_ID, [row], {(self.topic, self.partition): self.epoch})
        self.runs.append(row)
        self._pending.clear()
        return row

    def tier_segment(self) -> SegmentMeta:
        """Commits what is pending, seals the active segment, uploads and records it as the copier does (the block
        runs it holds are pruned by the same transaction)."""
        self.commit_run()
        sealed = self.log.seal_active()
        assert sealed is not None, "nothing to seal"
        return self.copy_sealed(sealed)

    def copy_sealed(self, sealed) -> SegmentMeta:
        data = Path(sealed.path).read_bytes()
        index = Path(sealed.index_path).read_bytes()
        stamps = [ts for _, _, record in _records(data) for ts in timestamp_bounds(record)]
        meta = SegmentMeta(
            topic=self.topic,
            partition=self.partition,
            base_seq=sealed.base,
            last_seq=sealed.last,
            object_key=keys.segment_key(self.topic, self.partition, sealed.base, sealed.last, sealed.freeze_ts),
            index_object_key=keys.segment_index_key(self.topic, self.partition, sealed.base, sealed.last,
                                                    sealed.freeze_ts),
            size_bytes=len(data),
            index_size_bytes=len(index),
            min_ts_ms=min(stamps),
            max_ts_ms=max(stamps),
            freeze_ts=datetime.fromtimestamp(sealed.freeze_ts, timezone.utc),
            leader_epoch=self.epoch,
        )
        catalog_segments.segment_copy_started(self.cat, meta)
        self.objects.put(meta.object_key, data)
        self.objects.put(meta.index_object_key, index)
        catalog_segments.segment_copy_finished(self.cat, self.topic, self.partition, sealed.base, self.epoch)
        self.segments.append(meta)
        return meta

    def close(self) -> None:
        self.log.close()


def _records(data: bytes):
    """(position, length, bundle) of each record of segment bytes."""
    position = 0
    while position < len(data):
        start, end = maybe_record(data, position)
        yield position, end - position, data[start:end]
        position = end


def mixed_bundles(rng: random.Random, history: PartitionHistory, count: int, *, t0_ms: int = T0_MS) -> None:
    """Appends `count` bundles mixing plain, snappy and sparse ones (with seq gaps), keyed and not, with timestamps
    that move forward overall but not monotonically (producers' clocks disagree)."""
    for _ in range(count):
        kind = rng.choice(("plain", "plain", "snappy", "sparse"))
        n = rng.randint(1, 20) if kind != "snappy" else rng.randint(20, 600)

        def message(i: int, seq: int = 0) -> Message:
            ts = t0_ms + len(history.messages) * 10 + rng.randint(-50, 50)
            key = None if rng.random() < 0.4 else b"k%d" % rng.randint(0, 99)
            value = (b"v%d-" % (len(history.messages) + i)) * rng.randint(1, 8 if kind != "snappy" else 30)
            return Message(value, key, ts, seq)

        if kind == "sparse":
            seq = history.log.last_assigned + rng.randint(1, 5)
            seqs = []
            for _ in range(n):
                seqs.append(seq)
                seq += rng.randint(1, 3)
            history.append(encode_bundle([message(i, s) for i, s in enumerate(seqs)], codec=CODEC_NONE, sparse=True))
        else:
            codec = CODEC_SNAPPY if kind == "snappy" else CODEC_NONE
            history.append(encode_bundle([message(i) for i in range(n)], codec=codec))


def build_history(cat: Catalog, objects, topic: str, partition: int, directory: Path, seed: int,
                  *, segments: int = 3, tail_runs: int = 3, bundles_per_step: int = 6) -> PartitionHistory:
    """`segments` tiered segments (each made of a few runs, pruned once tiered), then `tail_runs` committed runs."""
    rng = random.Random(seed)
    history = PartitionHistory(cat, objects, topic, partition, directory)
    for _ in range(segments):
        for _ in range(3):
            mixed_bundles(rng, history, bundles_per_step)
            history.commit_run()
        history.tier_segment()
    for _ in range(tail_runs):
        mixed_bundles(rng, history, bundles_per_step)
        history.commit_run()
    return history


def append_compactable(history: PartitionHistory, seed: int, *, bundles: int = 90, keys: int = 15,
                       tail_bundles: int = 12) -> None:
    """The keyed workload of `seed` (keys, tombstones, keyless messages; plain, snappy and sparse bundles): runs
    committed every three bundles, segments tiered where the workload seals and every 25 bundles, the last
    `tail_bundles` left in committed runs (compaction never reaches them)."""
    workload = random_workload(random.Random(seed), bundles, keys, tombstone_share=0.2, keyless_share=0.15)
    ts_ms = T0_MS
    for i, b in enumerate(workload):
        if b.gap:
            first = history.log.last_assigned + b.gap
            messages = [Message(v, k, ts_ms + i, first + j * b.gap) for j, (k, v) in enumerate(b.messages)]
            history.append(encode_bundle(messages, codec=b.codec, sparse=True))
        else:
            history.append(encode_bundle([Message(v, k, ts_ms + i) for k, v in b.messages], codec=b.codec))
        if i % 3 == 2:
            history.commit_run()
        if (b.seal_after or i % 25 == 24) and i < len(workload) - tail_bundles:
            history.tier_segment()
    history.commit_run()
