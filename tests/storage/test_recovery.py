"""Opening a partition after a crash: torn tails, missing or short indexes, zero-size and legacy files."""

import logging
import os
import shutil

import pytest

from tests.support.storage_helpers import bundle_for_record, plain_bundle, segment_files, sparse_bundle, storage_config
from tiered.protocol.bundle import Message, encode_bundle
from tiered.storage import PartitionLog, RecoveryError
from tiered.storage.appender import INDEX_WRITE_BATCH

CONFIG = storage_config(log_index_interval_bytes=128)


def build_reference(directory, *, seal_first=False):
    """A log with plain, sparse and snappy records; the last one has a 2-byte length prefix."""
    log = PartitionLog.open(str(directory), CONFIG)
    written = [log.append(bundle_for_record(100)) for _ in range(3)]
    if seal_first:
        log.seal_active()
    written.append(log.append(sparse_bundle(10, 11, 15)))
    written.append(log.append(encode_bundle([Message(b"z" * 300, b"k", 5)], codec=0)))
    log.close()
    assert written[-1].record[1] & 0x80 == 0 and written[-1].record[0] & 0x80  # 2-byte varint prefix
    return written


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def active_log_path(directory):
    [name] = [n for n in os.listdir(directory) if n.endswith(".log")]
    return os.path.join(directory, name)


def test_clean_reopen_continues_exactly(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    log = PartitionLog.open(str(a), CONFIG)
    for _ in range(7):
        log.append(bundle_for_record(107))
    log.close()
    log = PartitionLog.open(str(a), CONFIG)
    assert log.recovery.clean and log.last_assigned == 7 and log.last_held == 7
    for _ in range(6):
        log.append(bundle_for_record(107))
    log.close()
    reference = PartitionLog.open(str(b), CONFIG)
    for _ in range(13):
        reference.append(bundle_for_record(107))
    reference.close()
    assert read(a / "1.index") == read(b / "1.index")  # since_last_update survived the reopen
    assert read(active_log_path(a)) == read(active_log_path(b))


def test_index_entries_a_kill_left_unwritten_are_re_added(tmp_path):
    """Index entries reach the file in batches (appender.INDEX_WRITE_BATCH): a process killed between two batches
    leaves a file short of its last entries, and the reopen re-adds them, giving TANK's index byte for byte."""
    a, b = tmp_path / "a", tmp_path / "b"
    log = PartitionLog.open(str(a), CONFIG)
    written = [log.append(bundle_for_record(107)) for _ in range(1100)]  # 550 entries: one batch written, 38 not
    on_disk = read(a / "1.index")
    assert len(on_disk) == INDEX_WRITE_BATCH
    for w in written[::97]:  # reads use the in-memory index: unaffected
        assert log.read(w.first_seq, 1, 1100).start_position == w.position
    # Killed: the log is never closed; a second process opens the directory.
    reopened = PartitionLog.open(str(a), CONFIG)
    reference = PartitionLog.open(str(b), CONFIG)
    try:
        for _ in range(1100):
            reference.append(bundle_for_record(107))
        reference.close()
        assert reopened.last_assigned == 1100
        reopened.close()
        assert read(a / "1.index") == read(b / "1.index")
        assert read(a / "1.index")[:INDEX_WRITE_BATCH] == on_disk
    finally:
        log.close()


def test_reopened_log_knows_its_records(tmp_path):
    """What consumers may see of them is the server's decision (tiered.bounds): the log only knows what it holds."""
    build_reference(tmp_path / "p")
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG)
    assert (log.last_assigned, log.last_held, log.first_available) == (16, 16, 1)
    log.close()


def test_torn_tail_cut_at_every_byte_of_the_last_record(tmp_path, caplog):
    written = build_reference(tmp_path / "ref")
    last = written[-1]
    for keep in range(1, len(last.record)):
        case = tmp_path / f"cut{keep}"
        shutil.copytree(tmp_path / "ref", case)
        os.truncate(active_log_path(case), last.position + keep)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tiered.storage"):
            log = PartitionLog.open(str(case), CONFIG)
        try:
            assert log.recovery.bytes_cut == keep, keep
            assert [c.position for c in log.recovery.cut] == [last.position]
            assert "SALVAGED" in caplog.text and f"cut {keep} bytes" in caplog.text
            assert log.last_assigned == written[-2].last_seq == 15
            assert log.active.size == last.position == os.path.getsize(active_log_path(case))
            assert log.read_records(1, 15) == b"".join(w.record for w in written[:-1])
            again = log.append(plain_bundle(b"after"))
            assert (again.first_seq, again.position) == (16, last.position)
        finally:
            log.close()
        shutil.rmtree(case)


@pytest.mark.parametrize(
    "damage",
    [
        b"\x80\x80\x80\x80\x80\x80",  # a length varint longer than 5 bytes
        b"\x00",  # zero-length bundle
        b"\x02\x80\x00",  # reserved flag bit
        b"\x02\x07\x00",  # codec 3
        b"\x03\x00\x00\x00",  # varint count 0
        b"\x0a\x44\x05\x00\x00\x00\x00\x00\x00\x00\x00",  # sparse bundle going back to seq 5
    ],
    ids=["long-varint", "zero-length", "reserved-bit", "codec", "zero-count", "sparse-backwards"],
)
def test_undecodable_tail_is_cut(tmp_path, damage):
    written = build_reference(tmp_path / "p")
    path = active_log_path(tmp_path / "p")
    with open(path, "ab") as f:
        f.write(damage)
    size = os.path.getsize(path)
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG)
    try:
        assert log.recovery.bytes_cut == len(damage) and log.recovery.cut[0].position == size - len(damage)
        assert log.last_assigned == written[-1].last_seq
    finally:
        log.close()


def test_torn_record_the_last_index_entry_points_at(tmp_path):
    # With 107-byte records and interval 128 every other record is indexed: cut into an indexed record.
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG)
    written = [log.append(bundle_for_record(107)) for _ in range(9)]
    log.close()
    index_bytes = read(tmp_path / "p" / "1.index")
    assert log.segments == () and written[-1].position == 856
    os.truncate(active_log_path(tmp_path / "p"), 856 + 50)
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG)
    try:
        assert log.recovery.bytes_cut == 50 and log.last_assigned == 8
        assert read(tmp_path / "p" / "1.index") == index_bytes[:-8]  # the entry at 856 is gone
        assert log.append(bundle_for_record(107)).position == 856
        log.flush()
        assert read(tmp_path / "p" / "1.index") == index_bytes
    finally:
        log.close()


def test_everything_torn_deletes_the_segment(tmp_path):
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG)
    log.append(bundle_for_record(100))
    log.seal_active()
    log.append(bundle_for_record(100))
    active_name = log.active.filename
    log.close()
    os.truncate(active_log_path(tmp_path / "p"), 40)
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG)
    try:
        assert log.active is None and log.last_assigned == 1 and log.recovery.bytes_cut == 40
        assert sorted(name for name, _ in log.recovery.deleted) == sorted([active_name, "2.index"])
        assert [n for n in segment_files(tmp_path / "p") if n.startswith("2")] == []
        assert log.append(bundle_for_record(100)).segment_base == 2
    finally:
        log.close()


@pytest.mark.parametrize("how", ["missing", "empty", "partial-entry", "short", "past-eof", "garbage"])
def test_index_repair(tmp_path, how):
    directory = tmp_path / "p"
    log = PartitionLog.open(str(directory), CONFIG)
    for _ in range(10):
        log.append(bundle_for_record(107))
    log.close()
    index_path = directory / "1.index"
    good = read(index_path)
    if how == "missing":
        os.unlink(index_path)
    elif how == "empty":
        os.truncate(index_path, 0)
    elif how == "partial-entry":
        os.truncate(index_path, len(good) - 3)
    elif how == "short":
        os.truncate(index_path, 16)  # a crash lost the last entries
    elif how == "past-eof":
        with open(index_path, "ab") as f:
            f.write(bytes.fromhex("0a000000 00100000"))
    else:
        with open(index_path, "wb") as f:
            f.write(bytes.fromhex("05000000 10000000 01000000 20000000"))  # not increasing
    log = PartitionLog.open(str(directory), CONFIG)
    try:
        assert read(index_path) == good
        assert list(log.active.index) == [(0, 0), (2, 214), (4, 428), (6, 642), (8, 856)]
        assert log.recovery.rebuilt_indexes or log.recovery.repaired_indexes
        assert log.recovery.bytes_cut == 0 and log.last_assigned == 10
        assert log.read(7, 100, log.last_assigned).start_position == 642
    finally:
        log.close()


def test_zero_size_log_is_deleted(tmp_path):
    directory = tmp_path / "p"
    log = PartitionLog.open(str(directory), CONFIG)
    log.append(bundle_for_record(50))
    log.seal_active()
    log.close()
    open(directory / "2_1795352600.log", "wb").close()
    open(directory / "2.index", "wb").close()
    log = PartitionLog.open(str(directory), CONFIG)
    try:
        assert sorted(name for name, _ in log.recovery.deleted) == ["2.index", "2_1795352600.log"]
        assert log.active is None and log.last_assigned == 1 and log.first_available == 1
        assert not os.path.exists(directory / "2_1795352600.log")
    finally:
        log.close()


def test_sealed_segment_index_rebuilt_and_zero_size_sealed_deleted(tmp_path):
    directory = tmp_path / "p"
    log = PartitionLog.open(str(directory), CONFIG)
    for _ in range(5):
        log.append(bundle_for_record(107))
    sealed = log.seal_active()
    log.append(bundle_for_record(107))
    log.close()
    good = read(directory / "1.index")
    os.unlink(directory / "1.index")
    open(directory / "100-200_5.ilog", "wb").close()
    log = PartitionLog.open(str(directory), CONFIG)
    try:
        assert read(directory / "1.index") == good
        assert "1.index" in log.recovery.rebuilt_indexes
        assert ("100-200_5.ilog", "zero-size sealed segment") in log.recovery.deleted
        assert [(s.base, s.last, s.size) for s in log.segments] == [(1, 5, sealed.size)]
    finally:
        log.close()


def test_legacy_names_are_accepted(tmp_path):
    directory = tmp_path / "p"
    os.makedirs(directory)
    sealed = b"".join(bytes([len(b)]) + b for b in [bundle_for_record(70)] * 2)
    active = bytes([len(bundle_for_record(70))]) + bundle_for_record(70)
    (directory / "1-2.ilog").write_bytes(sealed)
    (directory / "3.log").write_bytes(active)
    log = PartitionLog.open(str(directory), storage_config(log_segment_bytes=64))
    try:
        assert [(s.base, s.last, s.filename) for s in log.segments] == [(1, 2, "1-2.ilog")]
        assert log.segments[0].freeze_ts == int(os.stat(directory / "1-2.ilog").st_mtime)
        assert (log.active.base, log.active.filename, log.last_assigned) == (3, "3.log", 3)
        assert log.read_records(1, 3) == sealed + active
        log.append(bundle_for_record(70))  # rolls the legacy .log into a new-form .ilog
        assert log.segments[1].filename == f"3-3_{log.segments[1].freeze_ts}.ilog"
    finally:
        log.close()


def test_an_older_log_is_sealed_at_open(tmp_path):
    directory = tmp_path / "p"
    os.makedirs(directory)
    record = bytes([len(bundle_for_record(60))]) + bundle_for_record(60)
    (directory / "1_100.log").write_bytes(record * 2)
    (directory / "3_200.log").write_bytes(record)
    log = PartitionLog.open(str(directory), CONFIG)
    try:
        assert [(s.base, s.last) for s in log.segments] == [(1, 2)]
        assert log.recovery.sealed_at_open == [log.segments[0].filename]
        assert log.active.filename == "3_200.log" and log.last_assigned == 3
        assert os.path.exists(directory / "1.index") and os.path.exists(directory / "3.index")
    finally:
        log.close()


def test_overlapping_segments_refuse_to_open(tmp_path):
    directory = tmp_path / "p"
    os.makedirs(directory)
    record = bytes([len(bundle_for_record(60))]) + bundle_for_record(60)
    (directory / "1-5_100.ilog").write_bytes(record * 5)
    (directory / "3_200.log").write_bytes(record)
    with pytest.raises(RecoveryError, match="overlap"):
        PartitionLog.open(str(directory), CONFIG)
    assert sorted(os.listdir(directory)) == ["1-5_100.ilog", "3_200.log"]  # nothing touched


@pytest.mark.parametrize("index", ["kept", "damaged"])
def test_a_sealed_segment_with_garbage_over_its_head_refuses_to_open(tmp_path, index):
    """Bytes overwritten at the head of a sealed segment: with its index sane, the cheap validation alone would open
    it and serve the garbage; with its index damaged too, the walk that rebuilds it would find no whole bundle and
    delete the segment. Both refuse to open, and nothing is touched."""
    directory = tmp_path / "p"
    os.makedirs(directory)
    record = bytes([len(bundle_for_record(60))]) + bundle_for_record(60)
    (directory / "1-5_100.ilog").write_bytes(b"\xff" * 8 + (record * 5)[8:])
    (directory / "1.index").write_bytes(b"" if index == "damaged" else (0).to_bytes(4, "little") * 2)
    (directory / "6_200.log").write_bytes(record)
    before = {name: read(directory / name) for name in os.listdir(directory)}
    with pytest.raises(RecoveryError, match="does not begin with a whole bundle"):
        PartitionLog.open(str(directory), CONFIG)
    assert {name: read(directory / name) for name in os.listdir(directory)} == before


def test_unknown_files_are_reported_and_left_alone(tmp_path):
    directory = tmp_path / "p"
    os.makedirs(directory)
    for name in ("notes.txt", "1_64.index", "5-9_1.ilog.tmp"):
        (directory / name).write_bytes(b"x")
    (directory / "config").write_text("log.segment.bytes=1mb\n")
    log = PartitionLog.open(str(directory), CONFIG)
    try:
        assert sorted(i.name for i in log.recovery.ignored) == ["1_64.index", "5-9_1.ilog.tmp", "notes.txt"]
        assert all(i.reason for i in log.recovery.ignored)
        assert log.recovery.clean and log.last_assigned == 0
        assert sorted(os.listdir(directory)) == ["1_64.index", "5-9_1.ilog.tmp", "config", "notes.txt"]
    finally:
        log.close()
