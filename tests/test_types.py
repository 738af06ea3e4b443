"""The type checker is part of the test command, so that a seam cannot drift silently (a signature changed on one
side only, a None not handled, a field renamed): mypy, configured in pyproject.toml ([tool.mypy]), strict on the
protocol and storage packages and on the seams between the server and the tiered layer; and mypy's stubtest, which
holds the stub of the native module (tiered/protocol/_bundlescan.pyi) to what the built module exports."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.support.broker import REPO


def _mypy(*argv: str) -> tuple[int, str]:
    """Runs a mypy entry point from the repository root with the project's configuration: (exit status, report).
    The cache makes a run after the first one take well under a second. Each test process has its own cache
    (.mypy_cache/<xdist worker>): two mypy runs writing one cache at once could corrupt it."""
    cache = REPO / ".mypy_cache" / os.environ.get("PYTEST_XDIST_WORKER", "main")
    env = {**os.environ, "MYPY_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_checked_files_pass_mypy_strict():
    status, report = _mypy("mypy", "--config-file", "pyproject.toml")
    # Anything besides the one success line (an error, or a note such as an unused config section) fails the test.
    assert status == 0 and report.startswith("Success: no issues found") and report.count("\n") == 1, report


def test_the_stub_of_the_native_module_matches_it():
    if importlib.util.find_spec("tiered.protocol._bundlescan") is None:
        pytest.skip("the native extension is not built (no C compiler at install time): nothing to compare")
    status, report = _mypy("mypy.stubtest", "tiered.protocol._bundlescan", "--mypy-config-file", "pyproject.toml")
    assert status == 0 and report.startswith("Success: no issues found"), report
