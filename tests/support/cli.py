"""The `tiered` command line run as a user runs it: a child process, its output captured.

A fresh interpreter spends ~0.5 s importing the command line (SQLAlchemy, the client, the catalog) before it does
anything, and the suite runs `tiered` hundreds of times. So `tiered` forks each command from a fork server that
imported the command line's modules once (tests/support/forkserver.py), one per test process: each command is still
a process of its own, with its own argv, environment, working directory, stdin, stdout, stderr and exit status, and
runs `python -m tiered.cli.main` as the interpreter would (runpy, as __main__), from its imports on. A command
started while another is running (tests that run commands side by side from threads) gets a fresh interpreter, as
before, so commands never wait for each other. Tests that start `tiered` with Popen (Ctrl-C, pipes, ptys) and
test_packaging's fresh install still cover the interpreter's own start.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.broker import REPO
from tests.support.forkserver import ForkServer

# What every command imports (build_parser imports each group's module) and what most of them import when they run.
# tiered.cli.main itself leaves: `python -m` runs it as __main__ only, as the child does.
PREAMBLE = """
import sys
import tiered.cli, tiered.cli.main
tiered.cli.main.build_parser()
del sys.modules["tiered.cli.main"], tiered.cli.main
import tiered.catalog.engine, tiered.client, tiered.cost_report, boto3
"""

# The child: the caller's environment (in place: os.environ is the mapping the command line's defaults read),
# working directory and argv, then the module as `python -m` runs it.
COMMAND = """
import json, os, runpy, sys
cwd, environ, *args = sys.argv[1:]
os.environ.clear()
os.environ.update(json.loads(environ))
os.chdir(cwd)
sys.argv = ["-m", *args]
runpy.run_module("tiered.cli.main", run_name="__main__", alter_sys=True)
"""

_forking = threading.Lock()  # held while the fork server runs a command: it runs one at a time
_server: ForkServer | None = None


def _fork_server() -> ForkServer:
    global _server
    if _server is None or not _server.alive:
        _server = ForkServer(PREAMBLE, cwd=REPO, env={"PYTHONPATH": str(REPO)})
        atexit.register(_server.close)
    return _server


def tiered(*args: str, input: bytes | None = None, check: bool = True, env: dict | None = None,
           cwd: Path | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`tiered ARGS...`; with `check`, a non-zero exit fails the test with both outputs."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    if _forking.acquire(blocking=False):
        try:
            proc = _fork_server().call(COMMAND, [str(cwd or os.getcwd()), json.dumps(full_env), *args], timeout_s,
                                       input=input)
        finally:
            _forking.release()
    else:
        proc = subprocess.run([sys.executable, "-m", "tiered.cli.main", *args], input=input, capture_output=True,
                              env=full_env, cwd=cwd, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise AssertionError(f"tiered {' '.join(args)} exited {proc.returncode}:\n{proc.stdout!r}\n{proc.stderr!r}")
    return proc


def one_line_error(proc: subprocess.CompletedProcess, command: str, status: int = 1) -> str:
    """The command failed with `status` and said why in exactly one line starting `tiered <command>: `."""
    err = proc.stderr.decode()
    assert proc.returncode == status, (proc.returncode, err)
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"tiered {command}: "), err
    return err
