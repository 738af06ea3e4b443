"""Nothing secret leaves a serving broker: with its catalog password in the catalog URL (PostgreSQL over TLS,
verify-full) and a TLS listener, the password and the listener's private key appear in none of its log (debug), its
HTTP answers (/metrics, /readyz, /v1/tier), the output of `tiered status`, `tiered tier status` and `tiered cluster
status`, or the objects it writes (topic objects, blocks, segments)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tiered.client import Client
from tiered.protocol.bundle import Message
from tiered.tls import client_context

from tests.ops.helpers import ahttp_get, child_env, tiered_console_script, wait_for_port
from tests.support.pg_tls import PASSWORD, start_tls_cluster
from tests.support.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

ENV_SECRETS = {"AWS_SECRET_ACCESS_KEY": "aws-secret-key-5c0ffee1", "AWS_SESSION_TOKEN": "aws-session-token-7d3a2b"}


@pytest.fixture(scope="module")
def tls_pg(tmp_path_factory):
    pg = start_tls_cluster(tmp_path_factory.mktemp("tls-pg"))
    yield pg
    pg.stop()


def key_lines(key: str | Path) -> list[str]:
    """The base64 lines of a PEM private key: any of them in an output would be a piece of the key."""
    return [line for line in Path(key).read_text().splitlines() if line and not line.startswith("-----")]


async def cli(*args: str) -> str:
    argv = [sys.executable, "-m", "tiered.cli.main", *args]
    done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60,
                                   env=child_env(**ENV_SECRETS))
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout + done.stderr


async def test_no_password_or_key_in_logs_metrics_status_or_objects(tmp_path, tls_pg):
    catalog_url = tls_pg.url()
    assert PASSWORD in catalog_url
    cert, key = tls_pg.certs.issue("broker")
    secrets = [PASSWORD, *ENV_SECRETS.values(), *key_lines(key), *key_lines(tls_pg.certs.folder / "ca.key")]
    port, http_port = free_port(), free_port()
    data = tmp_path / "data"
    argv = [str(tiered_console_script(tmp_path)), "serve", "-p", str(data), "-l", f"127.0.0.1:{port}",
            "-P", f"127.0.0.1:{http_port}", "--catalog", catalog_url, "--tls-cert", str(cert), "--tls-key", str(key),
            "--block-max-age-ms", "20", "--log-level", "debug"]
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=child_env(**ENV_SECRETS), stdout=log, stderr=subprocess.STDOUT)
    outputs: dict[str, str] = {}
    try:
        wait_for_port(port, proc, log_path.read_text)
        ssl_context = client_context(str(tls_pg.certs.ca_path))
        async with await Client.connect("127.0.0.1", port, ssl_context=ssl_context) as c:
            await c.create_topic("orders", 2, {"log.segment.bytes": "1k"})
            for i in range(20):
                await c.produce("orders", i % 2, [Message(b"order-%d " % i + b"x" * 200, None, 1_700_000_000_000)])
        for path in ("/metrics", "/readyz", "/v1/tier"):
            answer = await ahttp_get(http_port, path)
            assert answer.status == 200, (path, answer.text)
            outputs[path] = answer.text
        outputs["status"] = await cli("status", "-b", f"127.0.0.1:{port}", "--tls-ca", str(tls_pg.certs.ca_path))
        outputs["tier status"] = await cli("tier", "status", "-P", f"127.0.0.1:{http_port}")
        outputs["cluster status"] = await cli("cluster", "status", "--catalog", catalog_url)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    outputs["log"] = log_path.read_text()
    # What was read is what the checks below are about: the broker served, and the outputs say so.
    assert "topics 1" in outputs["status"] and "orders" in outputs["tier status"]
    assert "tiered_" in outputs["/metrics"]
    assert "postgres:***@127.0.0.1" in outputs["log"], "the catalog URL is logged, masked"
    for name, text in outputs.items():
        for secret in secrets:
            assert secret not in text, f"{secret[:12]}... in {name}:\n{text}"
    objects = [p for p in (data / ".tiered" / "objects").rglob("*") if p.is_file()]
    assert any("topics" in p.parts for p in objects) and any(p.suffix == ".ilog" for p in objects), objects
    for path in objects:
        content = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in content, f"{secret[:12]}... in {path}"
