"""Shared fixtures. Each module in tests/support/ is a pytest plugin owning one real part (PostgreSQL, S3, helm...)."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.support.{p.stem}" for p in (Path(__file__).parent / "support").glob("*.py") if p.stem != "__init__"
)
