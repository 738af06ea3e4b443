"""Every benchmark of `python -m bench` runs at its smallest size (`--smoke`), so that a change of schema or API that
breaks one fails the suite rather than the next person who measures. One test per benchmark, from the registry in
bench/__main__.py: a benchmark added there is covered without a change here. A benchmark that cannot run on this
machine (valgrind or PostgreSQL missing) exits with bench.sizes.CANNOT_RUN and its test is skipped with its reason.
Nothing is timed: the figures of a smoke run mean nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import NAMES
from bench.sizes import CANNOT_RUN

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NAMES)
def test_the_benchmark_runs_at_its_smallest_size(name: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--only", name, "--smoke"], cwd=REPO, capture_output=True,
                          text=True, timeout=540)
    if done.returncode == CANNOT_RUN:
        reasons = [line for line in done.stderr.splitlines() if line.startswith("cannot run here:")]
        pytest.skip(f"{name}: {reasons[-1] if reasons else 'cannot run on this machine'}")
    assert done.returncode == 0, f"{name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
    assert "does not exist yet" not in done.stdout, done.stdout
    # Every benchmark prints its figures on stdout, between `python -m bench`'s own header and its closing line.
    own = [line for line in done.stdout.splitlines()
           if line.strip() and not line.startswith(("tiered benchmarks, ", "machine: ", "command: ", "took "))]
    assert own, f"{name} printed no figures:\n{done.stdout[-4000:]}"
