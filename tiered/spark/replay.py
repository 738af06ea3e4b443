"""`tiered replay` without Spark: one process reads the planned splits in (partition, seq) order and either writes
Parquet or produces the messages into a topic of a broker.

Reading is what a Spark task does (tiered.spark.execution), split after split, so the two give the same messages.
Parquet goes through pyarrow directly: one file per split that holds any message, named
`part-<partition:05d>-<its first seq:020d>.parquet` (sorted names are (partition, seq) order), with the data
source's columns; to a local directory or to `s3://bucket/prefix` (each file written locally, then uploaded).
A destination that already holds files is refused, so two replays never mix. Spark reads the result back with
`spark.read.parquet(dest)`.

With `latest_per_key`, either output holds the snapshot of the range instead (tiered.spark.snapshot): per
partition a first pass learns the latest seq of every key, then the splits holding anything kept are read again and
filtered, so messages still come out in (partition, seq) order and a Parquet file still holds one split's messages.

Producing keeps keys and timestamps. With `keep_seqs` every bundle goes out as ProduceWithSeqnum (a sparse bundle
carrying each message's seq), so the target partition ends up with the same seqs, gaps included; the target must
not already hold seqs at or above the first one replayed. Requests are pipelined on one connection, which the broker
handles in order; the first failure stops the replay and names the last seq acknowledged.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from tiered.client import Client, TankError
from tiered.protocol.bundle import Message
from tiered.protocol.codes import ProduceStatus
from tiered.spark.decoding import SCHEMA
from tiered.spark.execution import split_batches, split_messages
from tiered.spark.listing import plan_read
from tiered.spark.objects import (
    RangeReader,
    S3RangeReader,
    open_range_reader,
    parse_store_url,
    resolve_path_style,
    s3_client,
)
from tiered.spark.options import ReadOptions
from tiered.spark.planning import Split
from tiered.spark.snapshot import LatestPerKey, kept_batches, kept_messages, snapshot_splits

PRODUCE_WINDOW = 8  # produce requests in flight on the connection


class ReplayError(Exception):
    """A replay that cannot start or could not finish, with what was done before it stopped."""


@dataclass
class ReplayStats:
    splits: int = 0
    messages: int = 0
    files: int = 0
    last_seqs: dict[int, int] = field(default_factory=dict)  # produce: per partition, the last seq acknowledged


def source_reader(options: ReadOptions) -> RangeReader:
    return open_range_reader(options.store_url, s3_path_style=options.s3_path_style)


# --- Parquet ------------------------------------------------------------------------------------------------------


class ParquetDestination:
    """A local directory or an S3 prefix that Parquet files go to; refused unless empty."""

    def __init__(self, dest: str, s3_path_style: bool | None = None):
        self.dest = dest
        self.s3: S3RangeReader | None = None
        if dest.startswith("s3://"):
            location = parse_store_url(dest)
            self.s3 = S3RangeReader(location.bucket, location.prefix, s3_client(resolve_path_style(s3_path_style)))
            if self.s3.any_object():
                raise ReplayError(f"{dest} already holds objects; replay into an empty prefix")
        else:
            self.directory = Path(dest[len("file://"):] if dest.startswith("file://") else dest)
            if self.directory.exists() and any(self.directory.iterdir()):
                raise ReplayError(f"{self.directory} is not empty; replay into an empty directory")
            self.directory.mkdir(parents=True, exist_ok=True)

    def write(self, partition: int, batches: Iterable) -> int:
        """Writes the batches (one partition's, in seq order) as one Parquet file named after their partition and
        first seq; returns the rows written (no file for none)."""
        if self.s3 is None:
            return _write_parquet(self.directory, partition, batches, lambda path, name: None)
        with tempfile.TemporaryDirectory(prefix="tiered-replay-") as staging:
            return _write_parquet(Path(staging), partition, batches, lambda path, name: self.s3.put_file(name, path))


def _write_parquet(directory: Path, partition: int, batches: Iterable, publish: Callable[[Path, str], None]) -> int:
    """Writes into `directory` under a temporary name, renamed once whole (a file under its final name is always
    whole), then handed to `publish(path, name)`."""
    rows, first_seq = 0, None
    partial = directory / f".partial-{partition:05d}.parquet"
    writer = None
    try:
        for batch in batches:
            if writer is None:
                writer = pq.ParquetWriter(str(partial), SCHEMA)
                first_seq = batch.column(2)[0].as_py()
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        return 0
    name = f"part-{partition:05d}-{first_seq:020d}.parquet"
    os.replace(partial, directory / name)
    publish(directory / name, name)
    return rows


def replayed_splits(reader: RangeReader, splits: list[Split], options: ReadOptions, latest_per_key: bool
                    ) -> Iterator[tuple[Split, LatestPerKey | None]]:
    """The splits to read, in order, each with the snapshot rule that filters it (None: keep everything)."""
    if latest_per_key:
        return snapshot_splits(reader, splits, options.times)
    return ((split, None) for split in splits)


def export_parquet(options: ReadOptions, dest: str, *, latest_per_key: bool = False,
                   on_messages: Callable[[int], None] = lambda n: None) -> ReplayStats:
    destination = ParquetDestination(dest, options.s3_path_style)
    splits = plan_read(options)
    reader = source_reader(options)
    stats = ReplayStats(splits=len(splits))

    def counted(batches):
        for batch in batches:
            on_messages(batch.num_rows)
            yield batch

    for split, rule in replayed_splits(reader, splits, options, latest_per_key):
        batches = split_batches(reader, split, options.times)
        if rule is not None:
            batches = kept_batches(batches, rule)
        rows = destination.write(split.partition, counted(batches))
        if rows:
            stats.messages += rows
            stats.files += 1
    return stats


# --- produce ------------------------------------------------------------------------------------------------------


async def produce_replay(
    options: ReadOptions,
    client: Client,
    to_topic: str,
    *,
    keep_seqs: bool = False,
    latest_per_key: bool = False,
    bundle_messages: int = 500,
    on_messages: Callable[[int], None] = lambda n: None,
) -> ReplayStats:
    """Produces the replayed messages into `to_topic`, each into the partition of the same number."""
    if bundle_messages < 1:
        raise ValueError("bundle_messages must be at least 1")
    splits = plan_read(options)
    reader = source_reader(options)
    stats = ReplayStats(splits=len(splits))
    # (task, partition, first seq, last seq, messages)
    in_flight: list[tuple[asyncio.Task, int, int, int, int]] = []

    async def settle(keep: int) -> None:
        while len(in_flight) > keep:
            task, partition, first_seq, last_seq, count = in_flight.pop(0)
            try:
                await task
            except Exception as exc:
                for other, *_ in in_flight:
                    other.cancel()
                done = stats.last_seqs.get(partition)
                acked = f"the last seq acknowledged there is {done if done is not None else 'none'}"
                if isinstance(exc, TankError) and exc.code == ProduceStatus.INVALID_SEQNUMS:
                    raise ReplayError(
                        f"{to_topic}/{partition} refused seqs {first_seq}..{last_seq} (--keep-seqs): a seq can only "
                        f"be written after the partition's high-water mark, and {to_topic}/{partition} already holds "
                        f"seqs at or past {first_seq}; replay into a new topic, or without --keep-seqs to append; "
                        f"{acked}") from exc
                raise ReplayError(f"produce to {to_topic}/{partition} failed ({exc}); {acked}") from exc
            stats.messages += count
            stats.last_seqs[partition] = last_seq
            on_messages(count)

    async def send(partition: int, batch: list[Message]) -> None:
        if keep_seqs:
            coro = client.produce_with_seqnum(to_topic, partition, batch)
        else:
            coro = client.produce(to_topic, partition, batch)
        in_flight.append((asyncio.ensure_future(coro), partition, batch[0].seq, batch[-1].seq, len(batch)))
        await settle(PRODUCE_WINDOW - 1)

    for split, rule in replayed_splits(reader, splits, options, latest_per_key):
        batch: list[Message] = []
        messages = split_messages(reader, split, options.times)
        for message in messages if rule is None else kept_messages(messages, rule):
            batch.append(message)
            if len(batch) >= bundle_messages:
                await send(split.partition, batch)
                batch = []
        if batch:
            await send(split.partition, batch)
    await settle(0)
    return stats
