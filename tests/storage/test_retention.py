"""Local retention: TANK's DELETE policy by count, bytes and age, with may_delete holding segments back."""

import os
from dataclasses import dataclass

from tests.support.storage_helpers import bundle_for_record, storage_config
from tiered.storage.retention import select_expired, select_for_deletion


@dataclass
class Seg:
    base: int
    size: int
    freeze_ts: int


SEGS = [Seg(1, 100, 1000), Seg(11, 100, 2000), Seg(21, 100, 3000), Seg(31, 100, 4000)]


def bases(segments):
    return [s.base for s in segments]


def test_no_limits_keep_everything():
    assert select_for_deletion(SEGS, storage_config(), 10**9) == []


def test_by_count():
    assert bases(select_for_deletion(SEGS, storage_config(retention_segments_count=2), 0)) == [1, 11]
    assert bases(select_for_deletion(SEGS, storage_config(retention_segments_count=4), 0)) == []


def test_by_bytes():
    assert bases(select_for_deletion(SEGS, storage_config(log_retention_bytes=250), 0)) == [1, 11]
    assert bases(select_for_deletion(SEGS, storage_config(log_retention_bytes=400), 0)) == []
    assert bases(select_for_deletion(SEGS, storage_config(log_retention_bytes=399), 0)) == [1]


def test_by_age_uses_freeze_ts_strictly():
    config = storage_config(log_retention_secs=1000)
    assert bases(select_for_deletion(SEGS, config, 3000)) == [1]  # 2000 + 1000 < 3000 is false
    assert bases(select_for_deletion(SEGS, config, 3001)) == [1, 11]
    assert bases(select_for_deletion(SEGS, config, 10**6)) == [1, 11, 21, 31]


def test_any_limit_suffices():
    config = storage_config(retention_segments_count=3, log_retention_secs=1000)
    assert bases(select_for_deletion(SEGS, config, 3500)) == [1, 11]


def test_may_delete_stops_the_pass_without_skipping():
    config = storage_config(retention_segments_count=2)
    assert bases(select_for_deletion(SEGS, config, 0, lambda s: s.base != 11)) == [1]
    assert bases(select_for_deletion(SEGS, config, 0, lambda s: s.base != 1)) == []


def test_cleanup_policy_deletes_nothing():
    assert select_for_deletion(SEGS, storage_config(retention_segments_count=2, log_cleanup_policy="cleanup"), 0) == []


def test_select_expired_for_remote_limits():
    assert bases(select_expired(SEGS, max_count=0, max_bytes=150, max_age_s=0, now_s=0)) == [1, 11, 21]


def fill(log, n):
    for _ in range(n):
        log.append(bundle_for_record(107))


def test_log_enforces_retention_on_roll_and_removes_files(open_storage_log):
    log = open_storage_log(storage_config(log_segment_bytes=64, retention_segments_count=2))
    fill(log, 3)
    first_paths = [log.segments[0].path, log.segments[0].index_path]
    fill(log, 3)
    assert [(s.base, s.last) for s in log.segments] == [(4, 4), (5, 5)]
    assert log.first_available == 4 and log.active.base == 6
    assert not any(os.path.exists(p) for p in first_paths)


def test_may_delete_holds_segments_until_allowed(open_storage_log, storage_clock):
    copied = set()
    config = storage_config(log_segment_bytes=64, retention_segments_count=2)
    log = open_storage_log(config, may_delete=lambda s: s.base in copied)
    fill(log, 6)
    assert [s.base for s in log.segments] == [1, 2, 3, 4, 5]
    copied.update({1, 3})
    deleted = log.enforce_retention(storage_clock(), lambda s: s.base in copied)
    assert [s.base for s in deleted] == [1]  # 2 is not copied yet: deletion stops there, 3 waits
    assert log.first_available == 2
    assert [s.base for s in log.enforce_retention(storage_clock())] == [2, 3]
    assert [s.base for s in log.segments] == [4, 5] and log.first_available == 4


def test_retention_by_time_on_a_timer(open_storage_log, storage_clock):
    log = open_storage_log(storage_config(log_segment_bytes=64, log_retention_secs=3600))
    fill(log, 4)
    freeze = [s.freeze_ts for s in log.segments]
    assert log.enforce_retention(min(freeze) + 3600) == []
    deleted = log.enforce_retention(max(freeze) + 3601)
    assert len(deleted) == 3 and log.segments == () and log.first_available == 4
    assert all(s.deleted for s in deleted)
    assert log.active is not None and log.read(4, 1000, log.last_assigned).first_bundle_seq == 4


def test_deleted_segment_stays_readable_until_its_last_reader_lets_go(open_storage_log, storage_clock):
    import gc
    import weakref

    log = open_storage_log(storage_config(log_segment_bytes=64))
    fill(log, 2)
    segment = log.segments[0]
    chunk = log.read(1, 1000, log.last_assigned)
    log.reconfigure(storage_config(log_segment_bytes=64, log_retention_secs=1))
    assert log.enforce_retention(segment.freeze_ts + 2) == [segment]
    assert not os.path.exists(segment.path) and log.stats().segments == 1
    # a consume that was being streamed still reads the whole chunk from the unlinked file
    assert len(os.pread(chunk.file.fileno(), chunk.size, chunk.start_position)) == 107
    fd = chunk.file.fileno()
    alive = weakref.ref(chunk.file)
    del chunk
    gc.collect()
    assert alive() is None
    try:
        os.fstat(fd)
        reopened = os.readlink(f"/proc/self/fd/{fd}")  # the number may be reused, but not for that file
        assert segment.path not in reopened
    except OSError:
        pass
