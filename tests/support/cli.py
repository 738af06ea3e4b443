"""The `tiered` command line run as a user runs it: a child process, its output captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.broker import REPO


def tiered(*args: str, input: bytes | None = None, check: bool = True, env: dict | None = None,
           cwd: Path | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`tiered ARGS...`; with `check`, a non-zero exit fails the test with both outputs."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
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
