"""Shared fixtures. Each module in tests/support/ is a pytest plugin owning one real part (PostgreSQL, S3, helm...);
ports.py holds no fixture and is imported by the others, so it is not loaded as a plugin."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.support.{p.stem}" for p in (Path(__file__).parent / "support").glob("*.py")
    if p.stem not in ("__init__", "ports")
)
