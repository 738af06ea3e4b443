"""The spawner that forks the suite's brokers (tests/support/spawner.py): each child is a process of its own, as a
fresh interpreter would be: its own process group, log, environment, working directory and argv, its exit status
and a signal's as the parent sees them; children run side by side."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from tests.support.broker import REPO
from tests.support.spawner import Spawner

REPORT = """
import json, os, sys
print(json.dumps({"pgid": os.getpgid(0), "pid": os.getpid(), "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": os.environ.get("SPAWNED"), "stdin": sys.stdin.read()}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""

WAIT = """
import sys, time
print("waiting", flush=True)
time.sleep(60)
"""


@pytest.fixture
def spawner():
    with_imports = Spawner("import json", cwd=REPO)
    yield with_imports
    with_imports.close()


def test_a_child_is_a_process_of_its_own(spawner, tmp_path):
    log = tmp_path / "child.log"
    child = spawner.spawn(REPORT, ["3", "more"], log=log, env={"SPAWNED": "yes"}, cwd=tmp_path)
    assert child.wait(30) == 3 and child.poll() == 3
    report, err = log.read_text().splitlines()
    seen = json.loads(report)
    assert seen["pgid"] == seen["pid"] == child.pid
    assert seen["argv"] == ["3", "more"] and seen["cwd"] == str(tmp_path) and seen["env"] == "yes"
    assert seen["stdin"] == "" and err == "to stderr"


def test_children_run_side_by_side_and_die_by_their_signals(spawner, tmp_path):
    killed = spawner.spawn(WAIT, [], log=tmp_path / "a.log", env={}, cwd=tmp_path)
    stopped = spawner.spawn(WAIT, [], log=tmp_path / "b.log", env={}, cwd=tmp_path)
    assert killed.poll() is None and stopped.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        stopped.wait(0.1)
    killed.send_signal(signal.SIGKILL)
    stopped.send_signal(signal.SIGTERM)
    assert killed.wait(30) == -signal.SIGKILL and stopped.wait(30) == -signal.SIGTERM
