"""Crash safety of the compaction swap: a crash at every step (in-process, and kill -9 of a child process), kill -9
at random moments, and the leftovers of TANK's own protocol. After a reopen the directory must hold, byte for byte,
the state before some group's swap or after it: never both sets of a group, never neither."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.broker import REPO
from tests.support.forkserver import ForkServer
from tests.support.compaction import Model, append_workload, log_messages, random_workload, rows, segment_bytes
from tests.support.storage_helpers import storage_config
from tiered.protocol.bundle import Message, encode_bundle
from tiered.storage import PartitionLog, RecoveryError
from tiered.storage.compaction import compact_partition

CONFIG = storage_config(log_segment_bytes=3000, log_index_interval_bytes=128, log_cleanup_policy="cleanup")
NOW = 1_800_000_000.0


class SimulatedCrash(BaseException):
    """Raised by a step hook: like a kill, no cleanup code of the compaction runs (it only catches Exception)."""


def open_log(directory, config=CONFIG) -> PartitionLog:
    return PartitionLog.open(str(directory), config)


def build_reference(base, bundles: int, value_bytes: int, config=CONFIG):
    """A partition needing a multi-group pass; the step names and the directory after each group of a clean run."""
    source = base / "source"
    log = open_log(source, config)
    append_workload(log, random_workload(random.Random(11), bundles, keys=bundles // 10, value_bytes=value_bytes))
    log.seal_active()
    append_workload(log, random_workload(random.Random(12), 5, keys=12))  # an active segment with data
    expected = Model(CONFIG.log_cleaner_delete_retention_secs * 1000).compact(
        log_messages(log, 1, log.segments[-1].last), int(NOW * 1000))
    log.close()
    run = base / "run"
    shutil.copytree(source, run)
    log = open_log(run, config)
    states = [segment_bytes(str(run))]
    steps: list[str] = []
    report = compact_partition(log, NOW, force=True, on_step=steps.append,
                               on_progress=lambda _report: states.append(segment_bytes(str(run))))
    final = rows(log_messages(log))
    log.close()
    assert report.groups >= 3 and report.stopped is None
    assert report.segments_before > report.groups  # some groups merge segments
    assert rows(expected) == final[: len(expected)]
    return source, steps, states, final


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return build_reference(tmp_path_factory.mktemp("reference"), 120, 40)


def check_reopened(directory, states, final, *, finish: bool = True, config=CONFIG):
    """Reopens a crashed directory; returns its recovery report and which clean-run state it is in."""
    log = open_log(directory, config)
    try:
        on_disk = segment_bytes(str(directory))
        assert on_disk in states, f"not a state a clean run passes through: {sorted(on_disk)}"
        assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".old"))]
        if finish:  # whatever the crash left, the next pass gets to the same messages
            compact_partition(log, NOW, force=True)
            assert rows(log_messages(log)) == final
        return log.recovery, states.index(on_disk)
    finally:
        log.close()


def test_a_crash_at_every_step_leaves_the_old_or_the_new_set(reference, tmp_path):
    source, steps, states, final = reference
    assert any(s.startswith("commit") for s in steps) and any(s.startswith("install") for s in steps)
    for k, step_name in enumerate(steps):
        case = tmp_path / f"step{k}"
        shutil.copytree(source, case)
        log = open_log(case)

        def crash(name: str, seen=[0]) -> None:  # noqa: B006 - a per-case counter
            if seen[0] == k:
                raise SimulatedCrash(name)
            seen[0] += 1

        with pytest.raises(SimulatedCrash):
            compact_partition(log, NOW, force=True, on_step=crash)
        log.close()
        recovery, _ = check_reopened(case, states, final)
        left_files = step_name.startswith(("written", "commit", "drop", "install")) and step_name != "install fsync"
        assert bool(recovery.compaction) == left_files, step_name


CHILD = textwrap.dedent("""
    import os, signal, sys
    from tests.support.storage_helpers import storage_config
    from tiered.storage import PartitionLog
    from tiered.storage.compaction import compact_partition
    directory, kill_at, segment_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    config = storage_config(log_segment_bytes=segment_bytes, log_index_interval_bytes=128, log_cleanup_policy="cleanup")
    log = PartitionLog.open(directory, config)
    seen = [0]
    def step(name):
        if seen[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        seen[0] += 1
    print("ready", flush=True)
    compact_partition(log, {now}, force=True, on_step=step)
    log.close()
""").format(now=NOW)


def run_child(directory, kill_at: int, kill_after_s: float | None = None, wait_s: bool = False, config=CONFIG):
    """Runs a pass in a child killed at step `kill_at` or `kill_after_s` after it starts; its exit status, or with
    `wait_s` how long its pass took."""
    args = [str(directory), str(kill_at), str(config.log_segment_bytes)]
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        started = time.monotonic()
        if kill_after_s is not None:
            time.sleep(kill_after_s)
            proc.send_signal(signal.SIGKILL)
        status = proc.wait(60)
        return time.monotonic() - started if wait_s else status
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()


def test_kill_9_of_a_process_at_every_step_of_three_groups(reference, tmp_path):
    """The children are forked from one process that imported the storage package (tests/support/forkserver.py):
    a real process and a real SIGKILL each, without an interpreter start-up each."""
    source, steps, states, final = reference
    third_group = [i for i, name in enumerate(steps) if name.startswith("write ")][3]
    # fsync off in the children as in this process (tests/conftest.py: fsync_off).
    imports = CHILD.split("directory, kill_at")[0] + "os.fsync = os.fdatasync = lambda fd: None\n"
    with ForkServer(imports, cwd=REPO, env={"PYTHONPATH": str(REPO)}) as children:
        for k in range(third_group):
            case = tmp_path / f"kill{k}"
            shutil.copytree(source, case)
            child = children.run(CHILD, [case, k, CONFIG.log_segment_bytes], timeout_s=60)
            assert child.returncode == -signal.SIGKILL, child.stderr
            check_reopened(case, states, final)


def test_kill_9_at_random_moments(tmp_path):
    config = storage_config(log_segment_bytes=200_000, log_index_interval_bytes=128, log_cleanup_policy="cleanup")
    source, _, states, final = build_reference(tmp_path / "big", 2500, 200, config)  # a pass of about a second
    timing = tmp_path / "timing"
    shutil.copytree(source, timing)
    whole_s = run_child(timing, -1, wait_s=True, config=config)
    rng = random.Random(1)
    reached = set()
    for i in range(6):
        case = tmp_path / f"random{i}"
        shutil.copytree(source, case)
        run_child(case, -1, kill_after_s=rng.uniform(0, whole_s), config=config)
        reached.add(check_reopened(case, states, final, finish=False, config=config)[1])
    assert len(reached) > 1  # the kills did land at different points of the pass


def build_two_segments(directory):
    log = open_log(directory)
    log.append(encode_bundle([Message(b"v1", b"k", 1)] * 3))
    log.seal_active()
    log.append(encode_bundle([Message(b"v2", b"k", 1)] * 3))
    log.seal_active()
    log.close()
    return sorted(n for n in os.listdir(directory) if n.endswith(".ilog"))


def test_tank_style_leftovers_roll_forward(tmp_path):
    """TANK renames outputs to .swap, then inputs to .old, then strips .swap: with .old present it committed."""
    directory = tmp_path / "p"
    first, second = build_two_segments(directory)
    # The output of a TANK pass, named after the seqs it kept: only seq 6 stays.
    out = tmp_path / "out"
    log = PartitionLog.open(str(out), CONFIG)
    log.append(encode_bundle([Message(b"v2", b"k", 1, 6)], sparse=True))
    log.seal_active()
    log.close()
    [tank_output] = [n for n in os.listdir(out) if n.endswith(".ilog")]
    shutil.copy(out / tank_output, directory / f"{tank_output}.swap")
    shutil.copy(out / "6.index", directory / "6.index.swap")
    os.rename(directory / first, directory / f"{first}.old")
    os.rename(directory / "1.index", directory / "1.index.old")
    os.rename(directory / second, directory / f"{second}.old")  # its index not renamed yet: the crash came here
    log = open_log(directory)
    assert [m.seq for m in log_messages(log)] == [6]
    assert sorted(n for n in os.listdir(directory) if not n.startswith(".")) == [tank_output, "6.index"]
    assert not log.recovery.clean
    log.close()


def test_cleaned_files_roll_back_and_a_tank_cleaned_name_is_understood(tmp_path):
    directory = tmp_path / "p"
    build_two_segments(directory)
    before = segment_bytes(str(directory))
    (directory / "7-0_0.ilog.cleaned").write_bytes(b"partial")
    (directory / "1-6_5.ilog.swap").write_bytes(b"whole")
    (directory / "1.index.swap").write_bytes(b"")
    log = open_log(directory)
    assert segment_bytes(str(directory)) == before
    assert {name for _, name in log.recovery.compaction} == {"7-0_0.ilog.cleaned", "1-6_5.ilog.swap", "1.index.swap"}
    log.close()


def test_cleaned_beside_old_is_refused(tmp_path):
    directory = tmp_path / "p"
    first, _ = build_two_segments(directory)
    (directory / "1.index.cleaned").write_bytes(b"")
    os.rename(directory / first, directory / f"{first}.old")
    listing = sorted(os.listdir(directory))
    with pytest.raises(RecoveryError, match="neither set"):
        open_log(directory)
    assert sorted(os.listdir(directory)) == listing
