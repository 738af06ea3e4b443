"""Key compaction of sealed local segments against the reference model (tests/support/compaction.py), with
TANK-format checks of every file it writes and reads through PartitionLog.locate."""

from __future__ import annotations

import os
import random
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.compaction import (
    Bundle,
    Model,
    append_workload,
    check_partition_files,
    log_messages,
    random_workload,
    rows,
    segment_bytes,
)
from tests.support.storage_helpers import FakeClock, locate, storage_config
from tiered.protocol.bundle import Message, decode_bundle, encode_bundle, maybe_record, read_bundle_header
from tiered.bounds import Eof
from tiered.storage import PartitionLog, ReadRange
from tiered.storage.compaction import output_allowance, compact_partition, compaction_due
from tiered.storage.compaction_checkpoint import read_checkpoint
from tiered.storage.compaction_plan import SegmentTally, plan_groups
from tiered.storage.segment import SealedSegment

RETENTION_S = 100
CONFIG = storage_config(
    log_segment_bytes=700,
    log_index_interval_bytes=128,
    log_cleanup_policy="cleanup",
    log_cleaner_delete_retention_secs=RETENTION_S,
)
NOW = 1_800_000_000.0


def open_log(directory, config=CONFIG, **kwargs) -> PartitionLog:
    kwargs.setdefault("now_s", FakeClock())
    return PartitionLog.open(str(directory), config, **kwargs)


def sealed_last(log: PartitionLog) -> int:
    return log.segments[-1].last if log.segments else 0


def expect_after_pass(log: PartitionLog, model: Model, now_s: float) -> list:
    """The model's view of the log after a pass at `now_s`: the sealed range compacted, the rest as it is."""
    upto = sealed_last(log)
    everything = log_messages(log)
    return model.compact([m for m in everything if m.seq <= upto], int(now_s * 1000)) + [
        m for m in everything if m.seq > upto
    ]


def first_served(log: PartitionLog, seq: int):
    """The first message a consume for `seq` is answered with, or None for an EOF answer."""
    got = locate(log, seq, 1 << 20)
    if isinstance(got, Eof):
        return None
    assert isinstance(got, ReadRange), got
    data = os.pread(got.file.fileno(), got.size, got.start_position)
    start, end = maybe_record(data)
    assert read_bundle_header(data[start:end]).sparse == got.first_bundle_sparse
    return next(m for m in decode_bundle(data[start:end], got.first_bundle_seq) if m.seq >= seq)


def check_reads(log: PartitionLog, expected: list) -> None:
    """Every seq from first available to the hwmark resolves to the next message kept (EOF past the last one)."""
    seqs = [m.seq for m in expected]
    i = 0
    for seq in range(log.first_available, log.last_assigned + 1):
        while i < len(seqs) and seqs[i] < seq:
            i += 1
        got = first_served(log, seq)
        want = expected[i] if i < len(expected) else None
        assert (got and got.seq, got and got.value) == (want and want.seq, want and want.value), seq


def run_and_check(log: PartitionLog, model: Model, now_s: float, **kwargs):
    expected = expect_after_pass(log, model, now_s)
    first_available, last_assigned = log.first_available, log.last_assigned
    spans = [(s.base, s.last) for s in log.segments]
    active = segment_bytes(log.directory).get(log.active.filename) if log.active else None
    report = compact_partition(log, now_s, force=True, **kwargs)
    assert report.skipped is None and report.stopped is None, report
    assert rows(log_messages(log)) == rows(expected)
    assert (log.first_available, log.last_assigned) == (first_available, last_assigned)
    if spans:
        assert (log.segments[0].base, log.segments[-1].last) == (spans[0][0], spans[-1][1])
    if log.active:
        assert segment_bytes(log.directory)[log.active.filename] == active  # the active segment is never touched
    log.flush()  # the active segment's index entries reach its file in batches
    assert [(s.base, s.last) for s in log.segments] == check_partition_files(log.directory, 128)
    check_reads(log, expected)
    return report, expected


keys = st.one_of(st.none(), st.just(b""), st.sampled_from([b"a", b"b", b"c", b"k" * 40, b"\x00\xff"]))
values = st.one_of(st.just(b""), st.binary(max_size=40), st.just(b"x" * 600))
bundles = st.builds(
    Bundle,
    messages=st.lists(st.tuples(keys, values), min_size=1, max_size=20).map(tuple),
    codec=st.sampled_from([0, 1]),
    gap=st.sampled_from([0, 0, 0, 1, 4]),
    seal_after=st.sampled_from([False] * 6 + [True]),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(bundles, min_size=1, max_size=40), st.booleans(), st.lists(bundles, max_size=15))
def test_compaction_equals_the_model_over_passes_and_reopens(workload, seal_last, later):
    with tempfile.TemporaryDirectory() as tmp:
        log = open_log(tmp)
        try:
            append_workload(log, workload)
            if seal_last:
                log.seal_active()
            model = Model(RETENTION_S * 1000)
            if not log.segments:
                assert compact_partition(log, NOW, force=True).skipped
                return
            _, expected = run_and_check(log, model, NOW)
            # More history, a second pass before the tombstones' retention, a third after it.
            append_workload(log, later)
            log.seal_active()
            run_and_check(log, model, NOW + RETENTION_S / 2)
            report, expected = run_and_check(log, model, NOW + 2 * RETENTION_S)
            last_assigned = log.last_assigned
            log.close()
            log = open_log(tmp)
            assert log.recovery.clean, log.recovery
            assert rows(log_messages(log)) == rows(expected)
            assert log.last_assigned == last_assigned  # even when compaction removed the last messages
        finally:
            log.close()


def test_a_tiny_compressed_group_that_grows_when_rewritten_is_still_compacted(tmp_path):
    # Found by the property test above: a snappy bundle of three messages, the last two under one 40-byte key,
    # re-encoded without the older one takes more than 1.2 times its input (the repeated key compressed well); a
    # ratio alone stopped every pass at that group.
    log = open_log(tmp_path / "p")
    model = Model(RETENTION_S * 1000)
    append_workload(log, [Bundle(((b"", b""), (b"k" * 40, b""), (b"k" * 40, b"")), codec=1, gap=0, seal_after=True)])
    report, expected = run_and_check(log, model, NOW)
    assert report.groups == 1 and [m.seq for m in log_messages(log)] == [1, 3] == [m.seq for m in expected]


def test_latest_value_per_key_survives_tombstones_go_after_their_retention(tmp_path):
    log = open_log(tmp_path / "p")
    log.append(encode_bundle([Message(b"v1", b"a", 1), Message(b"v1", b"b", 1), Message(b"free", None, 1)]))
    log.append(encode_bundle([Message(b"v2", b"a", 2), Message(b"", b"b", 2), Message(b"", b"", 2)]))
    log.append(encode_bundle([Message(b"v3", b"c", 3)]))
    log.seal_active()
    report = compact_partition(log, NOW, force=True)
    assert [(m.seq, m.key, m.value) for m in log_messages(log)] == [
        (3, None, b"free"), (4, b"a", b"v2"), (5, b"b", b""), (6, b"", b""), (7, b"c", b"v3")]
    assert (report.keys, report.tombstones_kept, report.tombstones_dropped) == (3, 1, 0)
    assert (report.messages_before, report.messages_after) == (7, 5)
    report = compact_partition(log, NOW + RETENTION_S - 1, force=True)
    assert report.groups == 0 and 5 in [m.seq for m in log_messages(log)]  # still inside its retention
    report = compact_partition(log, NOW + RETENTION_S, force=True)
    assert [m.seq for m in log_messages(log)] == [3, 4, 6, 7]
    assert report.tombstones_dropped == 1
    log.close()


def test_a_range_of_expired_tombstones_keeps_its_last_message(tmp_path):
    log = open_log(tmp_path / "p", storage_config(log_cleanup_policy="cleanup", log_cleaner_delete_retention_secs=0))
    log.append(encode_bundle([Message(b"", b"a", 1), Message(b"", b"b", 1)]))
    log.seal_active()
    compact_partition(log, NOW, force=True)
    assert [(m.seq, m.key) for m in log_messages(log)] == [(2, b"b")]
    assert log.first_available == 1 and [(s.base, s.last) for s in log.segments] == [(1, 2)]
    assert first_served(log, 1).seq == 2
    log.close()


def test_a_removed_seq_resolves_to_the_next_kept_message_and_a_removed_tail_to_eof(tmp_path):
    log = open_log(tmp_path / "p")
    log.append(encode_bundle([Message(b"old", b"k", 1)] * 3 + [Message(b"keep", None, 1)] + [Message(b"mid", b"m", 1)]))
    log.append(encode_bundle([Message(b"new", b"m", 1)] * 2 + [Message(b"last", b"k", 1)]))
    log.seal_active()
    compact_partition(log, NOW, force=True)
    assert [m.seq for m in log_messages(log)] == [4, 7, 8]
    assert [first_served(log, s).seq for s in range(1, 9)] == [4, 4, 4, 4, 7, 7, 7, 8]
    # Seqs past the last kept message of the range: nothing to send yet, and no boundary error.
    log.append(encode_bundle([Message(b"x", b"k", 1)] * 3))
    log.seal_active()
    compact_partition(log, NOW, force=True)
    assert [m.seq for m in log_messages(log)] == [4, 7, 11]
    assert first_served(log, 9).seq == 11
    log.append(encode_bundle([Message(b"y", None, 1)]))
    assert first_served(log, 10).seq == 11
    log.close()


def test_a_seq_removed_from_a_segments_end_is_answered_locally_under_a_lower_tier(tmp_path):
    """With a tier below, a seq between two local segments is the tier's (across_gaps=False); a seq compaction
    removed from the end of a segment is not: the next segment answers, never the bucket's uncompacted copy."""
    log = open_log(tmp_path / "p", storage_config(log_segment_bytes=64, log_cleanup_policy="cleanup"))
    value = b"v" * 40
    log.append(encode_bundle([Message(value, b"k", 1), Message(value, None, 1), Message(value, b"k", 1)]))
    log.seal_active()
    log.append(encode_bundle([Message(value, b"k", 1), Message(value, None, 1)]))
    log.seal_active()
    log.append(encode_bundle([Message(b"f", None, 1)]))
    report = compact_partition(log, NOW, force=True, stop_check=lambda: None)
    assert report.groups == 1 and [(s.base, s.last) for s in log.segments] == [(1, 3), (4, 5)]
    assert [m.seq for m in log_messages(log)] == [2, 4, 5, 6]
    got = log.read(3, 4096, log.last_assigned, across_gaps=False)
    assert got is not None and got.first_bundle_seq == 4
    # Segment names keep covering the seqs they replace; a real gap between segments is still the tier's.
    log.ensure_next_seq(20)
    log.append(encode_bundle([Message(b"g", None, 1)]))
    assert log.read(10, 4096, log.last_assigned, across_gaps=False) is None
    log.close()


def test_a_stop_check_ends_a_pass_before_its_next_group(tmp_path):
    log = open_log(tmp_path / "p", storage_config(log_segment_bytes=64, log_cleanup_policy="cleanup"))
    for i in range(4):
        log.append(encode_bundle([Message(b"v" * 40, b"k%d" % i, 1)] * 2))
        log.seal_active()
    asked = []

    def stop_after_one() -> str | None:
        asked.append(1)
        return "enough" if len(asked) > 1 else None

    report = compact_partition(log, NOW, force=True, stop_check=stop_after_one)
    assert report.groups == 1 and report.stopped == "enough" and report.error is None
    assert read_checkpoint(log.directory).cleaned_upto < log.segments[-1].last
    log.close()


def test_tail_removed_with_no_later_message_answers_eof(tmp_path):
    log = open_log(tmp_path / "p")
    log.append(encode_bundle([Message(b"a", b"k", 1), Message(b"b", b"j", 1), Message(b"c", b"k", 1)]))
    log.append(encode_bundle([Message(b"d", b"j", 1)]))
    log.append(encode_bundle([Message(b"e", b"k", 1)]))
    log.seal_active()
    compact_partition(log, NOW, force=True)
    assert [m.seq for m in log_messages(log)] == [4, 5]
    log.close()
    log = open_log(tmp_path / "p")
    assert log.active is None and log.last_assigned == 5
    log.append(encode_bundle([Message(b"f", b"z", 1)]))
    assert [m.seq for m in log_messages(log)] == [4, 5, 6]
    log.close()


def test_groups_merge_small_segments_and_respect_the_segment_size(tmp_path):
    config = storage_config(log_segment_bytes=2000, log_index_interval_bytes=128, log_cleanup_policy="cleanup")
    log = open_log(tmp_path / "p", config)
    rng = random.Random(5)
    for i in range(400):
        log.append(encode_bundle([Message(rng.randbytes(30), b"k%d" % rng.randrange(10), i)], codec=0))
    log.seal_active()
    before = len(log.segments)
    report = compact_partition(log, NOW, force=True)
    assert len(log.segments) < before and report.segments_after == len(log.segments)
    assert sum(1 for _ in log_messages(log)) == 10
    # Many segments of history that keep all their messages get merged up to about log.segment.bytes each.
    for i in range(400):
        log.append(encode_bundle([Message(rng.randbytes(30), None, i)], codec=0))
    log.seal_active()
    compact_partition(log, NOW, force=True)
    sizes = [s.size for s in log.segments]
    assert all(size <= 2000 + 100 for size in sizes), sizes
    assert check_partition_files(log.directory, 128)
    log.close()


def test_peak_extra_disk_space_is_at_most_the_allowance_of_one_group(tmp_path):
    config = storage_config(log_segment_bytes=4096, log_index_interval_bytes=128, log_cleanup_policy="cleanup")
    log = open_log(tmp_path / "p", config)
    append_workload(log, random_workload(random.Random(3), 300, keys=30, value_bytes=60))
    log.seal_active()
    start = sum(os.path.getsize(os.path.join(log.directory, n)) for n in os.listdir(log.directory))
    peak = [0]

    def measure(_step: str) -> None:
        total = sum(os.path.getsize(os.path.join(log.directory, n)) for n in os.listdir(log.directory))
        peak[0] = max(peak[0], total - start)

    report = compact_partition(log, NOW, force=True, on_step=measure)
    assert report.groups >= 3 and report.bytes_after < report.bytes_before
    assert 0 < peak[0] <= output_allowance(report.largest_group_bytes)
    log.close()


def test_a_group_whose_output_would_pass_the_allowance_stops_the_pass(tmp_path, monkeypatch):
    import tiered.storage.compaction as compaction

    log = open_log(tmp_path / "p")
    append_workload(log, random_workload(random.Random(4), 80, keys=5))
    log.seal_active()
    before = segment_bytes(log.directory)
    monkeypatch.setattr(compaction, "OUTPUT_ALLOWANCE", 0.01)
    monkeypatch.setattr(compaction, "OUTPUT_SLACK_BYTES", 0)
    report = compact_partition(log, NOW, force=True)
    assert report.groups == 0 and "passed" in report.stopped
    assert segment_bytes(log.directory) == before
    assert not [n for n in os.listdir(log.directory) if n.endswith((".cleaned", ".swap"))]
    assert read_checkpoint(log.directory).cleaned_upto == 0
    log.close()


def test_trigger_follows_the_dirty_ratio_and_the_policy(tmp_path):
    config = storage_config(log_cleanup_policy="cleanup", log_cleaner_min_cleanable_ratio=0.6)
    log = open_log(tmp_path / "p", config)
    assert not compaction_due(log)
    for _ in range(3):
        log.append(encode_bundle([Message(b"v" * 50, b"k", 1)] * 5))
        log.seal_active()
    assert compaction_due(log)
    assert compact_partition(log, NOW).passes == 1
    assert not compaction_due(log) and compact_partition(log, NOW).skipped
    log.append(encode_bundle([Message(b"v" * 50, b"k", 1)] * 5))
    log.seal_active()
    clean = sum(s.size for s in log.segments[:-1])
    assert compaction_due(log) == (log.segments[-1].size / (clean + log.segments[-1].size) >= 0.6)
    log.reconfigure(storage_config(log_cleanup_policy="delete"))
    assert not compaction_due(log)
    assert "not cleanup" in compact_partition(log, NOW, force=True).skipped
    log.close()


def test_segments_the_tiering_layer_still_needs_are_not_rewritten(tmp_path):
    keep = set()
    log = open_log(tmp_path / "p", may_delete=lambda segment: segment.base not in keep)
    for _ in range(4):
        log.append(encode_bundle([Message(b"v", b"k", 1)] * 3))
        log.seal_active()
    keep.add(log.segments[2].base)
    compact_partition(log, NOW, force=True)
    # Only the first two segments were the range: their messages are superseded within it but the last of them.
    assert [m.seq for m in log_messages(log)] == [6, 7, 8, 9, 10, 11, 12]
    log.close()


def test_one_compaction_at_a_time_per_partition(tmp_path):
    log = open_log(tmp_path / "p")
    log.append(encode_bundle([Message(b"v", b"k", 1)] * 3))
    log.seal_active()
    inner = []
    report = compact_partition(log, NOW, force=True,
                               on_step=lambda step: inner.append(compact_partition(log, NOW, force=True)))
    assert report.groups == 1 and inner and all("running" in r.skipped for r in inner)
    log.close()


def tallies(*specs):
    """SegmentTally per (base, last, size, messages, kept)."""
    out = []
    for base, last, size, messages, kept in specs:
        tally = SegmentTally(SealedSegment("/nonexistent", base, last, 1, size), messages)
        tally.kept = kept
        out.append(tally)
    return out


def test_plan_groups_by_size_with_segments_that_keep_nothing_riding_along():
    plan = plan_groups(tallies((1, 10, 400, 10, 0), (11, 20, 400, 10, 5), (21, 30, 400, 10, 10),
                               (31, 40, 900, 10, 10), (41, 50, 400, 10, 0)), limit_bytes=1000)
    assert [[s.base for s in g.segments] for g in plan] == [[1, 11, 21], [31, 41]]
    assert [(g.messages, g.kept, g.changes_something) for g in plan] == [(30, 15, True), (20, 10, True)]
    # One segment larger than the limit is a group of its own; alone and losing nothing, it is left as it is.
    plan = plan_groups(tallies((1, 10, 5000, 10, 10), (11, 20, 100, 10, 10)), limit_bytes=1000)
    assert [(g.base, g.last, g.changes_something) for g in plan] == [(1, 10, False), (11, 20, False)]


def test_a_compacted_segment_whose_index_is_lost_keeps_its_name(tmp_path):
    config = storage_config(log_index_interval_bytes=128, log_cleanup_policy="cleanup",
                            log_cleaner_delete_retention_secs=0)
    log = open_log(tmp_path / "p", config)
    log.append(encode_bundle([Message(b"a", b"k", 1), Message(b"b", None, 1), Message(b"c", b"k", 1)]))
    log.append(encode_bundle([Message(b"d", b"j", 1), Message(b"", b"j", 1)]))  # j deleted, its tombstone expired
    log.seal_active()
    compact_partition(log, NOW, force=True)
    [segment] = log.segments
    assert (segment.base, segment.last) == (1, 5) and [m.seq for m in log_messages(log)] == [2, 3]
    log.close()
    os.unlink(tmp_path / "p" / "1.index")
    log = open_log(tmp_path / "p", config)
    assert log.recovery.rebuilt_indexes == ["1.index"] and not log.recovery.renamed
    assert [(s.base, s.last) for s in log.segments] == [(1, 5)] and log.last_assigned == 5
    assert check_partition_files(log.directory, 128) == [(1, 5)]
    log.close()


def test_a_swap_failing_after_its_commit_asks_for_a_reopen_which_finishes_it(tmp_path, monkeypatch):
    import tiered.storage.compaction_swap as swap

    log = open_log(tmp_path / "p")
    log.append(encode_bundle([Message(b"v", b"k", 1)] * 4))
    log.seal_active()
    real_install = swap._install

    def failing_install(directory, final_name):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(swap, "_install", failing_install)
    report = compact_partition(log, NOW, force=True)
    assert report.needs_reopen and "committed" in report.stopped
    assert "reopen" in compact_partition(log, NOW, force=True).skipped
    log.close()
    monkeypatch.setattr(swap, "_install", real_install)
    log = open_log(tmp_path / "p")
    assert [m.seq for m in log_messages(log)] == [4] and log.recovery.compaction
    log.close()


def test_segments_that_change_during_a_pass_stop_it_and_nothing_is_swapped(tmp_path):
    log = open_log(tmp_path / "p")
    for _ in range(3):
        log.append(encode_bundle([Message(b"v", b"k", 1)] * 3))
        log.seal_active()

    def retention_meanwhile(step: str) -> None:
        if step.startswith("written"):  # the output is complete; retention deletes an input before the swap
            log.reconfigure(storage_config(retention_segments_count=2))
            log.enforce_retention(NOW)

    report = compact_partition(log, NOW, force=True, on_step=retention_meanwhile)
    assert report.groups == 0 and "changed" in report.stopped
    assert [(s.base, s.last) for s in log.segments] == [(4, 6), (7, 9)]
    assert sorted(n for n in os.listdir(log.directory) if "ilog" in n) == [s.filename for s in log.segments]
    assert [m.seq for m in log_messages(log)] == list(range(4, 10))
    log.close()
