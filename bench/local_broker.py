"""`python -m bench.local_broker <tiered serve options>`: the broker without its tiering layer.

The same App as `tiered serve`, built with `local_only=True` (TANK's behaviour alone: no block builder, no uploads,
no catalog), so that the append benchmark can print what the append path itself costs beside the whole broker's
figure. Takes `tiered serve`'s options; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from tiered.cli.serve import configure_logging
from tiered.config import add_arguments, load_settings
from tiered.server.app import App


async def serve(settings) -> None:
    app = App(settings, local_only=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    try:
        await stop.wait()
    finally:
        await app.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.local_broker", description=__doc__)
    add_arguments(parser)
    settings = load_settings(parser.parse_args(argv))
    configure_logging(settings)
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
