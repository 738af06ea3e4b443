"""`spark.readStream.format("tiered")`: history first, then every block and segment as the catalog commits it.

Offsets are per partition, `{"<partition>": next_seq}` (JSON object keys are strings): a micro-batch from offset
`start` to `end` reads seqs start[p]..end[p]-1 of each partition, planned exactly as a batch read (listing and
planning), so it reads remote segments, or block runs where the tail is not tiered yet. The end is each partition's
high-water mark in the catalog, the highest committed seq: everything up to it is in the bucket.

The first offset is `startingSeq` (default: each partition's first available seq). `startingTimestamp` and
`endingTimestamp` filter messages as in a batch read. `endingSeq` has no meaning for an unbounded stream and is
refused. The catalog is opened on the driver only, once per stream reader; executors read splits as batch reads do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from tiered.catalog import Catalog
from tiered.spark.datasource import freeze_worker_heap, read_split
from tiered.spark.listing import plan_partition_from_catalog, topic_partitions
from tiered.spark.options import OptionError, ReadOptions
from tiered.spark.planning import U64_MAX, SeqRange, Split, order_splits


class TieredStreamReader(DataSourceStreamReader):
    def __init__(self, options: ReadOptions):
        if options.seqs.last != U64_MAX:
            raise OptionError("endingSeq cannot be used with readStream (a stream has no end)")
        self.options = options
        self._catalog: Catalog | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_catalog"] = None  # an engine is not picklable, and executors never use the catalog
        return state

    def _cat(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.open(self.options.catalog_url, pool_size=1, max_overflow=0)
        return self._catalog

    def _states(self):
        states = topic_partitions(self._cat(), self.options.topic)
        wanted = self.options.partitions
        if wanted is not None:
            if missing := sorted(wanted - {s.partition for s in states}):
                raise OptionError(f"topic {self.options.topic!r} has no partition {', '.join(map(str, missing))}")
            states = [s for s in states if s.partition in wanted]
        return states

    def initialOffset(self) -> dict:
        start = self.options.seqs.first
        return {str(s.partition): max(start, s.first_available_seq, 1) for s in self._states()}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        """Each partition's high-water mark + 1. Every read limit is served whole (Spark's ReadAllAvailable, the
        default); a limit would only shorten micro-batches, never change what the stream yields."""
        latest = {str(s.partition): s.hwmark_seq + 1 for s in self._states()}
        if start:
            latest = {p: max(seq, int(start.get(p, 0))) for p, seq in latest.items()}
        return latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        splits: list[Split] = []
        for key, end_seq in end.items():
            first = int(start.get(key, self.options.seqs.first))
            seqs = SeqRange(max(first, self.options.seqs.first), int(end_seq) - 1)
            if seqs.empty:
                continue
            splits += plan_partition_from_catalog(
                self._cat(), self.options.topic, int(key), seqs, self.options.times, self.options.max_split_bytes
            )
        freeze_worker_heap()
        return [InputPartition(split) for split in order_splits(splits)]

    def read(self, partition: InputPartition) -> Iterator:
        return read_split(self.options, partition.value, self.options.times)

    def commit(self, end: dict) -> None:
        return None  # nothing to release: the bucket keeps what retention keeps, whatever a stream has read

    def stop(self) -> None:
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None
