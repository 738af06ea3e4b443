"""`tiered dev` as a user runs it: one command brings up PostgreSQL, a local S3 and three brokers as one service;
what it prints is enough to use them; Ctrl-C stops every process it started."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

from tests.support.broker import REPO
from tests.support.cli import tiered
from tests.support.ports import free_port

READY = "ready; Ctrl-C stops everything"


def _consecutive(n: int) -> int:
    for _ in range(20):
        first = free_port()
        if all(free_port() == first + i for i in range(1, n)):
            return first
    raise AssertionError(f"no {n} consecutive free ports")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _read_until_ready(proc: subprocess.Popen, timeout_s: float) -> str:
    assert proc.stdout is not None
    said, deadline = b"", time.monotonic() + timeout_s
    while READY.encode() not in said:
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, (said.decode(), proc.stderr.read().decode() if proc.stderr else "")
        if select.select([proc.stdout], [], [], min(left, 1.0))[0]:
            said += os.read(proc.stdout.fileno(), 65536)
    return said.decode()


def test_tiered_dev_runs_a_durable_service_and_ctrl_c_stops_it(tmp_path):
    port, http, pg, s3 = _consecutive(3), _consecutive(3), free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TIERED_BROKER": ""}
    proc = subprocess.Popen([sys.executable, "-m", "tiered.cli.main", "dev", "--dir", str(tmp_path / "dev"),
                             "--port", str(port), "--http-port", str(http), "--pg-port", str(pg), "--s3-port", str(s3)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        said = _read_until_ready(proc, 180)
        listed = re.search(r"-b (\S+)", said).group(1)
        assert listed == ",".join(f"127.0.0.1:{port + i}" for i in range(3))
        exports = dict(re.findall(r"(\w+)=(\S+)", said.split("export ", 1)[1]))
        assert exports["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{s3}" and exports["TIERED_STORE_URL"].startswith("s3://")
        # Any broker of the list answers; the messages are durable in the shared catalog and store.
        tiered("topic", "create", "-b", listed, "events", "3")
        tiered("produce", "-b", f"127.0.0.1:{port + 2}", "-t", "events/1", "one", "two")
        out = tiered("consume", "-b", f"127.0.0.1:{port}", "-t", "events/1", "-d", "-F", "content").stdout.decode()
        assert out.splitlines() == ["one", "two"]
        check = tiered("catalog", "check", "--catalog", exports["TIERED_CATALOG_URL"], check=False)
        assert check.returncode == 0, check.stderr.decode()
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert "tiered dev: stopping" in err.decode()
    # Every process it started is gone: nothing listens on the brokers', PostgreSQL's or the S3 server's ports.
    assert not [p for p in (*range(port, port + 3), *range(http, http + 3), pg, s3) if _listening(p)]
    assert (tmp_path / "dev" / "broker0.log").exists()  # --dir keeps what it made


def test_tiered_dev_refuses_a_taken_port_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = tiered("dev", "--dir", str(tmp_path / "dev"), "--port", str(port), check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.count("\n") == 1 and f"port {port} is taken" in err, err
    assert not (tmp_path / "dev").exists()
