"""What the client-side commands share: the brokers to ask, running a command, one-line errors, progress bars.

`-b` names one broker or several of one service, comma separated (`10.0.0.1:11011,10.0.0.2:11011`): the client
connects to the first that answers and follows TANK's redirects to each partition's leader (tiered.client.client).

Every error a command expects (a bad argument, an unreachable broker, a refused request) is printed as one line on
stderr, `tiered <command>: <what was wrong and what is allowed>`, with exit status 1 (2 for a bad argument, as
argparse does); a traceback means a bug. Data goes to stdout as clean lines; progress, summaries and errors go to
stderr, and progress bars only when stderr is a terminal that is not also where the data goes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import ssl
import sys
from dataclasses import dataclass
from typing import IO

from tqdm import tqdm

from tiered.client import CertificateRefused, Client, TankError, Unreachable
from tiered.client.connection import reason
from tiered.client.server_name import check_server_name
from tiered.config import DEFAULT_PORT, SettingsError, parse_endpoint
from tiered.protocol.errors import ProtocolError
from tiered.tls import TLSError, client_context

BROKER_ENV = "TIERED_BROKER"
DEFAULT_BROKER = f"127.0.0.1:{DEFAULT_PORT}"


class CommandError(Exception):
    """What a command prints as its one-line error (exit status 1)."""


class UsageError(CommandError):
    """A bad argument (exit status 2)."""


def add_broker_argument(parser: argparse.ArgumentParser, flags: tuple[str, ...] = ("-b", "--broker"),
                        what: str = "broker") -> None:
    parser.add_argument(*flags, default=None, metavar="[ADDR:]PORT[,...]",
                        help=f"{what} endpoint, or a comma-separated list of brokers of one service (any of them "
                             "answers; requests follow each partition's leader) (default: "
                             f"${BROKER_ENV}, else {DEFAULT_BROKER})")
    if "--tls-ca" not in parser._option_string_actions:  # a command naming two brokers (replay) has them once
        parser.add_argument("--tls-ca", default=None, metavar="FILE",
                            help="connect over TLS, checking the brokers' certificates against this CA (PEM) "
                                 "(default: $TIERED_TLS_CA; TLS is off when none of the --tls-* flags is set)")
        parser.add_argument("--tls-cert", default=None, metavar="FILE",
                            help="client certificate (PEM) for brokers requiring one (default: $TIERED_TLS_CERT)")
        parser.add_argument("--tls-key", default=None, metavar="FILE",
                            help="private key of --tls-cert (default: $TIERED_TLS_KEY)")
        parser.add_argument("--tls-server-name", default=None, metavar="NAME",
                            help="verify every broker's certificate by this name, also those redirects send to "
                                 "(default: $TIERED_TLS_SERVER_NAME, else the -b host when it is a name, else "
                                 "each broker's address)")


@dataclass(frozen=True)
class ClientTLS:
    """How a command's client speaks TLS."""

    context: ssl.SSLContext
    server_name: str = ""  # every broker is verified by it; "": as tiered.client.server_name says


def client_tls(args: argparse.Namespace, environ=os.environ) -> ClientTLS | None:
    """The client's TLS from --tls-ca/--tls-cert/--tls-key/--tls-server-name (else TIERED_TLS_*), or None: TLS off."""
    ca, cert, key, name = (getattr(args, f"tls_{n}", None) or environ.get(f"TIERED_TLS_{n.upper()}", "")
                           for n in ("ca", "cert", "key", "server_name"))
    if not (ca or cert or key or name):
        return None
    try:
        return ClientTLS(client_context(ca, cert, key), check_server_name(name) if name else "")
    except (TLSError, ValueError) as exc:
        raise UsageError(str(exc)) from None


class _Deprecated(argparse.Action):
    """An old spelling of a flag that still works, with one line on stderr saying what to use instead."""

    def __init__(self, option_strings, dest, *, instead: str, why: str, **kwargs):
        self.instead, self.why = instead, why
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated ({self.why}): use {self.instead}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_flag(parser: argparse.ArgumentParser, flag: str, dest: str, *, instead: str, why: str,
                        **kwargs) -> None:
    """`flag` as an old spelling of the option stored in `dest`: hidden from --help, accepted with a deprecation
    line. Each letter means one thing across the CLI (docs/operations.md, "Flags")."""
    parser.add_argument(flag, dest=dest, action=_Deprecated, instead=instead, why=why, help=argparse.SUPPRESS,
                        **kwargs)


@dataclass(frozen=True)
class Brokers:
    """The bootstrap list: the brokers a command may ask first."""

    endpoints: tuple[tuple[str, int], ...]
    source: str  # what named them: the flag, the environment variable or the default

    def __str__(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.endpoints)


def brokers(text: str | None, flag: str = "-b/--broker", environ=os.environ) -> Brokers:
    """The endpoints the flag names (comma separated), else $TIERED_BROKER, else the default; an any-address means
    this host."""
    if text is not None:
        source = flag
    elif environ.get(BROKER_ENV):
        text, source = environ[BROKER_ENV], BROKER_ENV
    else:
        text, source = DEFAULT_BROKER, f"the default; set {flag} or {BROKER_ENV}"
    endpoints = []
    try:
        for item in text.split(","):
            if not item.strip():
                raise SettingsError(f"empty endpoint in {text!r}")
            host, port = parse_endpoint(item, DEFAULT_PORT)
            endpoints.append(("127.0.0.1" if host == "0.0.0.0" else host, port))
    except SettingsError as exc:
        raise UsageError(f"{exc} (from {source}; want [addr:]port, or several separated by commas, e.g. "
                         "127.0.0.1:11011,127.0.0.1:11012)") from None
    return Brokers(tuple(dict.fromkeys(endpoints)), source)


async def connect_to(named: Brokers, tls: ClientTLS | None = None) -> Client:
    """A client of the brokers named, connected to the first that answers (over TLS when `tls` is given)."""
    try:
        if tls is None:
            return await Client.connect_any(named.endpoints)
        return await Client.connect_any(named.endpoints, ssl_context=tls.context, tls_server_name=tls.server_name)
    except Unreachable as exc:
        if all(isinstance(f, CertificateRefused) for f in exc.failures.values()):  # reached, but not trusted
            raise CommandError("; ".join(dict.fromkeys(map(str, exc.failures.values())))) from None
        if len(exc.failures) == 1:
            head, why = f"a broker at {named}", reason(next(iter(exc.failures.values())))
        else:
            head, why = f"any broker of {named}", "; ".join(f"{e}: {reason(f)}" for e, f in exc.failures.items())
        raise CommandError(f"cannot reach {head} (from {named.source}): {why}; is `tiered serve` running there?"
                           ) from None


async def connect(args: argparse.Namespace) -> Client:
    return await connect_to(brokers(args.broker), client_tls(args))


def run(coro, command: str) -> int:
    """Runs a command coroutine; known failures print one line on stderr and exit 1 (2 for a usage error)."""
    try:
        return asyncio.run(coro) or 0
    except UsageError as exc:
        return fail(command, exc, status=2)
    except (CommandError, TankError, SettingsError) as exc:
        return fail(command, exc)
    except CertificateRefused as exc:  # a broker a redirect named: it is there, but not who it should be
        return fail(command, exc)
    except ProtocolError as exc:
        return fail(command, f"the broker did not answer in TANK's protocol ({exc}): does -b name its TANK port "
                             f"(default {DEFAULT_PORT}), not its HTTP port?")
    except BrokenPipeError:
        if stdout_closed():
            raise  # whoever read our output went away (`| head`): a normal end, main() exits quietly
        return fail(command, "lost the broker: broken pipe")
    except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
        return fail(command, f"lost the broker: {reason(exc)}")


def stdout_closed(stream: IO | None = None) -> bool:
    """Whether the reader of `stream` (stdout) has gone away: a pipe with no reader polls as an error."""
    stream = stream if stream is not None else sys.stdout
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def fail(command: str, error: object, status: int = 1) -> int:
    print(f"tiered {command}: {error}", file=sys.stderr)
    return status


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """Columns padded to their widest cell, two spaces apart."""
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _same_terminal(a: IO, b: IO) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (OSError, ValueError, AttributeError):
        return False


def progress_wanted(stream: IO | None = None, data: IO | None = None) -> bool:
    """A progress bar is drawn on `stream` (stderr) only when it is a terminal, and not the terminal that `data`
    (stdout, when the command writes data there) goes to: a bar must never land between data lines."""
    stream = stream if stream is not None else sys.stderr
    try:
        if not stream.isatty():
            return False
    except (ValueError, AttributeError):
        return False
    return data is None or not _same_terminal(stream, data)


class Progress:
    """A live bar (tqdm: count, rate, ETA when the total is known) on stderr, when progress_wanted() says so.

    `done` counts whether or not a bar is drawn; `finish()` removes the bar, so what follows starts on a clean line.
    """

    def __init__(self, what: str, total: int | None = None, *, unit: str = "msg", data: IO | None = None,
                 stream: IO | None = None):
        self.done = 0
        stream = stream if stream is not None else sys.stderr
        self.bar = tqdm(desc=what, total=total, unit=unit, unit_scale=True, file=stream, leave=False,
                        dynamic_ncols=True, mininterval=0.25, disable=not progress_wanted(stream, data))

    def add(self, n: int = 1) -> None:
        self.done += n
        self.bar.update(n)

    def finish(self) -> None:
        self.bar.close()
