"""A Spark session that can run the `tiered` data source, and registering the source with a check first.

    from tiered.spark.session import local_session, register
    spark = local_session()        # local[*]: workers on this interpreter, the data source registered
    register(spark)                # a session built elsewhere: check its workers (local masters), then register

Spark starts its Python workers with `spark.pyspark.python`, else $PYSPARK_PYTHON, else `python3` on PATH: often
not the interpreter (virtual environment) tiered is installed in. Such workers fail deep inside a Spark traceback
(`No module named 'pyarrow'`), and the data source's own code cannot report it: with PySpark 4 even its planning runs
in those workers. So the check runs here, in the driver, before anything is registered: for a local master it asks
the worker interpreter to import what the source's workers import, and names the fix in one sentence. On a cluster
the executors' interpreters are not reachable from the driver: install `tiered[spark]` there and set
`spark.pyspark.python` (docs/spark.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any, Mapping

# What a worker imports to plan and read splits (datasource and streaming import pyspark, which Spark provides).
WORKER_IMPORTS = ("tiered.spark.execution", "tiered.spark.objects", "tiered.spark.listing", "pyarrow", "boto3")


class WorkerEnvironmentError(RuntimeError):
    """Spark's Python workers cannot import what the tiered data source needs."""


def worker_python(conf: Mapping[str, str | None], environ: Mapping[str, str] = os.environ) -> str:
    """The interpreter Spark starts its Python workers with (PySpark's own rule)."""
    return conf.get("spark.pyspark.python") or environ.get("PYSPARK_PYTHON") or "python3"


def check_worker_python(python: str) -> None:
    """Raises WorkerEnvironmentError unless `python` imports everything in WORKER_IMPORTS."""
    code = "; ".join(f"import {module}" for module in WORKER_IMPORTS)
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        failure = f"cannot be run ({exc.strerror or exc})"
    else:
        if proc.returncode == 0:
            return
        lines = proc.stderr.strip().splitlines()
        failure = f"fails to import what it needs ({lines[-1] if lines else f'exit status {proc.returncode}'})"
    raise WorkerEnvironmentError(
        f"Spark's Python workers run {python}, which {failure}: set PYSPARK_PYTHON (or spark.pyspark.python) to an "
        f"interpreter with tiered[spark] installed, such as {sys.executable}, or build the session with "
        "tiered.spark.session.local_session()"
    )


def register(spark) -> None:
    """Registers the `tiered` data source on `spark`, after checking a local master's workers can run it."""
    from tiered.spark.datasource import TieredDataSource

    conf = spark.sparkContext.getConf()
    if (conf.get("spark.master") or "").startswith("local"):
        check_worker_python(worker_python({"spark.pyspark.python": conf.get("spark.pyspark.python")}))
    spark.dataSource.register(TieredDataSource)


def _host_resolves() -> bool:
    try:
        socket.getaddrinfo(socket.gethostname(), None)
        return True
    except OSError:
        return False


def local_session(master: str = "local[*]", app_name: str = "tiered", conf: Mapping[str, Any] | None = None):
    """A SparkSession on this machine whose workers run this interpreter, with the `tiered` source registered.

    Sets PYSPARK_PYTHON (and PYSPARK_DRIVER_PYTHON) to this interpreter, and SPARK_LOCAL_IP to 127.0.0.1 when the host
    name does not resolve (Spark would otherwise fail to bind), unless the environment already sets it. `conf` adds
    Spark settings (e.g. {"spark.sql.session.timeZone": "UTC"}).
    """
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if "SPARK_LOCAL_IP" not in os.environ and not _host_resolves():
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    builder = SparkSession.builder.master(master).appName(app_name).config("spark.pyspark.python", sys.executable)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
