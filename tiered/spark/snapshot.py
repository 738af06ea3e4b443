"""The latest value per key (a snapshot) of the history a read selects: what a compaction pass would keep, with
every tombstone already expired (docs/compaction.md, "What a pass keeps").

Per partition:
- every keyless message (no key, or an empty one, as in TANK), each on its own row;
- of the messages with a key, the one with the highest seq, unless its value is empty: a tombstone, whose key is
  then absent.

The read's bounds (partitions, seqs, times) select the messages first; the snapshot is taken over them. So
`endingSeq` gives the snapshot as of that seq, and the default bound the one as of the high-water mark at planning.
Compacted history gives the same snapshot as the history it was compacted from, since a pass removes only messages
that are not the latest of their key.

Two ways to take it:
- on Spark, `latest_per_key(df)` over a `tiered` read: one aggregation, grouped by (topic, partition, key), with
  keyless messages grouped by their seq as well so that each stays a row of its own. Spark aggregates within each task
  before the shuffle, so what crosses it is at most one row per key and task, plus the keyless messages. A Python data
  source cannot do it in the source: a partition's splits are separate tasks, and only a shuffle brings a key's
  messages together.
- in one process (`tiered replay --latest-per-key`), `snapshot_splits`: per partition, a first pass over its splits
  learns the latest seq of every key (`LatestPerKey`, in memory: about 120 bytes per distinct key plus the key's
  length, as compaction's key index), then the splits that hold anything kept are read again and filtered. The
  messages come out in seq order, so the output is what a compaction of that range would leave.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from tiered.protocol.bundle import Message
from tiered.spark.execution import split_batches
from tiered.spark.objects import RangeReader
from tiered.spark.planning import Split, TimeRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_SEQ, _KEY, _VALUE = 2, 4, 5  # columns of tiered.spark.decoding.SCHEMA


def latest_per_key(df: DataFrame) -> DataFrame:
    """The snapshot of a `spark.read.format("tiered")` DataFrame (the module docstring): the same columns, one row
    per live key and per keyless message, in no particular order."""
    from pyspark.sql import functions as F

    keyless = F.col("key").isNull() | (F.length("key") == 0)
    grouped = df.groupBy("topic", "partition", "key", F.when(keyless, F.col("seq")).alias("_keyless_seq"))
    latest = grouped.agg(F.max_by(F.struct("seq", "timestamp", "value"), "seq").alias("_latest"))
    return latest.where(keyless | (F.length("_latest.value") > 0)).select(
        "topic", "partition", F.col("_latest.seq").alias("seq"), F.col("_latest.timestamp").alias("timestamp"),
        "key", F.col("_latest.value").alias("value"),
    )  # fmt: skip


@dataclass
class LatestPerKey:
    """One partition's snapshot rule, learnt from its messages in seq order: the latest seq of every key (negative
    when that message is a tombstone), and for each split which seqs it held and whether a keyless message was
    among them."""

    latest: dict[bytes, int] = field(default_factory=dict)
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # split number -> (first seq, last seq) seen
    keyless_in: set[int] = field(default_factory=set)  # split numbers

    def learn(self, split_number: int, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        seqs = batch.column(_SEQ).to_pylist()
        keys = batch.column(_KEY).to_pylist()
        lengths = pc.binary_length(batch.column(_VALUE)).to_pylist()
        latest = self.latest
        for seq, key, length in zip(seqs, keys, lengths):
            if key:
                latest[key] = seq if length else -seq
            else:
                self.keyless_in.add(split_number)
        first, _ = self.spans.get(split_number, (seqs[0], 0))
        self.spans[split_number] = (first, seqs[-1])

    def keeps(self, seq: int, key: bytes | None) -> bool:
        return not key or self.latest.get(key) == seq

    def to_read_again(self) -> list[int]:
        """The split numbers holding a message the snapshot keeps, in order."""
        live = sorted(seq for seq in self.latest.values() if seq > 0)
        wanted = []
        for number, (first, last) in sorted(self.spans.items()):
            at = bisect_left(live, first)
            if number in self.keyless_in or (at < len(live) and live[at] <= last):
                wanted.append(number)
        return wanted

    def filter(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        keys = batch.column(_KEY).to_pylist()
        seqs = batch.column(_SEQ).to_pylist()
        return batch.filter(pa.array([self.keeps(seq, key) for seq, key in zip(seqs, keys)], pa.bool_()))


def snapshot_splits(reader: RangeReader, splits: Iterable[Split], times: TimeRange = TimeRange()
                    ) -> Iterator[tuple[Split, LatestPerKey]]:
    """Splits in (partition, seq) order in; for each partition, after a first pass over all its splits, the splits
    to read again, each with its partition's rule (the module docstring)."""
    for _, group in itertools.groupby(splits, key=lambda s: s.partition):
        parts = list(group)
        rule = LatestPerKey()
        for number, split in enumerate(parts):
            for batch in split_batches(reader, split, times):
                rule.learn(number, batch)
        for number in rule.to_read_again():
            yield parts[number], rule


def kept_batches(batches: Iterable[pa.RecordBatch], rule: LatestPerKey) -> Iterator[pa.RecordBatch]:
    """The batches filtered by the rule; batches left empty are dropped."""
    for batch in batches:
        kept = rule.filter(batch)
        if kept.num_rows:
            yield kept


def kept_messages(messages: Iterable[Message], rule: LatestPerKey) -> Iterator[Message]:
    return (m for m in messages if rule.keeps(m.seq, m.key))
