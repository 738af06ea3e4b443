"""`spark.read.format("tiered")`: the PySpark (4.x) Python data source over the bucket and the catalog.

    from tiered.spark import TieredDataSource
    spark.dataSource.register(TieredDataSource)
    df = (spark.read.format("tiered").option("catalog", "postgresql+psycopg://tiered@db/tiered")
          .option("store", "s3://bucket/prefix").option("topic", "events").load())

Options: tiered.spark.options. The driver plans splits from the catalog when Spark asks for the reader's partitions
(tiered.spark.listing); each task reads its split's byte ranges with its own client (tiered.spark.execution) and
yields Arrow record batches. `readStream` works too (tiered.spark.streaming).

PySpark's daemon runs a full `gc.collect()` after every task of a reused Python worker, which walks every object
the worker holds: with botocore's S3 model loaded, some 130,000, 0.1 to 0.25 s a task on the benchmark machine. The
worker's long-lived heap (modules, the cached S3 client, the catalog's metadata) is therefore moved out of the
collector's sight once per worker (`freeze_worker_heap`), after one last collection.

Filter pushdown (PySpark 4.1+): with the option `filterPushdown=true`, the reader takes Spark's filters on
`partition` (=, IN), `seq` (=, <, <=, >, >=; IN narrows to its min..max) and `timestamp` (=, <, <=, >, >=) and
plans with them, so splits outside are never read. PySpark refuses a reader that implements pushFilters while the
session conf `spark.sql.python.filterPushdown.enabled` is off (its default), hence the opt-in option: the default
reader works on every session, and the pushdown one where the conf is on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from tiered.spark.decoding import SCHEMA_DDL
from tiered.spark.execution import split_batches
from tiered.spark.listing import plan_read
from tiered.spark.objects import open_range_reader
from tiered.spark.options import ReadOptions, datetime_to_us
from tiered.spark.planning import MAX_TIMESTAMP_MS, SeqRange, Split, TimeRange


class TieredDataSource(DataSource):
    """The data source named `tiered`: a topic's history, read from remote segments and block runs."""

    @classmethod
    def name(cls) -> str:
        return "tiered"

    def schema(self) -> str:
        freeze_worker_heap()  # Spark asks in a worker of its own, reused query after query
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        options = ReadOptions.parse(self.options)
        return TieredPushdownReader(options) if options.filter_pushdown else TieredReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from tiered.spark.streaming import TieredStreamReader

        return TieredStreamReader(ReadOptions.parse(self.options))


@dataclass(frozen=True)
class Bounds:
    """What a read keeps: the options narrowed by pushed filters."""

    partitions: frozenset[int] | None
    seqs: SeqRange
    times: TimeRange

    @classmethod
    def of(cls, options: ReadOptions) -> Bounds:
        return cls(options.partitions, options.seqs, options.times)

    def with_partitions(self, numbers: Iterable[int]) -> Bounds:
        wanted = frozenset(numbers)
        return replace(self, partitions=wanted if self.partitions is None else self.partitions & wanted)


class TieredReader(DataSourceReader):
    def __init__(self, options: ReadOptions):
        self.options = options
        self.bounds = Bounds.of(options)

    def partitions(self) -> Sequence[InputPartition]:
        bounds = self.bounds
        splits = plan_read(self.options, partitions=bounds.partitions, seqs=bounds.seqs, times=bounds.times)
        freeze_worker_heap()
        return [InputPartition(split) for split in splits]

    def read(self, partition: InputPartition) -> Iterator:
        split: Split | None = partition.value
        if split is None:  # Spark turns an empty plan into one InputPartition(None)
            return iter(())
        return read_split(self.options, split, self.bounds.times)


def read_split(options: ReadOptions, split: Split, times: TimeRange) -> Iterator[pa.RecordBatch]:
    """What a Spark task runs: the split's record batches, read with this worker's client."""
    reader = open_range_reader(options.store_url, s3_path_style=options.s3_path_style)
    freeze_worker_heap()
    return split_batches(reader, split, times)


_heap_frozen = False


def freeze_worker_heap() -> None:
    """Once per process: collect, then leave what is alive out of later collections (see the module docstring)."""
    global _heap_frozen
    if not _heap_frozen:
        gc.collect()
        gc.freeze()
        _heap_frozen = True


class TieredPushdownReader(TieredReader):
    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        bounds, unsupported = push_filters(self.bounds, filters)
        self.bounds = bounds
        return unsupported


def push_filters(bounds: Bounds, filters: Iterable[Filter]) -> tuple[Bounds, list[Filter]]:
    """Narrows `bounds` by the filters it can apply exactly; returns the rest for Spark to evaluate.

    A filter narrowed only in part (IN on seq narrows to its min..max) is returned as well.
    """
    unsupported: list[Filter] = []
    for f in filters:
        column = f.attribute[0] if len(f.attribute) == 1 else None
        narrowed = _narrow(bounds, column, f)
        if narrowed is None:
            unsupported.append(f)
            continue
        bounds, exact = narrowed
        if not exact:
            unsupported.append(f)
    return bounds, unsupported


def _narrow(bounds: Bounds, column: str | None, f: Filter) -> tuple[Bounds, bool] | None:
    """(narrowed bounds, whether the filter is applied exactly), or None if the filter is not ours to apply."""
    if isinstance(f, IsNotNull) and column in ("partition", "seq"):
        return bounds, True  # never null
    if isinstance(f, IsNotNull) and column == "timestamp":
        # Null only above MAX_TIMESTAMP_MS, which a bounded time range excludes.
        return replace(bounds, times=bounds.times.narrow(end_us=MAX_TIMESTAMP_MS * 1000 + 1)), True
    if column == "partition":
        if isinstance(f, (EqualTo, EqualNullSafe)) and _is_int(f.value):
            return bounds.with_partitions([f.value]), True
        if isinstance(f, In) and all(_is_int(v) for v in f.value):
            return bounds.with_partitions(f.value), True
        return None
    if column == "seq":
        if isinstance(f, In) and f.value and all(_is_int(v) for v in f.value):
            return replace(bounds, seqs=bounds.seqs.narrow(min(f.value), max(f.value))), False
        value = getattr(f, "value", None)
        if not _is_int(value):
            return None
        seqs = bounds.seqs
        if isinstance(f, (EqualTo, EqualNullSafe)):
            seqs = seqs.narrow(value, value)
        elif isinstance(f, GreaterThan):
            seqs = seqs.narrow(first=value + 1)
        elif isinstance(f, GreaterThanOrEqual):
            seqs = seqs.narrow(first=value)
        elif isinstance(f, LessThan):
            seqs = seqs.narrow(last=value - 1)
        elif isinstance(f, LessThanOrEqual):
            seqs = seqs.narrow(last=value)
        else:
            return None
        return replace(bounds, seqs=seqs), True
    if column == "timestamp":
        value = getattr(f, "value", None)
        if not hasattr(value, "tzinfo") or not hasattr(value, "hour"):
            return None  # a date, or not a timestamp at all
        us = datetime_to_us(value)
        times = bounds.times
        if isinstance(f, (EqualTo, EqualNullSafe)):
            times = times.narrow(us, us + 1)
        elif isinstance(f, GreaterThan):
            times = times.narrow(start_us=us + 1)
        elif isinstance(f, GreaterThanOrEqual):
            times = times.narrow(start_us=us)
        elif isinstance(f, LessThan):
            times = times.narrow(end_us=us)
        elif isinstance(f, LessThanOrEqual):
            times = times.narrow(end_us=us + 1)
        else:
            return None
        return replace(bounds, times=times), True
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
