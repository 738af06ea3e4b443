"""Spark for tests: one local[2] SparkSession for the whole test run, with the `tiered` data source registered.

Fixture:
    spark   (session) the SparkSession. Its JVM, and so every Python worker it starts, gets an environment of its
            own: PYSPARK_PYTHON (this interpreter), SPARK_LOCAL_IP=127.0.0.1, PYTHONPATH with the checkout (workers
            import `tiered` from it), and AWS settings pointing at the session's moto server (dummy credentials,
            AWS_ENDPOINT_URL, no config files). The test process's own environment is left as it was.

Skipped, not failed, when pyspark or Java is missing (`make test` installs both).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def spark_environment(s3_endpoint_url: str) -> dict[str, str]:
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": python_path,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint_url,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="session")
def spark(s3_server):
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("Spark needs Java (make system-deps installs it)")
    from pyspark.sql import SparkSession

    from tiered.spark import TieredDataSource

    with _environment(spark_environment(s3_server.moto_url)):
        session = (
            SparkSession.builder.master("local[2]")
            .appName("tiered-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(TieredDataSource)
    try:
        yield session
    finally:
        session.stop()
