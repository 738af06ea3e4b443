"""Produce with and without access rules (issue 24): what checking every request against the rules costs.

    python -m bench.bench_access [--quick | --smoke]

One local-only broker (the App of `tiered serve` with `local_only=True`: no uploads, so the figure is the request
path's) with mutual TLS, and its client in this one process, over 127.0.0.1; certificates (P-256, made with
`openssl`) in a temporary folder. Small requests, where a per-request cost shows: one 100-byte message a produce,
64 produces in flight, one topic. Three runs, the same TLS in each: no rules file; a file of 50 rules whose last one
allows the client (the decision is kept per principal, operation and topic: tiered.server.access); and the same 50
rules walked for every request (what the kept decisions save). Each run is repeated, interleaved with the others,
and its best rate shown; "µs per decision" is `Access.allows` alone, called in a loop (the best of the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
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
from tiered.server import access
from tiered.server.app import App
from tiered.tls import client_context

from bench.bench_tls import make_certs as make_tls_certs

IN_FLIGHT = 64
RULES = 50


def make_certs(folder: Path) -> None:
    """The CA, the server's and the client's certificates (bench_tls), and a rules file of RULES rules."""
    make_tls_certs(folder, ("server", "client"))
    rules = "".join(f'[[rule]]\nprincipals = ["service-{i}"]\noperations = ["produce", "consume"]\n'
                    f'topics = ["team-{i}-*", "shared-{i}"]\n\n' for i in range(RULES - 1))
    rules += '[[rule]]\nprincipals = ["client"]\noperations = ["*"]\ntopics = ["bench-*"]\n'
    (folder / "acl.toml").write_text(rules)


async def measure(folder: Path, rules: bool, requests: int) -> float:
    """Produce requests a second."""
    settings = Settings(data_dir=folder / f"data-{rules}-{time.monotonic_ns()}", listen="127.0.0.1:0",
                        http_listen="off", tls_cert=str(folder / "server.pem"), tls_key=str(folder / "server.key"),
                        tls_client_ca=str(folder / "ca.pem"))
    if rules:
        settings = replace(settings, acl=str(folder / "acl.toml"))
    app = App(settings, local_only=True)
    await app.start()
    try:
        ctx = client_context(str(folder / "ca.pem"), str(folder / "client.pem"), str(folder / "client.key"))
        async with await Client.connect("127.0.0.1", app.broker.port, ssl_context=ctx) as client:
            await client.create_topic("bench-topic", 1, {"produce.ack": "local"})
            batch = [Message(b"x" * 100, None, 1)]

            async def producer(n: int) -> None:
                for _ in range(n):
                    await client.produce("bench-topic", 0, batch, codec=0)

            started = time.perf_counter()
            await asyncio.gather(*(producer(requests // IN_FLIGHT) for _ in range(IN_FLIGHT)))
            return (requests // IN_FLIGHT * IN_FLIGHT) / (time.perf_counter() - started)
    finally:
        await app.stop()


class _Conn:
    principal = "client"
    peer = ("127.0.0.1", 1)


def decision_us(folder: Path, calls: int) -> float:
    """Microseconds per `Access.allows` of the client's produce to its topic, with the rules of `acl.toml`: the cost
    on the request path alone, without the noise of the broker and client around it."""
    from tiered.acl import Op
    from tiered.clock import SYSTEM_CLOCK
    from tiered.metrics import Metrics

    checker = access.Access(str(folder / "acl.toml"), Metrics(), SYSTEM_CLOCK)
    conn = _Conn()
    started = time.perf_counter()
    for _ in range(calls):
        checker.allows(conn, Op.PRODUCE, "bench-topic")
    return (time.perf_counter() - started) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_options(parser)
    args = parser.parse_args(argv)
    if shutil.which("openssl") is None:
        cannot_run("needs the openssl command to make certificates")
    requests, rounds = size_of(args).pick((32_000, 3), (6_400, 2), (640, 1))
    kept = access.VERDICTS_KEPT
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_certs(folder)
        runs = (("none", False, kept), (f"{RULES} rules", True, kept), (f"{RULES} rules, walked each time", True, 0))
        best = {name: 0.0 for name, _, _ in runs}
        for _ in range(rounds):  # interleaved, the best of each: a shared machine's noise only slows a run down
            for name, rules, verdicts in runs:
                access.VERDICTS_KEPT = verdicts
                try:
                    best[name] = max(best[name], asyncio.run(measure(folder, rules, requests)))
                finally:
                    access.VERDICTS_KEPT = kept
        decisions = {}
        for name, _, verdicts in runs[1:]:
            access.VERDICTS_KEPT = verdicts
            try:
                decisions[name] = min(decision_us(folder, requests) for _ in range(rounds))
            finally:
                access.VERDICTS_KEPT = kept
        rows = [[name, requests, round(rate), f"{decisions[name]:.2f}" if name in decisions else "-"]
                for name, rate in best.items()]
    print(format_table(["access rules", "produces", "produces/s", "µs per decision"], rows,
                       f"mutual TLS, 100-byte messages one a request, {IN_FLIGHT} in flight, 127.0.0.1; "
                       f"the best of {rounds} interleaved runs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
