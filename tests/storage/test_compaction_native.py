"""Compaction decodes records natively (tiered.protocol.chunk.record_messages over `_bundlescan.read_chunk`) where
the extension is built, and with the pure decoder (bundle.decode_bundle) where it is not: the two passes must be
one pass. The same partition is copied and compacted twice, once on each path, over random histories (plain and
snappy bundles, sparse ones, tombstones, keyless messages, two passes with retention passing between them): every
file of the two directories is the same byte for byte, and so are the reports. A damaged record fails both the
same clear way: the same error, nothing swapped in, every file as it was."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.compaction import append_workload, log_messages, random_workload, rows
from tests.support.storage_helpers import FakeClock, storage_config
from tiered.protocol import chunk as chunk_module
from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import maybe_varint
from tiered.storage import PartitionLog
from tiered.storage.compaction import CompactionReport, compact_partition, scan_record
from tiered.storage.compaction_plan import KeyIndex, SegmentTally
from tiered.storage.partition_log import StoredRecord

RETENTION_S = 100
CONFIG = storage_config(log_segment_bytes=2000, log_index_interval_bytes=128, log_cleanup_policy="cleanup",
                        log_cleaner_delete_retention_secs=RETENTION_S)
NOW = 1_800_000_000.0


@contextmanager
def pure_decoder() -> Iterator[None]:
    """The pass as it runs where the extension is not built: record_messages falls back to decode_bundle."""
    native, chunk_module._native_read = chunk_module._native_read, None
    try:
        yield
    finally:
        chunk_module._native_read = native


def directory_files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def report_facts(report: CompactionReport) -> tuple:
    return (report.groups, report.segments_before, report.segments_after, report.bytes_before, report.bytes_after,
            report.messages_before, report.messages_after, report.keys, report.tombstones_kept,
            report.tombstones_dropped, report.cleaned_upto, report.skipped, report.stopped, report.error,
            report.swapped)


def compact_copy(source: Path, target: Path, now_s: float, native: bool) -> CompactionReport:
    shutil.copytree(source, target)
    log = PartitionLog.open(str(target), CONFIG, now_s=FakeClock())
    try:
        if native:
            report = compact_partition(log, now_s, force=True)
        else:
            with pure_decoder():
                report = compact_partition(log, now_s, force=True)
    finally:
        log.close()
    return report


def compact_both(source: Path, work: Path, now_s: float) -> tuple[CompactionReport, dict[str, bytes]]:
    """Compacts copies of `source` natively and purely; asserts they agree; returns the native report and files."""
    native = compact_copy(source, work / "native", now_s, True)
    pure = compact_copy(source, work / "pure", now_s, False)
    assert report_facts(native) == report_facts(pure)
    files = directory_files(work / "native")
    assert files == directory_files(work / "pure")
    return native, files


def test_the_native_decoder_is_what_compaction_uses_here():
    from tiered.protocol import _bundlescan

    assert chunk_module._native_read is _bundlescan.read_chunk


@pytest.mark.parametrize("seed", range(12))
def test_native_and_pure_passes_write_the_same_bytes(tmp_path, seed):
    rng = random.Random(seed)
    source = tmp_path / "source"
    log = PartitionLog.open(str(source), CONFIG, now_s=FakeClock())
    append_workload(log, random_workload(rng, rng.randint(20, 80), rng.randint(3, 30),
                                         tombstone_share=rng.choice([0.1, 0.4]), value_bytes=rng.choice([20, 400])))
    log.seal_active()
    before = rows(log_messages(log))
    log.close()
    first, files = compact_both(source, tmp_path / "first", NOW)
    assert first.error is None and first.groups and files != directory_files(source)
    # A second pass over the compacted history and more of it, once the first pass's tombstones expired.
    shutil.copytree(tmp_path / "first" / "native", tmp_path / "again")
    log = PartitionLog.open(str(tmp_path / "again"), CONFIG, now_s=FakeClock())
    append_workload(log, random_workload(rng, 20, 10, tombstone_share=0.3))
    log.seal_active()
    log.close()
    second, _ = compact_both(tmp_path / "again", tmp_path / "second", NOW + 2 * RETENTION_S)
    assert second.error is None
    # The first pass kept every message its rule keeps, with its seq, key, value and timestamp.
    log = PartitionLog.open(str(tmp_path / "first" / "native"), CONFIG, now_s=FakeClock())
    try:
        kept = rows(log_messages(log))
    finally:
        log.close()
    assert len(kept) == first.messages_after + (len(before) - first.messages_before)
    assert set(kept) <= set(before)


def record_spans(directory: Path) -> list[tuple[str, int, int, int]]:
    """(segment file, where its message set starts, where the record ends, codec) of every record of the sealed
    segments."""
    log = PartitionLog.open(str(directory), CONFIG, now_s=FakeClock())
    try:
        names = {s.base: s.filename for s in log.segments}
        spans = []
        for record in log.iter_records(log.first_available, log.segments[-1].last):
            _, start = maybe_varint(record.record, 0)
            header = read_bundle_header(record.record[start:])
            at = record.position + start + header.header_len
            spans.append((names[record.segment_base], at, record.position + len(record.record), header.codec))
        return spans
    finally:
        log.close()


DAMAGES = ("an unknown flag on a plain bundle's first message", "a snappy block's claimed length",
           "any byte of a message set")


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("seed", range(10))
def test_a_damaged_record_fails_both_passes_alike_and_changes_nothing(tmp_path, seed, damage):
    """A byte of one record's message set overwritten (the record and its header still read, so the damage is met
    by the decoding): both passes report the same error and leave every file as it was; where the damage still
    decodes (a byte of a value), both write the same bytes."""
    rng = random.Random(1000 + seed)
    source = tmp_path / "source"
    log = PartitionLog.open(str(source), CONFIG, now_s=FakeClock())
    append_workload(log, random_workload(rng, 40, 8, tombstone_share=0.2))
    log.seal_active()
    log.close()
    spans = record_spans(source)
    if damage == DAMAGES[0]:
        name, position, _, _ = rng.choice([s for s in spans if s[3] == CODEC_NONE])
        byte = 0xF0
    elif damage == DAMAGES[1]:
        name, position, _, _ = rng.choice([s for s in spans if s[3] == CODEC_SNAPPY])
        byte = 0xFF  # a varint of more bytes: a claim far past the block, or a block that does not decompress
    else:
        name, start, end, _ = rng.choice([s for s in spans if s[1] < s[2]])
        position, byte = rng.randrange(start, end), rng.choice([0x00, 0xFF, 0x80, rng.randrange(256)])
    path = source / name
    data = bytearray(path.read_bytes())
    data[position] = byte
    path.write_bytes(bytes(data))
    damaged = directory_files(source)
    report, files = compact_both(source, tmp_path / "pass", NOW)
    if damage != DAMAGES[2]:
        assert report.error is not None
    if report.error is not None:
        assert report.error.startswith("the sealed segments could not be read: ")
        assert report.groups == 0 and files == damaged


def test_a_record_cut_short_is_refused_by_both_decoders(tmp_path):
    """A record fed from elsewhere (the pass from the bucket feeds records it streamed) that ends before its bundle
    does: the same ProtocolError on both paths, and nothing learnt from it."""
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG, now_s=FakeClock())
    try:
        append_workload(log, random_workload(random.Random(7), 3, 4))
        log.seal_active()
        record = next(log.iter_records(1, log.last_assigned))
        segment = log.segments[0]
    finally:
        log.close()
    cut = StoredRecord(record.first_seq, record.last_seq, record.segment_base, record.position, record.record[:-1])
    errors = []
    for native in (True, False):
        keys, tally = KeyIndex(), SegmentTally(segment)
        with pytest.raises(ProtocolError) as caught:
            if native:
                scan_record(cut, keys, tally)
            else:
                with pure_decoder():
                    scan_record(cut, keys, tally)
        errors.append(str(caught.value))
        assert (len(keys), tally.messages, tally.keyless) == (0, 0, 0)
    assert errors[0] == errors[1] and "is cut short" in errors[0]
