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
  learns the latest seq of every key (`LatestPerKey`, in Arrow: about 45 bytes per distinct key with 12-byte keys,
  up to about 250 while its table is folded), then the splits that hold anything kept are read again and filtered
  with Arrow kernels. The messages come out in seq order, so the output is what a compaction of that range would
  leave.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
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


class LatestPerKey:
    """One partition's snapshot rule, learnt from all its messages (`learn`, then `finish`): the seqs of the keys'
    latest messages that are not tombstones (the live seqs), and per split the seqs it held and whether a keyless
    message was among them.

    Everything stays in Arrow, so no Python object is made per message. While learning, the state is a table of
    (key, its highest seq, its highest tombstone seq) with one row per key seen; each batch's keyed rows are
    reduced the same way and queued, and the queue is folded into the state when it holds as many rows as the state
    (at least FOLD_ROWS), so the work stays linear in the messages and the queue never outgrows the state. A key is
    live when its highest seq is not its highest tombstone seq. The second pass needs only the live seqs (sorted,
    8 bytes each): a message is kept when it is keyless or its seq is one of them.
    """

    FOLD_ROWS = 1 << 16

    def __init__(self) -> None:
        self._state: pa.Table | None = None
        self._queued: list[pa.Table] = []
        self._queued_rows = 0
        self.spans: dict[int, tuple[int, int]] = {}  # split number -> (first seq, last seq) seen
        self.keyless_in: set[int] = set()  # split numbers
        self._live = pa.array([], pa.int64())  # sorted; set by finish()
        self._live_view: memoryview = memoryview(b"").cast("q")

    def learn(self, split_number: int, batch: pa.RecordBatch) -> None:
        """Messages must come in seq order."""
        if not batch.num_rows:
            return
        seqs, keys, values = batch.column(_SEQ), batch.column(_KEY), batch.column(_VALUE)
        first, _ = self.spans.get(split_number, (seqs[0].as_py(), 0))
        self.spans[split_number] = (first, seqs[-1].as_py())
        keyless = _keyless(keys)
        if pc.any(keyless).as_py():
            self.keyless_in.add(split_number)
        keyed = pa.table({"key": keys, "seq": seqs,
                          "tomb": pc.if_else(pc.equal(pc.binary_length(values), 0), seqs, pa.scalar(None, pa.int64()))})
        self._queue(_reduce(keyed.filter(pc.invert(keyless))))

    def _queue(self, table: pa.Table) -> None:
        self._queued.append(table)
        self._queued_rows += table.num_rows
        if self._queued_rows >= max(self.FOLD_ROWS, self._state.num_rows if self._state is not None else 0):
            self._fold()

    def _fold(self) -> None:
        tables = ([self._state] if self._state is not None else []) + self._queued
        if tables:
            self._state = _reduce(pa.concat_tables(tables))
        self._queued, self._queued_rows = [], 0

    def finish(self) -> None:
        """Ends learning: the live seqs, sorted, from the state (which is then dropped)."""
        self._fold()
        if self._state is not None:
            latest, tomb = self._state.column("seq"), self._state.column("tomb")
            live = pc.filter(latest, pc.fill_null(pc.not_equal(latest, tomb), True)).combine_chunks()
            self._live = pc.take(live, pc.sort_indices(live))
            self._state = None
        self._live_view = _int64_view(self._live)

    def _live_between(self, first: int, last: int) -> tuple[int, int]:
        """The index range of the live seqs within [first, last]."""
        return bisect_left(self._live_view, first), bisect_right(self._live_view, last)

    def keeps(self, seq: int, key: bytes | None) -> bool:
        low, high = self._live_between(seq, seq)
        return not key or low < high

    def to_read_again(self) -> list[int]:
        """The split numbers holding a message the snapshot keeps, in order."""
        wanted = []
        for number, (first, last) in sorted(self.spans.items()):
            low, high = self._live_between(first, last)
            if number in self.keyless_in or low < high:
                wanted.append(number)
        return wanted

    def filter(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not batch.num_rows:
            return batch
        seqs = batch.column(_SEQ)
        low, high = self._live_between(seqs[0].as_py(), seqs[-1].as_py())  # a batch's seqs are in order
        live = pc.is_in(seqs, value_set=self._live.slice(low, high - low))
        return batch.filter(pc.or_(_keyless(batch.column(_KEY)), live))


def _keyless(keys: pa.Array) -> pa.Array:
    """True where a message has no key or an empty one."""
    return pc.fill_null(pc.equal(pc.binary_length(keys), 0), True)


def _reduce(table: pa.Table) -> pa.Table:
    """(key, seq, tomb) rows to one row per key: its highest seq and its highest tombstone seq (null: none)."""
    reduced = table.group_by("key").aggregate([("seq", "max"), ("tomb", "max")])
    return reduced.rename_columns(["key", "seq", "tomb"]).select(["key", "seq", "tomb"])


def _int64_view(array: pa.Array) -> memoryview:
    """The values of an int64 array without nulls, as a sequence bisect can search, without copying."""
    if not len(array):
        return memoryview(b"").cast("q")
    data = memoryview(array.buffers()[1]).cast("q")
    return data[array.offset:array.offset + len(array)]


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
        rule.finish()
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
