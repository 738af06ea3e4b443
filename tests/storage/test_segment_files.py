"""Segment files byte for byte against docs/protocol.md §7, and the roll rules with a fake clock."""

import os
import random
import re
import struct

import pytest

from tests.support.storage_helpers import OBSERVED_TS, bundle_for_record, segment_files, storage_config
from tiered.protocol.bundle import Message, encode_bundle
from tiered.storage.segment import roll_age_s
from tiered.storage.appender import PRODUCE_PATH_ENV

HELLO_RECORD = bytes.fromhex("16 04 00 fbcd5903a2010000 0b") + b"hello world"
HELLO_TS = 0x000001A20359CDFB
OBSERVED_INDEX = b"".join(struct.pack("<II", r, p) for r, p in [(0, 0), (2, 214), (4, 428), (6, 642), (8, 856)])


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_first_records_are_tanks_bytes(open_storage_log, tmp_path):
    log = open_storage_log()
    result = log.append(encode_bundle([Message(b"hello world", ts_ms=HELLO_TS)]))
    assert (result.first_seq, result.last_seq, result.segment_base) == (1, 1, 1)
    assert (result.position, result.end_position, result.record) == (0, 23, HELLO_RECORD)
    directory = tmp_path / "p"
    log.flush()  # index entries reach the file in batches; a flush (or a clean stop) writes them
    assert segment_files(directory) == ["1.index", f"1_{OBSERVED_TS}.log"]
    assert read(directory / f"1_{OBSERVED_TS}.log") == HELLO_RECORD
    assert read(directory / "1.index") == bytes.fromhex("00000000 00000000")  # a one-bundle segment's index

    ts = 0x000001A20359CE06
    second = encode_bundle(
        [Message(b"v1", b"k1", ts), Message(b"v2", b"k2", ts), Message(b"v3", b"k1", ts)]
    )
    result = log.append(second)
    expected = bytes.fromhex("1e 0c 01 06ce5903a2010000") + b"\x02k1\x02v1\x03\x02k2\x02v2\x03\x02k1\x02v3"
    assert result.record == expected
    assert (result.first_seq, result.last_seq, result.position, result.end_position) == (2, 4, 23, 23 + 31)
    assert read(directory / f"1_{OBSERVED_TS}.log") == HELLO_RECORD + expected
    assert log.last_assigned == 4 and log.last_held == 4 and log.first_available == 1


def test_index_interval_128_with_107_byte_records(open_storage_log, tmp_path):
    log = open_storage_log(storage_config(log_index_interval_bytes=128))
    for i in range(10):
        result = log.append(bundle_for_record(107))
        assert (result.first_seq, result.position) == (i + 1, i * 107)
    log.flush()
    assert read(tmp_path / "p" / "1.index") == OBSERVED_INDEX
    assert os.path.getsize(tmp_path / "p" / f"1_{OBSERVED_TS}.log") == 1070


def test_one_kib_segments_roll_and_retention_as_observed(open_storage_log, tmp_path, storage_clock):
    sealed = []
    config = storage_config(log_segment_bytes=1024, log_index_interval_bytes=128, log_retention_bytes=2048)
    log = open_storage_log(config, on_seal=sealed.append)
    for _ in range(91):
        storage_clock.advance(1)
        log.append(bundle_for_record(107))
    directory = tmp_path / "p"
    files = segment_files(directory)
    # Only one sealed segment survives 2 KiB retention (two of them are 2140 bytes), so first_available = 81.
    ilogs = [f for f in files if f.endswith(".ilog")]
    assert len(ilogs) == 1 and re.fullmatch(r"81-90_\d+\.ilog", ilogs[0])
    assert f"91_{OBSERVED_TS + 91}.log" in files
    assert files == sorted(["81.index", "91.index", ilogs[0], f"91_{OBSERVED_TS + 91}.log"])
    assert log.first_available == 81 and log.last_assigned == 91
    assert [(s.base, s.last, s.size) for s in sealed] == [(b, b + 9, 1070) for b in range(1, 90, 10)]
    # freezeTS is the .log's mtime at roll time, and the sealed index is the observed one
    segment = log.segments[0]
    assert segment.freeze_ts == int(os.stat(directory / ilogs[0]).st_mtime)
    assert ilogs[0] == f"81-90_{segment.freeze_ts}.ilog"
    assert read(directory / "81.index") == OBSERVED_INDEX


def test_segment_exceeds_its_maximum_by_one_bundle(open_storage_log):
    log = open_storage_log(storage_config(log_segment_bytes=64))
    for _ in range(3):
        log.append(bundle_for_record(107))
    assert [(s.base, s.last, s.size) for s in log.segments] == [(1, 1, 107), (2, 2, 107)]
    assert (log.active.base, log.active.size) == (3, 107)


def test_roll_by_size_only_once_strictly_larger(open_storage_log):
    log = open_storage_log(storage_config(log_segment_bytes=214))
    log.append(bundle_for_record(107))
    log.append(bundle_for_record(107))  # size 107: no roll
    log.append(bundle_for_record(107))  # size 214 is not > 214: no roll
    assert log.segments == ()
    log.append(bundle_for_record(107))  # size 321 > 214: roll before this append
    assert [(s.base, s.last) for s in log.segments] == [(1, 3)]
    assert log.active.base == 4


def test_roll_by_index_size(open_storage_log):
    config = storage_config(log_index_interval_bytes=128, log_index_size_max_bytes=128)
    log = open_storage_log(config)
    # One entry per two 107-byte records; 17 entries (136 bytes) are more than 128: record 33 closes the segment.
    for _ in range(34):
        log.append(bundle_for_record(107))
    assert [(s.base, s.last) for s in log.segments] == [(1, 33)]
    assert len(log.segments[0].index) == 17
    assert log.active.base == 34


def test_roll_by_age_is_one_week_and_ignores_log_roll_secs(open_storage_log, storage_clock):
    log = open_storage_log(storage_config(log_roll_secs=60))
    log.append(bundle_for_record(50))
    assert log.active.roll_age_s == 604800
    storage_clock.advance(604800)
    log.append(bundle_for_record(50))
    assert log.segments == ()
    storage_clock.advance(1)
    log.append(bundle_for_record(50))
    assert [(s.base, s.last) for s in log.segments] == [(1, 2)]
    assert log.active.created_ts == int(storage_clock.now)


def test_roll_by_age_with_jitter(open_storage_log, storage_clock):
    log = open_storage_log(storage_config(log_roll_jitter_secs=7200), rng=random.Random(3))
    log.append(bundle_for_record(50))
    age = log.active.roll_age_s
    assert age == max(random.Random(3).randint(0, 7200), 3600)
    storage_clock.advance(age)
    log.append(bundle_for_record(50))
    assert log.segments == ()
    storage_clock.advance(1)
    log.append(bundle_for_record(50))
    assert len(log.segments) == 1


def test_roll_age_never_below_an_hour():
    config = storage_config(log_roll_jitter_secs=10)
    assert {roll_age_s(config, random.Random(seed)) for seed in range(20)} == {3600}
    assert roll_age_s(storage_config(), random.Random(0)) == 604800


def test_an_empty_active_segment_never_rolls(open_storage_log, storage_clock):
    log = open_storage_log(storage_config(log_segment_bytes=64))
    storage_clock.advance(10 * 604800)
    log.append(bundle_for_record(107))
    assert log.segments == () and log.active.base == 1


def test_seal_active_and_on_seal(open_storage_log, tmp_path):
    sealed = []
    log = open_storage_log(on_seal=sealed.append)
    assert log.seal_active() is None
    log.append(bundle_for_record(20))
    log.append(bundle_for_record(20))
    segment = log.seal_active()
    assert sealed == [segment] and (segment.base, segment.last, segment.size) == (1, 2, 40)
    assert log.active is None and log.first_available == 1 and log.last_assigned == 2
    assert os.path.exists(segment.path) and segment.path.endswith(f"1-2_{segment.freeze_ts}.ilog")
    assert log.append(bundle_for_record(20)).segment_base == 3
    assert log.stats().bytes == 60 and log.stats().segments == 2


def test_a_sealed_active_segment_hands_its_reader_over(open_storage_log):
    """Once sealed, the active segment object has no file to read: it says so instead of answering None."""
    log = open_storage_log()
    log.append(bundle_for_record(20))
    active = log.active
    sealed = log.seal_active()
    assert sealed.reader().fileno() >= 0
    with pytest.raises(ValueError, match="no longer the active one"):
        active.reader()


def test_failed_on_seal_does_not_fail_the_append(open_storage_log, caplog):
    def boom(segment):
        raise RuntimeError("copier down")

    log = open_storage_log(storage_config(log_segment_bytes=64), on_seal=boom)
    log.append(bundle_for_record(107))
    result = log.append(bundle_for_record(107))
    assert result.first_seq == 2 and len(log.segments) == 1
    assert "on_seal callback failed" in caplog.text


def test_failed_write_is_cut_back_and_not_assigned(open_storage_log, monkeypatch):
    """On the reference tail, whose os.write can be replaced (tests/storage/test_appender.py fails real writes of both)."""
    import tiered.storage.segment as segment_module

    monkeypatch.setenv(PRODUCE_PATH_ENV, "python")
    log = open_storage_log()
    log.append(bundle_for_record(50))
    real_write = os.write

    def half_then_fail(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(segment_module.os, "write", half_then_fail)
    with pytest.raises(OSError):
        log.append(bundle_for_record(50))
    monkeypatch.undo()
    assert log.last_assigned == 1 and log.active.size == 50
    assert os.path.getsize(log.active.path) == 50
    assert log.append(bundle_for_record(50)).first_seq == 2
    assert os.path.getsize(log.active.path) == 100


def test_flush_messages_triggers_fdatasync(open_storage_log, monkeypatch):
    import tiered.storage.segment as segment_module

    synced = []
    monkeypatch.setattr(segment_module.os, "fdatasync", lambda fd: synced.append(fd))
    log = open_storage_log(storage_config(flush_messages=3))
    log.append(bundle_for_record(20))
    log.append(bundle_for_record(20))
    assert synced == []
    log.append(bundle_for_record(20))
    assert len(synced) == 2  # the log and its index
    log.append(bundle_for_record(20))
    assert len(synced) == 2


def test_flush_secs_triggers_fdatasync(open_storage_log, monkeypatch, storage_clock):
    import tiered.storage.segment as segment_module

    synced = []
    monkeypatch.setattr(segment_module.os, "fdatasync", lambda fd: synced.append(fd))
    log = open_storage_log(storage_config(flush_secs=5))
    log.append(bundle_for_record(20))
    assert synced == []
    storage_clock.advance(5)
    log.append(bundle_for_record(20))
    assert len(synced) == 2
