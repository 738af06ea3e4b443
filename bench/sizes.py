"""The sizes a benchmark runs at, and how it says it cannot run on this machine.

Every benchmark takes `--quick` and `--smoke` through `add_size_options`:
- full (no option): the size whose figures go into docs/benchmarks.md;
- `--quick`: short runs, to look at a change in a couple of minutes;
- `--smoke`: the smallest size that still runs every step of the benchmark once (its figures mean nothing).
  tests/test_bench_smoke.py runs every benchmark of bench/__main__.py at this size, so that a change of schema or
  API that breaks a benchmark fails the suite.

A benchmark that needs what this machine lacks (valgrind, PostgreSQL's server binaries) calls `cannot_run`: one line
on stderr and the exit status CANNOT_RUN, which the smoke test reports as a skip with that line, not a failure.
"""

from __future__ import annotations

import argparse
import enum
import sys
from typing import NoReturn, TypeVar

# The exit status of a benchmark that cannot run here (automake's "skipped").
CANNOT_RUN = 77

T = TypeVar("T")


class Size(enum.Enum):
    FULL = "full"
    QUICK = "quick"
    SMOKE = "smoke"

    def pick(self, full: T, quick: T, smoke: T) -> T:
        """The value for this size."""
        return {Size.FULL: full, Size.QUICK: quick, Size.SMOKE: smoke}[self]

    @property
    def short(self) -> bool:
        """Quick or smoke: whatever a benchmark leaves out of short runs is left out."""
        return self is not Size.FULL

    @property
    def flags(self) -> list[str]:
        """The command-line options that select this size (for a benchmark run as a command of its own)."""
        return [] if self is Size.FULL else [f"--{self.value}"]


def add_size_options(parser: argparse.ArgumentParser, quick: str = "short runs",
                     smoke: str = "the smallest size that runs every step once (figures mean nothing)") -> None:
    """Adds --quick and --smoke (exclusive); `size_of(args)` reads them."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help=quick)
    group.add_argument("--smoke", action="store_true", help=smoke)


def size_of(args: argparse.Namespace) -> Size:
    return Size.SMOKE if args.smoke else Size.QUICK if args.quick else Size.FULL


def cannot_run(reason: str) -> NoReturn:
    """Ends a benchmark that needs what this machine lacks: `reason` on stderr, exit status CANNOT_RUN."""
    print(f"cannot run here: {reason}", file=sys.stderr, flush=True)
    sys.exit(CANNOT_RUN)
