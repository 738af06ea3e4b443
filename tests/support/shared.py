"""What the workers of one pytest-xdist run build once and share: `once_per_run`.

A module-scoped fixture runs once per worker that runs a test of the module, and work stealing spreads a module's
tests over the workers: an expensive fixture (a virtual environment with the package installed) would be built
twice. `once_per_run` builds it once for the run instead, in the run's temp dir, under a file lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temp dir of this run: under pytest-xdist the parent of the workers' own (one per run), else this
    process's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`build(directory)` once for the whole run: the first worker to ask builds into <run temp dir>/<name> under a
    file lock; the others wait for it and get the same directory. A build that raised is tried again (from an empty
    directory) by the next worker that asks, so each worker's test reports the failure."""
    root = run_root(tmp_path_factory)
    directory, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            build(directory)
            done.touch()
    return directory
