"""Shared fixtures. Each module in tests/support/ is a pytest plugin owning one real part (PostgreSQL, S3, helm...);
ports.py, forkserver.py, spawner.py and shared.py hold no fixture (ports.py is imported by the others), so they are
not loaded as plugins."""

import os
from pathlib import Path

import pytest

pytest_plugins = sorted(
    f"tests.support.{p.stem}" for p in (Path(__file__).parent / "support").glob("*.py")
    if p.stem not in ("__init__", "ports", "forkserver", "shared", "spawner")
)


# Every store call the broker makes names the topics it is for (tiered/tiering/objects/meter.py): in tests, a broker's store
# refuses one that does not, in this process and in the brokers started as child processes.
os.environ["TIERED_REQUIRE_ATTRIBUTION"] = "1"


def _no_sync(fd: int) -> None:
    return None


@pytest.fixture(scope="session", autouse=True)
def fsync_off():
    """os.fsync and os.fdatasync are no-ops in the test processes (brokers started as child processes keep them).
    No test crashes the machine, only processes (an exception, kill -9): a reopen reads the page cache either way,
    so what it sees is the same, and the calls are still made, in the same order (tests that check them patch them
    themselves). On a busy disk, fsync was most of the time of the storage crash tests. The tests' PostgreSQL runs
    with fsync=off for the same reason."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", _no_sync)
        patch.setattr(os, "fdatasync", _no_sync)
        yield


# Whole files whose tests are the suite's longest (a minute or so each on 2 shared cores), in the order they run first.
# pytest-xdist's worksteal hands each worker a contiguous half of the collection and, at the end, lets an idle worker
# take the tail of the other's queue: long tests at the tail (where these files are collected) leave one worker
# running a long test alone while the other is done. First, they run while the rest of the suite balances the two
# workers, and the tail is made of short tests. Files move whole, so a module-scoped fixture is still built once.
LONGEST_FIRST = (
    "tests/test_bench_smoke.py",
    "tests/test_native_asan.py",
    "tests/test_packaging.py",
    "tests/cli/test_dev.py",
    "tests/spark/test_session.py",
)


def run_order(nodeid: str) -> int:
    """An item's rank in the run: the files of LONGEST_FIRST in their order, then every other file as collected."""
    path = nodeid.split("::", 1)[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: run_order(item.nodeid))  # stable: the order within a rank is the collection's
