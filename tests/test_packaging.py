"""The package as a user installs it: `pip install '.[spark]'` into a fresh virtual environment, without the test
extras (moto brings boto3 into the test environment and would hide a missing declaration), then `tiered --help`,
a replay from a local `file://` store, an import of the Spark data source, and the native modules, built from sources
without the checkout's builds. One virtual environment per run."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from tests.support.broker import REPO, BrokerProcess
from tests.support.cli import tiered
from tests.support.shared import once_per_run

pytestmark = pytest.mark.packaging

SOURCES = ("pyproject.toml", "README.md", "tiered", "migrations")


def _run(argv: list, cwd: Path, timeout_s: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout.decode()}\n{proc.stderr.decode()}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment with `.[spark]` installed from a copy of the checkout (the build writes into
    its source tree), one per run, shared by the pytest-xdist workers. Returns its bin directory."""
    return once_per_run(tmp_path_factory, "packaging", _install) / "venv" / "bin"


def _install(root: Path) -> None:
    source = root / "src"
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        # Without the checkout's built native modules (*.so), as a clean checkout has none: the install builds them.
        copy(REPO / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__", "*.so")}
                                            if (REPO / name).is_dir() else {}))
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    bindir = root / "venv" / "bin"
    proc = _run([bindir / "python", "-m", "pip", "install", "--disable-pip-version-check", f"{source}[spark]"],
                cwd=root)
    said = proc.stdout.decode() + proc.stderr.decode()
    assert "does not provide the extra" not in said, said  # every extra we name exists
    assert "looking at multiple versions" not in said, said  # pip did not backtrack
    _run([bindir / "python", "-m", "pip", "check"], cwd=root)


def test_the_installed_command_runs(installed, tmp_path):
    out = _run([installed / "tiered", "--help"], cwd=tmp_path).stdout.decode()
    for command in ("serve", "topic", "produce", "consume", "replay", "verify", "catalog"):
        assert command in out


def test_the_spark_data_source_imports_with_what_the_extra_installs(installed, tmp_path):
    code = ("import boto3, pyarrow, pyspark; from tiered.spark.datasource import TieredDataSource; "
            "import tiered; print(TieredDataSource.name(), tiered.__file__)")
    out = _run([installed / "python", "-c", code], cwd=tmp_path).stdout.decode().split()
    assert out[0] == "tiered" and str(installed.parent) in out[1]  # the installed package, not the checkout


NATIVE_MODULES = ("tiered.protocol._bundlescan", "tiered.spark._decode", "tiered.storage._appender")


def test_the_native_modules_build_wherever_the_checkout_built_them(installed, tmp_path):
    # All are optional (without a C compiler the package is pure Python), so a source or header the build cannot
    # find would fall back silently: where this checkout's own install compiled a module, the fresh one must too.
    built = [name for name in NATIVE_MODULES if importlib.util.find_spec(name) is not None]
    if not built:
        pytest.skip("this checkout's install built no native module (no C compiler): nothing to compare")
    code = "import importlib, sys; print(*(importlib.import_module(n).__file__ for n in sys.argv[1:]))"
    files = _run([installed / "python", "-c", code, *built], cwd=tmp_path).stdout.decode().split()
    assert len(files) == len(built) and all(f.startswith(str(installed.parent)) and f.endswith(".so") for f in files)


def test_a_replay_from_a_local_store_writes_parquet(installed, tmp_path):
    data = tmp_path / "data"
    broker = BrokerProcess(data, "--block-max-age-ms", "20").start()
    try:
        b = ("-b", f"127.0.0.1:{broker.port}")
        tiered("topic", "create", *b, "events", "2")
        tiered("produce", *b, "-t", "events/1", "-f", "-", input=b"".join(b"m%d\n" % i for i in range(50)))
    finally:
        assert broker.terminate() == 0
    out = tmp_path / "parquet"
    proc = _run([installed / "tiered", "replay", "events", "-p", data, "--parquet", out], cwd=tmp_path)
    assert "replayed 50 messages of events" in proc.stderr.decode()
    code = f"import pyarrow.parquet as pq; print(pq.read_table('{out}').num_rows)"
    assert _run([installed / "python", "-c", code], cwd=tmp_path).stdout.strip() == b"50"
