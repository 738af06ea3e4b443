"""Shared fixtures. Each module in tests/support/ is a pytest plugin owning one real part (PostgreSQL, S3, helm...);
ports.py, forkserver.py and shared.py hold no fixture (ports.py is imported by the others), so they are not loaded as
plugins."""

import os
from pathlib import Path

import pytest

pytest_plugins = sorted(
    f"tests.support.{p.stem}" for p in (Path(__file__).parent / "support").glob("*.py")
    if p.stem not in ("__init__", "ports", "forkserver", "shared")
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
