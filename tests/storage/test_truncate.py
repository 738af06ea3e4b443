"""Cutting a partition back to a seq (tiered.storage.truncate): what remains is exactly the records up to it, in
TANK's files, and a cut interrupted at any step is finished by running it again."""

from __future__ import annotations

import os
import random

import pytest

from tiered.storage import PartitionLog
from tiered.storage import truncate as truncate_module
from tiered.storage.truncate import truncate_partition_dir

from tests.support.storage_helpers import plain_bundle, sparse_bundle, storage_config

CONFIG = storage_config(log_segment_bytes=64, log_index_interval_bytes=128)


def build(directory) -> list:
    """Records 1..12 over several segments, a sparse jump 20..22, and 23..25 in the active segment."""
    log = PartitionLog.open(str(directory), CONFIG, rng=random.Random(1))
    written = [log.append(plain_bundle(b"v%02d" % i * 8)) for i in range(1, 13)]
    written.append(log.append(sparse_bundle(20, 22)))
    written += [log.append(plain_bundle(b"w%02d" % i * 8)) for i in range(3)]
    log.close()
    return written


def held(directory) -> list[tuple[int, int, bytes]]:
    log = PartitionLog.open(str(directory), CONFIG, rng=random.Random(1))
    try:
        return [(r.first_seq, r.last_seq, r.record) for r in log.iter_records(1, 1 << 40)]
    finally:
        log.close()


@pytest.mark.parametrize("keep", [0, 1, 5, 12, 22, 23, 25, 30])
def test_a_cut_keeps_exactly_the_records_up_to_keep(tmp_path, keep):
    written = build(tmp_path / "p")
    expected = [(w.first_seq, w.last_seq, w.record) for w in written if w.last_seq <= keep]
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG, rng=random.Random(1))
    log.truncate_after(keep)
    assert log.last_held == (expected[-1][1] if expected else 0)
    if expected:
        assert log.last_assigned == expected[-1][1]
        appended = log.append(plain_bundle(b"next"))  # the log goes on from there
        assert appended.first_seq == expected[-1][1] + 1
        expected.append((appended.first_seq, appended.last_seq, appended.record))
    log.close()
    assert held(tmp_path / "p") == expected
    reopened = PartitionLog.open(str(tmp_path / "p"), CONFIG, rng=random.Random(1))
    assert reopened.recovery.cut == []  # nothing torn: the cut left whole records only
    reopened.close()


def test_a_cut_inside_a_sealed_segment_reopens_it_as_the_active_one(tmp_path):
    build(tmp_path / "p")
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG, rng=random.Random(1))
    sealed = [s for s in log.segments if s.base <= 5 <= s.last][0]
    log.truncate_after(5)
    assert log.active is not None and log.active.base == sealed.base and log.active.last == 5
    assert all(s.last < sealed.base for s in log.segments)
    log.close()


@pytest.mark.parametrize("stop_after", range(1, 8))
def test_a_cut_interrupted_after_any_step_is_finished_by_running_it_again(tmp_path, monkeypatch, stop_after):
    """A crash between any two file operations (unlink, rename, truncate) leaves a directory recovery opens, and the
    same cut run again ends where an uninterrupted one does."""
    written = build(tmp_path / "p")
    expected = [(w.first_seq, w.last_seq, w.record) for w in written if w.last_seq <= 7]
    steps = [0]

    class Crash(Exception):
        pass

    def counting(fn):
        def step(*args, **kwargs):
            steps[0] += 1
            if steps[0] > stop_after:
                raise Crash()
            return fn(*args, **kwargs)
        return step

    for name in ("unlink", "rename", "truncate"):
        monkeypatch.setattr(truncate_module.os, name, counting(getattr(os, name)))
    try:
        truncate_partition_dir(str(tmp_path / "p"), 7)
    except Crash:
        pass
    monkeypatch.undo()
    opened = PartitionLog.open(str(tmp_path / "p"), CONFIG, rng=random.Random(1))  # recovery copes
    opened.truncate_after(7)
    opened.close()
    assert held(tmp_path / "p") == expected
