"""README.md's "Using it", run as written: every command of its code block, in order, against a broker on a fresh
data directory, from the directory a user runs them in. The block is parsed from the README, so the README cannot
drift from the program."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.broker import REPO, BrokerProcess


def readme_commands() -> list[tuple[str, str]]:
    """(command, comment) for each line of the first indented code block under `## Using it`."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"((?:\n {4}\S.*)+)", section)
    assert block is not None, "README's Using it has no indented code block"
    out = []
    for line in block.group(1).strip("\n").splitlines():
        command, _, comment = line.strip().partition("  # ")
        out.append((command.strip(), comment.strip()))
    return out


def _user_dir(tmp_path: Path) -> Path:
    """A directory laid out as the README assumes: `.venv/bin/tiered` here, `data/` the broker's data directory."""
    bindir = tmp_path / ".venv" / "bin"
    bindir.mkdir(parents=True)
    wrapper = bindir / "tiered"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tiered.cli.main "$@"\n')
    wrapper.chmod(0o755)
    return tmp_path


def test_every_command_of_using_it_works_in_order_on_a_fresh_data_directory(tmp_path):
    commands = readme_commands()
    assert len(commands) >= 8 and all(c.startswith((".venv/bin/tiered ", "seq ")) for c, _ in commands)
    home = _user_dir(tmp_path)
    broker = BrokerProcess(home / "data").start()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TIERED_BROKER": f"127.0.0.1:{broker.port}"}
    outputs: list[str] = []
    try:
        for command, comment in commands:
            if "follow" in comment:
                outputs.append(_follow_then_interrupt(command, home, env))
                continue
            proc = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=home, env=env,
                                  capture_output=True, timeout=120)
            err = proc.stderr.decode()
            assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{proc.stdout!r}\n{err}"
            assert "Traceback" not in err, (command, err)
            outputs.append(proc.stdout.decode())
    finally:
        broker.terminate()
    text = dict(zip((c for c, _ in commands), outputs))
    drained = next(out for c, out in text.items() if " -d " in c)
    assert drained.splitlines() == ["1\thello", "2\tworld"]
    verified = next(out for c, out in text.items() if " verify " in c)
    assert ": ok:" in verified and "BAD" not in verified and "3 messages" in verified
    described = next(out for c, out in text.items() if "describe" in c)
    assert described.splitlines()[1:] == ["0\t1\t3", "1\t1\t1000", "2\t0\t0", "3\t0\t0"]


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _follow_then_interrupt(command: str, home: Path, env: dict) -> str:
    """Runs a following consume; a message produced meanwhile shows up at once (its response is flushed), then
    Ctrl-C stops it with status 130, no traceback, and only data on stdout."""
    topic = re.search(r"-t (\S+)", command).group(1)
    # As a shell starts a foreground job: SIGINT at its default. A suite started in the background (`cmd &` in a
    # script) inherits SIGINT ignored, and exec keeps it ignored: the Ctrl-C below would then never arrive.
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=home, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_sigint_default)
    got = b""
    try:
        time.sleep(2.0)  # it starts at the end: nothing is printed until a new message comes
        subprocess.run([str(home / ".venv/bin/tiered"), "produce", "-t", topic, "later"], env=env, check=True,
                       capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while not got.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                got += os.read(proc.stdout.fileno(), 4096)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, (proc.returncode, err)
    assert b"Traceback" not in err, err
    assert (got + out).splitlines() == [b"3\tlater"], (got, out, err)
    return (got + out).decode()
