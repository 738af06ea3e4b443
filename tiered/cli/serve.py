"""`tiered serve`: run the broker (also takes TANK's `-p <base path>` and `-l [addr:]port`)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Iterable, Mapping
from urllib.parse import quote

from tiered.catalog.engine import url_password
from tiered.config import Settings, SettingsError, add_arguments, load_settings

# Where credentials live (docs/configuration.md): libpq's and the AWS SDKs' own variables.
SECRET_ENVIRONMENT = ("PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
MIN_SECRET_CHARS = 4

log = logging.getLogger("tiered")


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the broker", description="Run the broker. Settings: docs/configuration.md.")
    add_arguments(p)
    p.set_defaults(func=main)


class Redactor:
    """Replaces every known secret value in a log line with ***.

    URLs are logged masked already (Settings.describe), but a library's error message or a traceback may quote a
    URL or a credential verbatim; this is the last line of defence, applied to everything the broker prints.
    Values shorter than MIN_SECRET_CHARS are left alone: replacing every "ab" would garble the logs.
    """

    def __init__(self, secrets: Iterable[str]):
        # Longest first, so a secret containing another is replaced whole.
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)

    @classmethod
    def for_settings(cls, settings: Settings, environ: Mapping[str, str]) -> Redactor:
        found = [environ.get(name, "") for name in SECRET_ENVIRONMENT]
        for url in (settings.catalog_url, settings.store_url):
            password = url_password(url) if url else None
            if password:
                found += [password, quote(password, safe=""), quote(password)]  # decoded, and as a URL spells it
        return cls(found)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


class TextFormatter(logging.Formatter):
    def __init__(self, redact: Redactor):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the structured `settings` when a record carries
    them, and the exception when there is one."""

    def __init__(self, redact: Redactor):
        super().__init__()
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": self.redact(record.getMessage()),
        }
        settings = getattr(record, "settings", None)
        if settings is not None:
            out["settings"] = json.loads(self.redact(json.dumps(settings)))
        if record.exc_info:
            out["exc"] = self.redact(self.formatException(record.exc_info))
        return json.dumps(out)


def configure_logging(settings: Settings, environ: Mapping[str, str] = os.environ) -> None:
    redact = Redactor.for_settings(settings, environ)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(redact) if settings.log_format == "json" else TextFormatter(redact))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    logging.captureWarnings(True)  # library warnings go through the same handler (and the same redaction)
    for noisy in ("botocore", "aiobotocore", "urllib3", "sqlalchemy.engine", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def main(args) -> int:
    try:
        settings = load_settings(args)
        settings.server_tls()  # a certificate without its key is a bad setting
        settings.s3_encryption()  # so is a KMS key without kms, or encryption asked of a file store
    except SettingsError as exc:
        print(f"tiered serve: {exc}", file=sys.stderr)
        return 2
    if settings.server_tls() is not None:
        from tiered.tls import TLSError, server_context

        try:
            server_context(settings.server_tls())  # files that do not load: one line, before anything starts
        except TLSError as exc:
            print(f"tiered serve: {exc}", file=sys.stderr)
            return 2
    if settings.acl:
        from tiered.acl import RulesError, load_rules

        try:
            load_rules(settings.acl)  # a file that does not load: one line, before anything starts
        except RulesError as exc:
            print(f"tiered serve: {exc}", file=sys.stderr)
            return 2
    configure_logging(settings)
    missing = missing_s3_credentials(settings)
    if missing:
        print(f"tiered serve: {missing}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(serve(settings))
    except Exception:  # printed through the redacting handler, never as a bare traceback
        log.exception("the broker failed")
        return 1


def missing_s3_credentials(settings: Settings) -> str | None:
    """Why an S3 store cannot be used at all (no credentials anywhere botocore looks), or None. A broker without
    credentials could only time out every durable produce, so it refuses to start; an unreachable endpoint, by
    contrast, may come back, and is retried (the broker starts unready)."""
    url = settings.effective_store_url
    if not url.startswith("s3://"):
        return None
    from botocore.session import Session

    if Session().get_credentials() is not None:
        return None
    return (f"no S3 credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or run "
            "where an instance or pod role provides them); for a local S3 also set AWS_ENDPOINT_URL")


async def serve(settings: Settings) -> int:
    from tiered.server.app import App

    described = settings.describe()
    log.info("starting with %s", json.dumps(described), extra={"settings": described})
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
    signalled = asyncio.ensure_future(stop.wait())
    requested = asyncio.ensure_future(app.broker.stop_requested.wait())
    await asyncio.wait({signalled, requested}, return_when=asyncio.FIRST_COMPLETED)
    for waiting in (signalled, requested):
        waiting.cancel()
    log.info("shutting down (budget %.0f s)", settings.shutdown_timeout_s)
    await app.stop()
    return app.broker.exit_code
