"""Produce and consume with TLS off and on (issue 24): the cost of encryption on the TANK listener.

    python -m bench.bench_tls [--quick | --smoke]

One local-only broker (the App of `tiered serve` with `local_only=True`: no uploads, so the figure is the listener's)
and its client in this one process, over 127.0.0.1; certificates (P-256, made with `openssl`) in a temporary folder.
Produce: bundles of 100 messages of 1 KiB, one request in flight, 1 partition. Consume: the whole partition again
from seq 1, in 1 MiB fetches. TLS off sends local bytes with sendfile; TLS on reads and writes them through the
encrypting transport.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench import format_table
from bench.sizes import add_size_options, cannot_run, size_of
from tiered.client import Client
from tiered.config import Settings
from tiered.protocol.bundle import Message
from tiered.server.app import App
from tiered.tls import client_context

MESSAGE = b"x" * 1024
BUNDLE = 100


def make_certs(folder: Path, names: tuple[str, ...] = ("server",)) -> None:
    """A CA (ca.pem) and, for each name, a certificate for 127.0.0.1 with that CN signed by it (NAME.pem, NAME.key)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=bench-ca", "-days", "1")
    (folder / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in names:
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-out", f"{name}.pem",
            "-days", "1", "-extfile", "ext")


async def measure(folder: Path, tls: bool, bundles: int) -> tuple[float, float]:
    settings = Settings(data_dir=folder / ("data-tls" if tls else "data-plain"), listen="127.0.0.1:0",
                        http_listen="off")
    if tls:
        settings = replace(settings, tls_cert=str(folder / "server.pem"), tls_key=str(folder / "server.key"))
    app = App(settings, local_only=True)
    await app.start()
    try:
        ctx = client_context(str(folder / "ca.pem")) if tls else None
        async with await Client.connect("127.0.0.1", app.broker.port, ssl_context=ctx) as client:
            await client.create_topic("bench", 1)
            batch = [Message(MESSAGE, None, 1)] * BUNDLE
            started = time.perf_counter()
            for _ in range(bundles):
                await client.produce("bench", 0, batch, codec=0)
            produced = time.perf_counter() - started
            started = time.perf_counter()
            seq, got = 1, 0
            while got < bundles * BUNDLE:
                answer = await client.consume("bench", 0, seq, fetch_bytes=1 << 20)
                got += len(answer.messages)
                seq = answer.next_seq
            consumed = time.perf_counter() - started
        return produced, consumed
    finally:
        await app.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_options(parser)
    args = parser.parse_args(argv)
    if shutil.which("openssl") is None:
        cannot_run("needs the openssl command to make certificates")
    bundles = size_of(args).pick(2000, 300, 10)
    mib = bundles * BUNDLE * len(MESSAGE) / (1 << 20)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_certs(folder)
        for tls in (False, True):
            produced, consumed = asyncio.run(measure(folder, tls, bundles))
            rows.append(["on" if tls else "off", round(mib), round(mib / produced, 1), round(mib / consumed, 1)])
    print(format_table(["TLS", "MiB", "produce MiB/s", "consume MiB/s"], rows,
                       f"1 KiB messages, {BUNDLE} a bundle, one request in flight, 127.0.0.1"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
