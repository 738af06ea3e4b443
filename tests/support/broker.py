"""Fixtures that run a real broker: in-process (`broker`, `client`) or as a child process (`broker_process`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tiered.client import Client
from tiered.config import Settings
from tiered.server.app import App

from tests.support.ports import free_port  # noqa: F401 (tests import it from here too)

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


class BrokerProcess:
    """`tiered serve` in a child process, as an operator runs it."""

    def __init__(self, data_dir: Path, *extra: str, env: dict | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.extra = extra
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"broker-{self.port}.log"

    def start(self, timeout_s: float = 30.0) -> "BrokerProcess":
        cmd = [sys.executable, "-m", "tiered.cli.main", "serve", "-p", str(self.data_dir), "-l",
               f"127.0.0.1:{self.port}", "-P", "off", *self.extra]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
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
