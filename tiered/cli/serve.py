"""`tiered serve`: run the broker (also takes TANK's `-p <base path>` and `-l [addr:]port`)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time

from tiered.config import Settings, SettingsError, add_arguments, load_settings


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the broker", description="Run the broker. Settings: docs/configuration.md.")
    add_arguments(p)
    p.set_defaults(func=main)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    for noisy in ("botocore", "aiobotocore", "urllib3", "sqlalchemy.engine", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def main(args) -> int:
    try:
        settings = load_settings(args)
    except SettingsError as exc:
        print(f"tiered serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    return asyncio.run(serve(settings))


async def serve(settings: Settings) -> int:
    from tiered.server.app import App

    log = logging.getLogger("tiered")
    log.info("starting with %s", settings.describe())
    app = App(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
    except Exception as exc:
        log.error("could not start: %s", exc, exc_info=settings.log_level == "debug")
        await app.stop()
        return 1
    await stop.wait()
    log.info("shutting down (budget %.0f s)", settings.shutdown_timeout_s)
    await app.stop()
    return 0
