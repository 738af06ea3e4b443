"""Fixtures that run a real broker: in-process (`broker`, `client`) or as a child process (`broker_process`)."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tiered.client import Client
from tiered.config import Settings
from tiered.server.app import App

from tests.support.ports import free_port  # noqa: F401 (tests import it from here too)
from tests.support.spawner import Spawned, Spawner

REPO = Path(__file__).resolve().parents[2]


def local_settings(data_dir: Path, **overrides) -> Settings:
    base = Settings(data_dir=Path(data_dir), listen="127.0.0.1:0", http_listen="off")
    return replace(base, **overrides)


@pytest.fixture
async def broker(tmp_path):
    """A local-only broker (no tiering) on an ephemeral port; `broker.broker.port` is its port."""
    app = App(local_settings(tmp_path / "data"), local_only=True)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture
async def client(broker):
    c = await Client.connect("127.0.0.1", broker.broker.port)
    try:
        yield c
    finally:
        await c.close()


# What `tiered serve` imports before it binds its port (the command line, the broker, the tier and the clients of the
# store and the catalog): imported once by the spawner, not by each broker.
SERVE_IMPORTS = """
import sys
import tiered.cli, tiered.cli.main
tiered.cli.main.build_parser()
del sys.modules["tiered.cli.main"], tiered.cli.main
import tiered.cli.serve, tiered.server.app, tiered.tiering.service, tiered.tiering.objects.s3_store
import aiobotocore.session, boto3, botocore.session, psycopg, sqlalchemy
"""

# The child: `python -m tiered.cli.main ARGS...` as the interpreter runs it (runpy, as __main__).
SERVE = """
import runpy, sys
sys.argv = ["-m", *sys.argv[1:]]
runpy.run_module("tiered.cli.main", run_name="__main__", alter_sys=True)
"""

_spawning = threading.Lock()
_spawner: Spawner | None = None


def _spawner_of_this_process() -> Spawner:
    global _spawner
    with _spawning:
        if _spawner is None or not _spawner.alive:
            _spawner = Spawner(SERVE_IMPORTS, cwd=REPO, env={"PYTHONPATH": str(REPO)})
            atexit.register(_spawner.close)
        return _spawner


class BrokerProcess:
    """`tiered serve` in a child process, as an operator runs it: forked from a spawner that imported it once
    (tests/support/spawner.py), or a fresh interpreter when the environment given changes how one starts (a
    PYTHON* variable, such as the native modules' fallback test's PYTHONPATH)."""

    def __init__(self, data_dir: Path, *extra: str, env: dict | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.extra = extra
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.forked = not any(name.startswith("PYTHON") for name in env or {})
        self.proc: subprocess.Popen | Spawned | None = None
        self.log_path = data_dir.parent / f"broker-{self.port}.log"

    def start(self, timeout_s: float = 30.0) -> "BrokerProcess":
        args = ["serve", "-p", str(self.data_dir), "-l", f"127.0.0.1:{self.port}", "-P", "off", *self.extra]
        if self.forked:
            self.proc = _spawner_of_this_process().spawn(SERVE, args, log=self.log_path, env=self.env,
                                                        cwd=Path.cwd())
        else:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen([sys.executable, "-m", "tiered.cli.main", *args], env=self.env,
                                             stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.output()}")
            if self._pinged(0.5):
                return self
        self.kill()
        raise RuntimeError(f"broker did not listen within {timeout_s} s:\n{self.output()}")

    def _pinged(self, timeout_s: float) -> bool:
        """Whether the broker serves: it binds its port before it has joined the service, and sends TANK's Ping
        to a connection only once it serves."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as sock:
                return len(sock.recv(5)) > 0
        except OSError:
            time.sleep(0.05)
            return False

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout_s)
        return self.proc.returncode if self.proc else 0


@pytest.fixture
def broker_process(tmp_path):
    started: list[BrokerProcess] = []

    def make(*extra: str, data_dir: Path | None = None, env: dict | None = None) -> BrokerProcess:
        bp = BrokerProcess(data_dir or tmp_path / "data", *extra, env=env)
        started.append(bp)
        return bp.start()

    yield make
    for bp in started:
        bp.kill()
