"""Where a 1-message produce request's instructions go inside the broker, without the network (issue 26).

    valgrind --tool=callgrind --instr-atstart=no --separate-threads=no --callgrind-out-file=OUT/cg.out \\
        python -m bench.profile_produce [--local-only] [--requests N]
    callgrind_annotate --inclusive=yes OUT/cg.out.1

An in-process broker (`App`, embedded defaults in a temporary directory; `--local-only`: without its tiering layer)
with one topic (`produce.ack=local`, 1 partition); then the produce path as the connection's request task runs it,
`ProduceHandler.handle_payload` of one 100-byte message (the payload read, appended and answered), in a loop: a warm-up of 2,000 requests,
then N counted ones (default 5,000) between `callgrind_control --instr=on` and `--dump`. The dump's Ir over N is the
request's in-process cost (the scan, the handler, the append, the tier's hand-over and the answer frame; not the
connection, the event loop or the blocks' upload, which `bench.bench_instructions` counts), and the annotated dump
says by C function (the native calls by name) where it goes. Under callgrind the loop runs ~50x slower and the event
loop does not turn while it runs, so the lease is not renewed: the handler compares its clock read with an ack
deadline that never passes here (an `AckDeadline` of +inf in place of the coordinator's, read alike: one attribute).
Without valgrind it prints the wall time per request.

`--pieces` (whole broker) then calls each piece of the path alone as many times, each between a zeroing and a dump
of its own (the native call, which counts the ack latency too, the lease check as the handler makes it, admission,
the ack latency as the Python path counts it, and `read_checked_produce`, the request objects the native call no
longer builds), printing which dump is which: a piece's instructions per call are its dump's total over N, less the
empty loop's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tiered.client import Client
from tiered.config import Settings
from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle
from tiered.server.app import App, tiering_service
from tiered.tier_interface import AckDeadline

WARMUP = 2_000


class _Connection:
    """What the handler uses of a connection on this path: the answer is taken at once."""

    plaintext = True
    closed = False

    def try_send_frame(self, frame: bytes) -> bool:
        return True

    def spawn(self, coro) -> None:
        coro.close()


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True, timeout=120)


def _pieces(app, payload: bytes, conn, requests: int) -> None:
    """Each piece of the request's Python path called `requests` times between a zeroing and a dump of its own, in
    the order printed (dump 2 is the first piece): its instructions per call are the dump's total over `requests`,
    less the empty loop's (the first piece)."""
    broker = app.broker
    handler = broker.handlers.produce
    calls = app.tier.produce_calls
    context = handler._native_context(calls)
    clock = broker.clock
    started = clock.monotonic()
    deadline = calls.ack_deadline
    pieces = {
        "the empty loop": lambda: None,
        "the native call (produce_payload, with the ack latency)":
            lambda: handler._produce_payload(payload, False, context, started),
        "the lease check (the clock read against the ack deadline)": lambda: clock.monotonic() >= deadline.until,
        "admission (admits_now)": calls.admits_now,
        "the ack latency as the Python path counts it (Metrics.ack_latency)":
            lambda: broker.metrics.ack_latency("t", 0.001),
        "read_checked_produce (the request objects)": lambda: rq.read_checked_produce(payload, False),
    }
    for n, (name, call) in enumerate(pieces.items(), start=2):
        print(f"dump {n}: {name}", flush=True)
        _control("--zero")
        for _ in range(requests):
            call()
        _control("--dump")


async def profile(local_only: bool, requests: int, pieces: bool = False) -> float:
    root = Path(tempfile.mkdtemp(prefix="tiered-profile-produce-"))
    try:
        settings = Settings(data_dir=root / "data", listen="127.0.0.1:0", http_listen="off")
        app = App(settings, local_only=True) if local_only else App(settings, tier=tiering_service())
        await app.start()
        try:
            async with await Client.connect("127.0.0.1", app.broker.port) as client:
                await client.create_topic("t", 1, {"produce.ack": "local"})
            if not local_only:
                app.tier.produce_calls = dataclasses.replace(app.tier.produce_calls,
                                                             ack_deadline=AckDeadline(float("inf")))
            bundle = encode_bundle([Message(b"x" * 100, None, 1_700_000_000_000)])
            payload = rq.encode_produce_request(
                rq.ProduceRequest(1, (rq.ProduceTopic("t", (rq.ProducePartition(0, bundle),)),)))
            handle, conn = app.broker.handlers.produce.handle_payload, _Connection()

            def loop(n: int) -> None:
                for _ in range(n):
                    if handle(conn, payload, False) is not None:
                        raise RuntimeError("a request was not answered at once")

            loop(WARMUP)
            await asyncio.sleep(0.5)
            under_valgrind = shutil.which("callgrind_control") is not None and "valgrind" in os.environ.get(
                "LD_PRELOAD", "")
            if under_valgrind:
                _control("--instr=on")
                _control("--zero")
            started = time.perf_counter()
            loop(requests)
            seconds = time.perf_counter() - started
            if under_valgrind:
                _control("--dump")
                if pieces:
                    _pieces(app, payload, conn, requests)
                _control("--instr=off")
            return seconds / requests
        finally:
            await app.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_produce", description=__doc__.split("\n\n")[0])
    parser.add_argument("--local-only", action="store_true", help="the broker without its tiering layer")
    parser.add_argument("--requests", type=int, default=5_000, help="counted requests (default 5,000)")
    parser.add_argument("--pieces", action="store_true",
                        help="then each piece of the request's path alone, a dump each (under callgrind)")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    per_request = asyncio.run(profile(args.local_only, args.requests, args.pieces))
    print(f"{args.requests} requests, {per_request * 1e6:.2f} us each (wall; under callgrind: read the dump)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
