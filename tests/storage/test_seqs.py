"""Seq assignment: plain, explicit (0x05) and sparse bundles, gaps, ensure_next_seq, durable visibility."""

import os

import pytest

from tests.support.storage_helpers import (
    OBSERVED_TS,
    bundle_for_record,
    locate,
    plain_bundle,
    segment_files,
    sparse_bundle,
)
from tiered.protocol.bundle import decode_bundle
from tiered.protocol.errors import ProtocolError
from tiered.bounds import Boundary, Eof
from tiered.storage import InvalidSeqnums, ReadRange
from tiered.storage.partition_log import MAX_SEQ


def test_plain_bundles_take_consecutive_seqs(open_storage_log):
    log = open_storage_log()
    assert (log.first_available, log.last_assigned, log.last_held) == (0, 0, 0)
    assert log.append(plain_bundle(b"a", b"b", b"c")).first_seq == 1
    result = log.append(plain_bundle(b"d"))
    assert (result.first_seq, result.last_seq) == (4, 4)


def test_explicit_seq_on_an_empty_partition_names_the_segment(open_storage_log, tmp_path):
    log = open_storage_log()
    result = log.append(plain_bundle(b"a", b"b"), base_seq=1000)
    assert (result.first_seq, result.last_seq, result.segment_base) == (1000, 1001, 1000)
    assert segment_files(tmp_path / "p") == ["1000.index", f"1000_{OBSERVED_TS}.log"]
    assert log.first_available == 1000 and log.last_assigned == 1001
    assert log.append(plain_bundle(b"c")).first_seq == 1002


def test_sparse_bundle_takes_seqs_from_its_header_over_base_seq(open_storage_log):
    log = open_storage_log()
    result = log.append(sparse_bundle(1000, 1001, 1005, 1006), base_seq=5)
    assert (result.first_seq, result.last_seq, result.segment_base) == (1000, 1006, 1000)
    assert log.append(plain_bundle(b"x")).first_seq == 1007  # non-sparse bundles continue from last + 1
    assert log.segments == ()


def test_sparse_jump_stays_in_the_segment(open_storage_log):
    log = open_storage_log()
    log.append(plain_bundle(b"a", b"b", b"c"))
    result = log.append(sparse_bundle(10, 12))
    assert (result.first_seq, result.last_seq, result.segment_base) == (10, 12, 1)
    assert log.segments == () and log.active.last == 12


def test_non_sparse_jump_starts_a_new_segment(open_storage_log):
    # Readers derive a non-sparse bundle's seqs from its predecessor, so a jump must start a segment.
    log = open_storage_log()
    log.append(plain_bundle(b"a", b"b", b"c"))
    result = log.append(plain_bundle(b"j"), base_seq=10)
    assert (result.first_seq, result.segment_base, result.position) == (10, 10, 0)
    assert [(s.base, s.last) for s in log.segments] == [(1, 3)]
    # an explicit seq that continues the segment does not roll
    assert log.append(plain_bundle(b"k"), base_seq=11).segment_base == 10


@pytest.mark.parametrize(
    "bundle, base_seq",
    [
        (plain_bundle(b"x"), 3),  # equal to last_assigned
        (plain_bundle(b"x"), 2),
        (plain_bundle(b"x"), 0),
        (sparse_bundle(3, 4), None),
        (sparse_bundle(2), 50),
    ],
)
def test_invalid_seqnums(open_storage_log, bundle, base_seq):
    log = open_storage_log()
    log.append(plain_bundle(b"a", b"b", b"c"))
    with pytest.raises(InvalidSeqnums):
        log.append(bundle, base_seq=base_seq)
    assert log.last_assigned == 3 and log.active.size == log.stats().bytes


def test_observed_invalid_seqnums_case(open_storage_log):
    log = open_storage_log()
    log.append(plain_bundle(b"x"), base_seq=2001)
    with pytest.raises(InvalidSeqnums):
        log.append(plain_bundle(b"y"), base_seq=10)


def test_seqs_stop_at_max_seq(open_storage_log):
    # The catalog holds seqs as signed 64-bit integers: a log never takes one it could not commit.
    log = open_storage_log()
    with pytest.raises(InvalidSeqnums, match="seqs are 1.."):
        log.append(sparse_bundle(MAX_SEQ, MAX_SEQ + 1))
    with pytest.raises(InvalidSeqnums):
        log.append(plain_bundle(b"a", b"b"), base_seq=MAX_SEQ)
    assert log.last_assigned == 0 and log.active is None
    assert log.append(sparse_bundle(MAX_SEQ - 1, MAX_SEQ)).last_seq == MAX_SEQ
    with pytest.raises(InvalidSeqnums):
        log.append(plain_bundle(b"c"))


@pytest.mark.parametrize(
    "bundle",
    [b"", b"\x80\x00\x00", b"\x06\x00", b"\x00\x00", b"\x44" + b"\x00" * 4, b"\x14\x00" + b"\x00" * 8 + b"\x01a",
     b"\x04\x00" + b"\x00" * 8 + b"\x01a\x00"],
    ids=["empty", "reserved-bit", "codec-2", "zero-count", "truncated-sparse", "count-5-holds-1", "trailing-byte"],
)
def test_bad_bundles_raise_protocol_error(open_storage_log, bundle):
    log = open_storage_log()
    with pytest.raises(ProtocolError):
        log.append(bundle)
    assert log.last_assigned == 0 and log.active is None


def test_memoryview_bundles_are_accepted(open_storage_log):
    log = open_storage_log()
    bundle = plain_bundle(b"mv")
    assert log.append(memoryview(bundle)).record == bytes([len(bundle)]) + bundle


def test_ensure_next_seq_on_an_empty_log(open_storage_log, tmp_path):
    log = open_storage_log()
    log.ensure_next_seq(501)
    assert (log.first_available, log.last_assigned, log.last_held) == (0, 500, 0)
    assert locate(log, 0, 100) == Eof(0, 500)
    assert locate(log, 20, 100) == Boundary(0, 500)  # held remotely, not here
    assert locate(log, 501, 100) == Eof(0, 500)
    result = log.append(plain_bundle(b"a"))
    assert (result.first_seq, result.segment_base) == (501, 501)
    assert segment_files(tmp_path / "p") == ["501.index", f"501_{OBSERVED_TS}.log"]
    assert log.first_available == 501
    log.ensure_next_seq(10)  # never moves back
    assert log.last_assigned == 501


def test_ensure_next_seq_on_a_log_that_is_behind(open_storage_log):
    log = open_storage_log()
    log.append(plain_bundle(b"a", b"b"))
    log.ensure_next_seq(100)
    assert log.last_assigned == 99 and log.last_held == 2
    assert isinstance(locate(log, 50, 100), Boundary)  # in the jump: not held locally
    result = log.append(plain_bundle(b"c"))
    assert (result.first_seq, result.segment_base) == (100, 100)
    assert [(s.base, s.last) for s in log.segments] == [(1, 2)]
    assert locate(log, 1, 1000).first_bundle_seq == 1


def test_next_seq_floor_at_open(open_storage_log):
    log = open_storage_log(next_seq_floor=42)
    assert log.last_assigned == 41
    assert log.append(plain_bundle(b"a")).first_seq == 42


def test_read_records_returns_exact_records_across_segments(open_storage_log):
    log = open_storage_log()
    written = [log.append(plain_bundle(b"a", b"b"))]  # 1-2
    written.append(log.append(sparse_bundle(5, 7)))  # 5-7
    written.append(log.append(plain_bundle(b"c")))  # 8
    log.seal_active()
    written.append(log.append(plain_bundle(b"d", b"e")))  # 9-10
    written.append(log.append(plain_bundle(b"f"), base_seq=20))  # 20, new segment
    assert log.read_records(1, 20) == b"".join(w.record for w in written)
    assert log.read_records(2, 5) == written[0].record + written[1].record
    assert log.read_records(3, 4) == b""  # a gap: no record holds these seqs
    assert log.read_records(3, 5) == written[1].record
    assert log.read_records(9, 9) == written[3].record
    assert log.read_records(21, 30) == b""
    stored = list(log.iter_records(6, 20))
    assert [(r.first_seq, r.last_seq, r.segment_base, r.position) for r in stored] == [
        (5, 7, 1, written[1].position),
        (8, 8, 1, written[2].position),
        (9, 10, 9, 0),
        (20, 20, 20, 0),
    ]
    assert [decode_bundle(r.record[1:], r.first_seq)[0].seq for r in stored] == [5, 8, 9, 20]


def test_read_records_returns_what_a_consumer_may_not_see_yet(open_storage_log):
    log = open_storage_log()
    record = log.append(bundle_for_record(40)).record
    assert log.read_records(1, 1) == record


def test_a_seq_span_past_int32_starts_a_new_segment(open_storage_log):
    # Index rel_seqs are u32 and TANK refuses spans above INT32_MAX inside one segment.
    log = open_storage_log()
    log.append(plain_bundle(b"a"))
    far = 1 + 0x7FFF_FFFF
    assert log.append(sparse_bundle(far)).segment_base == 1  # span exactly INT32_MAX: same segment
    result = log.append(sparse_bundle(far + 1, far + 5))
    assert result.segment_base == far + 1 and [(s.base, s.last) for s in log.segments] == [(1, far)]
    assert locate(log, far, 1000).segment is log.segments[0]


def test_a_closed_log_refuses_work(open_storage_log):
    log = open_storage_log()
    log.append(plain_bundle(b"a"))
    log.close()
    log.close()
    for call in (lambda: log.append(plain_bundle(b"b")), lambda: locate(log, 1, 10), log.seal_active):
        with pytest.raises(ValueError):
            call()


def test_a_record_view_of_the_request_writes_the_joined_bytes(open_storage_log, tmp_path):
    """A plain produce's record is appended as the read-only view of its payload (ProducePartition.record): the
    segment files, the records read back and each AppendResult are what the joined record gives, for one-, two- and
    three-byte lengths, across a roll."""
    from tiered.protocol import requests as rq
    from tiered.storage.partition_log import PartitionLog
    from tiered.storage.topic_config import TopicConfig

    bundles = [plain_bundle(b"x" * size) for size in (40, 100, 300, 20_000, 50, 70_000, 60)]
    config = TopicConfig(log_segment_bytes=40_000)
    viewed = open_storage_log(config)
    joined = PartitionLog.open(str(tmp_path / "joined"), config, now_s=viewed._now_s)
    try:
        for bundle in bundles:
            req = rq.ProduceRequest(1, (rq.ProduceTopic("t", (rq.ProducePartition(0, bundle),)),))
            read, [f] = rq.read_checked_produce(bytearray(rq.encode_produce_request(req)), False)
            p = read.topics[0].partitions[0]
            assert p.record is not None and p.record.readonly
            got = viewed.append(p.bundle, None, f, p.record)
            assert got.record is p.record  # no copy
            assert got == joined.append(bytes(p.bundle))
        assert len(viewed.segments) == len(joined.segments) >= 1  # rolled
        assert segment_files(viewed.directory) == segment_files(joined.directory)
        viewed.flush()
        joined.flush()
        for path in segment_files(viewed.directory):
            with open(f"{viewed.directory}/{path}", "rb") as a, open(f"{joined.directory}/{path}", "rb") as b:
                assert a.read() == b.read()
        assert list(viewed.iter_records(1, MAX_SEQ)) == list(joined.iter_records(1, MAX_SEQ))
    finally:
        joined.close()


def test_a_log_opened_new_is_the_log_open_would_recover_from_its_empty_directory(tmp_path, storage_clock,
                                                                                 open_storage_log):
    import random

    from tiered.storage.partition_log import PartitionLog
    from tiered.storage.topic_config import TopicConfig

    (tmp_path / "p").mkdir()
    new = PartitionLog.open_new(str(tmp_path / "p"), TopicConfig(), now_s=storage_clock, rng=random.Random(7))
    assert (new.first_available, new.last_assigned, new.last_held, new.segments) == (0, 0, 0, ())
    assert new.recovery.clean
    assert new.append(plain_bundle(b"a", b"b")).first_seq == 1
    new.close()
    reopened = open_storage_log()  # what it wrote is the same files a log opened by `open` writes
    assert (reopened.first_available, reopened.last_held) == (1, 2)
    assert reopened.append(plain_bundle(b"c")).first_seq == 3


def test_a_log_whose_directory_is_not_made_reads_empty_and_makes_it_at_its_first_write(tmp_path, storage_clock,
                                                                                       open_storage_log, monkeypatch):
    """A partition never written here on a disk whose directories are made at their first write: its log is empty
    and touches nothing on disk (reads, retention, truncation, the next seq) until it writes, which makes its
    directory; the directory's own name is synced at the first roll, with the first segment's."""
    import random

    from tiered.storage import partition_log
    from tiered.storage.partition_log import PartitionLog
    from tiered.storage.topic_config import TopicConfig

    synced: list[str] = []
    monkeypatch.setattr(partition_log, "fsync_dir", lambda path: synced.append(os.path.basename(path)))
    unmade = PartitionLog.open_new(str(tmp_path / "p"), TopicConfig(), now_s=storage_clock, rng=random.Random(7),
                                   made=False)
    assert not unmade.made and not (tmp_path / "p").exists()
    assert unmade.read(1, 1 << 20, 10) is None
    assert unmade.enforce_retention(storage_clock(), lambda _segment: True) == []
    assert unmade.truncate_after(0).records == 0 and unmade.seal_active() is None
    unmade.ensure_next_seq(5)
    assert (unmade.first_available, unmade.last_held, unmade.stats().segments) == (0, 0, 0)
    assert not (tmp_path / "p").exists() and synced == []
    assert unmade.append(plain_bundle(b"a")).first_seq == 5
    assert unmade.made and (tmp_path / "p").is_dir() and synced == []  # no sync on the produce path
    unmade.seal_active()
    assert synced == ["p", tmp_path.name]  # the first roll: the segment's name, then the directory's own
    unmade.append(plain_bundle(b"b"))
    unmade.seal_active()
    assert synced == ["p", tmp_path.name, "p"]
    unmade.make_directory()  # made: nothing to do
    unmade.close()
    assert open_storage_log().last_held == 6

    (tmp_path / "r").write_text("in the way")
    blocked = PartitionLog.open_new(str(tmp_path / "r"), TopicConfig(), now_s=storage_clock, rng=random.Random(7),
                                    made=False)
    with pytest.raises(FileExistsError):  # something in its place is damage, for the caller to report
        blocked.append(plain_bundle(b"a"))
    assert not blocked.made
