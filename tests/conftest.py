"""Shared fixtures. Each module in tests/support/ is a pytest plugin owning one real part (PostgreSQL, S3, helm...);
ports.py and forkserver.py hold no fixture (ports.py is imported by the others), so they are not loaded as plugins."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.support.{p.stem}" for p in (Path(__file__).parent / "support").glob("*.py")
    if p.stem not in ("__init__", "ports", "forkserver")
)
