"""tiered.spark.session: a session whose workers can run the data source, and a one-sentence error, before anything
runs, when they cannot (instead of `No module named 'pyarrow'` deep in a Spark traceback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv

import pytest

from tiered.spark.session import WorkerEnvironmentError, check_worker_python, register, worker_python
from tests.support.broker import REPO, BrokerProcess
from tests.support.cli import tiered


def test_the_worker_interpreter_follows_pysparks_rule():
    assert worker_python({"spark.pyspark.python": "/a/python"}, {"PYSPARK_PYTHON": "/b/python"}) == "/a/python"
    assert worker_python({"spark.pyspark.python": None}, {"PYSPARK_PYTHON": "/b/python"}) == "/b/python"
    assert worker_python({}, {}) == "python3"


def test_this_interpreter_can_run_the_workers():
    check_worker_python(sys.executable)


def test_an_interpreter_without_the_packages_is_named_with_the_fix(tmp_path):
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)  # a real interpreter with nothing installed
    with pytest.raises(WorkerEnvironmentError) as refused:
        check_worker_python(str(bare / "bin" / "python"))
    message = str(refused.value)
    assert "\n" not in message and f"Spark's Python workers run {bare}/bin/python, which fails to import" in message
    assert "No module named" in message and f"set PYSPARK_PYTHON (or spark.pyspark.python)" in message
    assert sys.executable in message and "local_session()" in message
    with pytest.raises(WorkerEnvironmentError, match="which cannot be run"):
        check_worker_python(str(tmp_path / "no-such-python"))


def test_register_checks_then_registers_on_a_session_whose_workers_fit(spark):
    register(spark)  # the shared session's workers run this interpreter


SCRIPT = """
from tiered.spark.session import local_session
spark = local_session("local[1]", conf={"spark.ui.enabled": "false"})
df = spark.read.format("tiered").option("catalog", CATALOG).option("store", STORE).option("topic", "t").load()
print(sorted(r.value.decode() for r in df.collect()))
spark.stop()
"""


def test_local_session_reads_without_any_spark_environment_set(tmp_path):
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("Spark needs Java (make system-deps installs it)")
    data = tmp_path / "data"
    broker = BrokerProcess(data, "--block-max-age-ms", "20").start()
    try:
        tiered("topic", "create", "-b", f"127.0.0.1:{broker.port}", "t", "1")
        tiered("produce", "-b", f"127.0.0.1:{broker.port}", "-t", "t", "a", "b", "c")
    finally:
        assert broker.terminate() == 0
    state = data.resolve() / ".tiered"
    script = SCRIPT.replace("CATALOG", repr(f"sqlite:///{state / 'catalog.db'}")).replace(
        "STORE", repr(f"file://{state / 'objects'}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_LOCAL"))}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, timeout=240)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().strip().splitlines()[-1] == "['a', 'b', 'c']"
