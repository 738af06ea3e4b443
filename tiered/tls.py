"""TLS contexts for the TANK listener and for the client, and the listener's certificate reload.

TLS 1.2 is the lowest version either side accepts. The listener's context is fixed when the server starts (asyncio
takes one SSLContext), so reload works through it: its SNI callback, called on every ClientHello (with None when the
client sends no name), hands the handshake the context built from the files as they are now. `CertReloader.check`
decides when to look at the files (at most every `interval_s` on the clock given) and keeps the old context when a
new file does not load, logging one line."""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S = 5.0  # the certificate files' mtimes are looked at at most this often
HANDSHAKE_TIMEOUT_S = 10.0  # a client that does not finish its handshake (a plaintext client) is closed after this
SHUTDOWN_TIMEOUT_S = 5.0  # closing waits this long at most for the client's close_notify (asyncio's default: 30 s)


class TLSError(ValueError):
    """A certificate, key or CA file that could not be loaded, in one line."""


@dataclass(frozen=True)
class ServerTLS:
    cert: str
    key: str
    client_ca: str = ""  # set: a client certificate signed by this CA is required (mutual TLS)


def server_context(tls: ServerTLS) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(ctx.load_cert_chain, tls.cert, tls.key, what="certificate or key")
    if tls.client_ca:
        _load(ctx.load_verify_locations, tls.client_ca, what="client CA")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """Verifies the broker against `ca` (else the system's CAs), its host name or address included; presents
    `cert`/`key` when given (for a broker that requires client certificates)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca:
        _load(ctx.load_verify_locations, ca, what="CA")
    else:
        ctx.load_default_certs()
    if cert or key:
        if not (cert and key):
            raise TLSError("a client certificate needs both --tls-cert and --tls-key")
        _load(ctx.load_cert_chain, cert, key, what="certificate or key")
    return ctx


def _load(method, *paths: str, what: str) -> None:
    try:
        method(*paths)
    except FileNotFoundError as exc:
        raise TLSError(f"TLS {what}: no such file {exc.filename or paths[0]!r}") from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TLSError(f"TLS {what} {', '.join(paths)}: {getattr(exc, 'reason', None) or exc}") from None


def _mtimes(tls: ServerTLS) -> tuple[int, ...]:
    return tuple(os.stat(p).st_mtime_ns if os.path.exists(p) else -1 for p in (tls.cert, tls.key, tls.client_ca) if p)


class CertReloader:
    """The one owner of the listener's current context. `listener_context` is what the server is given; `check`
    (called with the broker's clock) builds a new current context when a file's mtime changed."""

    def __init__(self, tls: ServerTLS, now: float, interval_s: float = RELOAD_INTERVAL_S):
        self.tls = tls
        self.interval_s = interval_s
        self.current = server_context(tls)  # raises TLSError: a broker does not start with bad files
        self._seen = _mtimes(tls)
        self._checked_at = now
        self.listener_context = server_context(tls)
        self.listener_context.sni_callback = self._hand_over

    def _hand_over(self, sslobj: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        if self.current is not ctx:
            sslobj.context = self.current
        return None

    def check(self, now: float) -> bool:
        """True when a new context was loaded. Looks at the files at most every interval_s."""
        if now - self._checked_at < self.interval_s:
            return False
        self._checked_at = now
        seen = _mtimes(self.tls)
        if seen == self._seen:
            return False
        self._seen = seen  # a bad file is reported once, not on every check, until it changes again
        try:
            self.current = server_context(self.tls)
        except TLSError as exc:
            log.warning("TLS files changed but did not load, keeping the previous certificate: %s", exc)
            return False
        log.info("TLS certificate reloaded from %s", self.tls.cert)
        return True
