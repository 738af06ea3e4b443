"""The broker's settings: one object, built in one place (docs/configuration.md is the table).

Precedence, highest first: command-line flags > TIERED_* environment variables > the TOML config file > defaults.
Credentials are never settings: libpq and the AWS SDKs read them from their own environment variables.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from tiered.catalog.engine import mask_url, normalize_url, split_pooled
from tiered.storage.topic_config import parse_size as parse_topic_size

DEFAULT_PORT = 11011
DEFAULT_HTTP_PORT = 9102
ENV_PREFIX = "TIERED_"
_OFF = ("off", "none", "false", "0", "")  # http_listen values that turn the HTTP endpoint off



class SettingsError(ValueError):
    """A setting that cannot be used, named with where it came from."""


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path("./data")
    listen: str = f":{DEFAULT_PORT}"
    http_listen: str = f":{DEFAULT_HTTP_PORT}"
    catalog_url: str = ""  # empty: derived from data_dir
    # A direct URL to the catalog's PostgreSQL for the change notices' listener alone (tiered.tiering.cluster.notices),
    # when `catalog_url` reaches it through a transaction-mode pooler, where LISTEN does not work. Empty: the
    # listener uses `catalog_url`, or, behind a pooler, there is none and the broker looks every 0.25 s.
    catalog_notices_url: str = ""
    store_url: str = ""  # empty: derived from data_dir
    s3_path_style: bool = False
    # Server-side encryption asked of S3 for every object written (ServerSideEncryption, tiered/tiering/objects/
    # s3_store.py): off (the bucket's default), s3 (SSE-S3) or kms (SSE-KMS, with the key id, else aws/s3's key).
    s3_sse: str = "off"
    s3_sse_kms_key_id: str = ""
    broker_id: int = 0
    read_only: bool = False
    block_max_bytes: int = 8 << 20
    block_max_age_ms: int = 250
    # The latency-first block policy (tiered.tiering.blocks.durable): with no upload in flight a block may close once its
    # oldest record is `block_linger_ms` old (None: off, blocks wait out their age limit), at most
    # `block_max_puts_per_s` times a second, so that the PUTs it adds stay bounded.
    block_linger_ms: int | None = None
    block_max_puts_per_s: float = 10.0
    # On PostgreSQL a block's commit inserts the catalog rows of its runs itself when it has at most this many runs;
    # a wider block's runs are written packed in its row and expanded into rows after its acks (tiered.catalog.blocks;
    # 0: every block so).
    block_expand_in_commit_runs: int = 64
    # Memory for reads from the bucket (docs/configuration.md): range GET buffers, read-ahead and the reader's caches.
    remote_read_budget_bytes: int = 256 << 20
    # Remote reads give way to blocks in flight for at most this long at a time (tiered.tiering.blocks.hot_path; 0: never).
    remote_read_yield_ms: int = 200
    # How long a durable produce waits for its block's commit before it is answered "not confirmed" (0x03) when the
    # request names no ack timeout of its own; the block keeps retrying, so the records may still be committed.
    produce_ack_timeout_ms: int = 10_000
    # How often a broker runs remote retention (and the cleanup of abandoned copies) over the partitions it leads.
    remote_retention_interval_ms: int = 60_000
    # How often local retention runs over every partition besides each roll (TANK: 30 s): a copied segment past the
    # local limits leaves the disk at the next pass.
    local_retention_interval_ms: int = 30_000
    shutdown_timeout_s: float = 25.0
    # Several brokers as one service (docs/cluster.md): the TANK endpoint the others and the clients reach this
    # broker at (empty: the listen address), and the membership lease, renewed every third of it.
    advertise: str = ""
    cluster_lease_ms: int = 10_000
    log_level: str = "info"
    log_format: str = "text"
    # TLS on the TANK listener (tiered.tls): off unless a certificate and key are given; a client CA makes the
    # listener require client certificates signed by it. `listen_plain` adds a plaintext listener (e.g. localhost).
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    listen_plain: str = ""
    # The access rules file (tiered.acl): who may produce, consume, create topics and reload configuration; reloaded
    # when it changes. Empty: everything is allowed.
    acl: str = ""
    topic_defaults: Mapping[str, str] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        """Our own files inside the data dir; a dot folder, so it is never taken for a topic."""
        return self.data_dir / ".tiered"

    @property
    def effective_catalog_url(self) -> str:
        return self.catalog_url or f"sqlite:///{(self.state_dir / 'catalog.db').resolve()}"

    @property
    def effective_store_url(self) -> str:
        return self.store_url or f"file://{(self.state_dir / 'objects').resolve()}"

    def server_tls(self):
        """The listener's TLS files (tiered.tls.ServerTLS), or None when TLS is off. Raises SettingsError for a
        certificate without its key (or the reverse), or a client CA with TLS off."""
        from tiered.tls import ServerTLS

        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError("TLS needs both tls_cert and tls_key (--tls-cert, --tls-key)")
        if self.tls_client_ca and not self.tls_cert:
            raise SettingsError("tls_client_ca needs TLS on (--tls-cert and --tls-key)")

        return ServerTLS(self.tls_cert, self.tls_key, self.tls_client_ca) if self.tls_cert else None

    def s3_encryption(self) -> tuple[str, str] | None:
        """The server-side encryption asked of S3, (mode, KMS key id), or None when off (tiered.tiering.objects.store.
        store_options builds the store's from it). Raises SettingsError for a KMS key without kms, or encryption
        asked of a store that is not S3."""
        if self.s3_sse_kms_key_id and self.s3_sse != "kms":
            raise SettingsError(f"s3_sse_kms_key_id is set but s3_sse is {self.s3_sse}: a KMS key is used by "
                                "s3_sse = kms (--s3-sse kms) only")
        if self.s3_sse == "off":
            return None
        if not self.effective_store_url.startswith("s3://"):
            raise SettingsError(f"s3_sse = {self.s3_sse} asks S3 to encrypt objects, but the store is "
                                f"{mask_url(self.effective_store_url)}, not s3://")
        return self.s3_sse, self.s3_sse_kms_key_id

    def listen_plain_endpoint(self) -> tuple[str, int] | None:
        if self.listen_plain.strip().lower() in _OFF:
            return None
        return parse_endpoint(self.listen_plain, DEFAULT_PORT)

    def listen_endpoint(self) -> tuple[str, int]:
        return parse_endpoint(self.listen, DEFAULT_PORT)

    def http_endpoint(self) -> tuple[str, int] | None:
        if self.http_listen.strip().lower() in _OFF:
            return None
        return parse_endpoint(self.http_listen, DEFAULT_HTTP_PORT)

    def describe(self) -> dict[str, Any]:
        """Settings as they may be logged: URLs with any password masked."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = mask_url(value) if f.name.endswith("_url") else value
        out["catalog_url"] = mask_url(self.effective_catalog_url)
        out["store_url"] = mask_url(self.effective_store_url)
        out["data_dir"] = str(self.data_dir)
        out["topic_defaults"] = dict(self.topic_defaults)
        return out


def parse_endpoint(text: str, default_port: int) -> tuple[str, int]:
    """TANK's `[addr:]port` (also `addr` alone): an empty address means every interface."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        if text.isdigit():
            host, port = "", text
        else:
            host, port = text, str(default_port)
    host = host.strip("[]") or "0.0.0.0"
    try:
        number = int(port)
    except ValueError:
        raise SettingsError(f"bad endpoint {text!r}: port must be a number") from None
    if not 0 <= number <= 65535:
        raise SettingsError(f"bad endpoint {text!r}: port out of range")
    return host, number


def parse_size(text: str | int) -> int:
    """A size as topic configs spell it (TANK's grammar: `8m`, `512KiB`, `1g+512mb`; 1024-based)."""
    if isinstance(text, int):
        return text
    try:
        return parse_topic_size("".join(str(text).split()))
    except ValueError:
        raise SettingsError(f"bad size {text!r} (use a number with b, k, m, g, t, KiB, MiB or GiB)") from None


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"bad boolean {text!r}")


def parse_broker_id(text: str | int, hostname: str | None = None) -> int:
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise SettingsError(f"bad broker id {text!r} (a number, or auto)")
        return text
    text = str(text).strip()
    if text.lower() == "auto":
        m = re.search(r"(\d+)$", hostname if hostname is not None else socket.gethostname())
        return int(m.group(1)) if m else 0
    if not text.isdigit():
        raise SettingsError(f"bad broker id {text!r} (a number, or auto)")
    return int(text)


def _endpoint(default_port: int, may_be_off: bool = False):
    """A converter that keeps the endpoint's text but refuses it here, where its source is known, if it is bad."""

    def convert(value: str) -> str:
        text = str(value)
        if not (may_be_off and text.strip().lower() in _OFF):
            host, _ = parse_endpoint(text, default_port)
            _check_host(text, host, default_port)
        return text

    return convert


def _check_host(text: str, host: str, default_port: int) -> None:
    """A listen address must be an IP address or a name this machine resolves (a typo such as `-l abc` is named
    here, with its flag, rather than failing the bind later)."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise SettingsError(f"{text!r} does not name an address here: {host!r} is neither an IP address nor a "
                            f"host name this machine resolves (want [addr:]port, e.g. :{default_port} or "
                            f"127.0.0.1:{default_port})") from None


def _advertised(text: str) -> str:
    """`addr:port` as clients should reach this broker (TANK's redirects carry an IPv4 address and a port); empty: the
    listen address. A host name is allowed and resolved when the broker starts."""
    text = text.strip()
    if not text:
        return ""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise SettingsError(f"bad advertised endpoint {text!r} (want addr:port, e.g. 10.0.0.7:11011)")
    return text


def _at_least(convert, minimum: float, what: str):
    def checked(value):
        number = convert(value)
        if not number >= minimum:  # also refuses NaN
            raise SettingsError(f"{value!r} is below the minimum, {what}")
        return number

    return checked


def _notices_url(url: str) -> str:
    """A direct PostgreSQL URL (not through a pooler: LISTEN needs a session of its own), or empty."""
    if not url:
        return url
    parsed, pooled = split_pooled(normalize_url(url))
    if parsed.get_backend_name() != "postgresql":
        raise SettingsError(f"{mask_url(url)} is not a PostgreSQL URL: the notices are PostgreSQL's LISTEN")
    if pooled:
        raise SettingsError(f"{mask_url(url)} says pooled=true: the notices need a direct connection to PostgreSQL")
    return url


def _finite_seconds(value) -> float:
    number = float(value)
    if not 0 < number < float("inf"):
        raise SettingsError(f"{value!r} is not a positive number of seconds")
    return number


_CONVERTERS = {
    "data_dir": Path,
    "listen": _endpoint(DEFAULT_PORT),
    "http_listen": _endpoint(DEFAULT_HTTP_PORT, may_be_off=True),
    "catalog_url": str,
    "catalog_notices_url": lambda v: _notices_url(str(v).strip()),
    "store_url": str,
    "s3_path_style": parse_bool,
    "s3_sse": lambda v: _choice(v, ("off", "s3", "kms")),
    "s3_sse_kms_key_id": lambda v: str(v).strip(),
    "broker_id": parse_broker_id,
    "read_only": parse_bool,
    "block_max_bytes": _at_least(parse_size, 1024, "1 KiB"),
    "block_max_age_ms": _at_least(int, 1, "1 ms"),
    "block_linger_ms": _at_least(int, 0, "0 ms"),
    "block_max_puts_per_s": _at_least(float, 0.01, "0.01"),
    "block_expand_in_commit_runs": _at_least(int, 0, "0"),
    "remote_read_budget_bytes": _at_least(parse_size, 1 << 20, "1 MiB"),
    "remote_read_yield_ms": _at_least(int, 0, "0 ms"),
    "produce_ack_timeout_ms": _at_least(int, 1, "1 ms"),
    "remote_retention_interval_ms": _at_least(int, 100, "100 ms"),
    "local_retention_interval_ms": _at_least(int, 100, "100 ms"),
    "shutdown_timeout_s": _finite_seconds,
    "advertise": lambda v: _advertised(str(v)),
    "cluster_lease_ms": _at_least(int, 1000, "1000 ms"),
    "log_level": lambda v: _choice(v, ("debug", "info", "warning", "error")),
    "log_format": lambda v: _choice(v, ("text", "json")),
    "tls_cert": str,
    "tls_key": str,
    "tls_client_ca": str,
    "listen_plain": _endpoint(DEFAULT_PORT, may_be_off=True),
    "acl": lambda v: str(v).strip(),
}


def _choice(value: str, allowed: tuple[str, ...]) -> str:
    value = str(value).strip().lower()
    if value not in allowed:
        raise SettingsError(f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _convert(name: str, value: Any, source: str) -> Any:
    try:
        return _CONVERTERS[name](value)
    except (SettingsError, ValueError, TypeError) as exc:
        raise SettingsError(f"{source}: {name}: {exc}") from None


_FLAG_NAMES = {"catalog_url": "--catalog", "store_url": "--store"}  # the flags not named after their setting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `tiered serve`; every default is None so that unset flags fall through to env, file, default."""
    a = parser.add_argument
    a("--config", help="TOML config file (also TIERED_CONFIG)")
    defaults = Settings()
    a("-p", "--data-dir", dest="data_dir", help=f"local data directory (TANK's base path) (default {defaults.data_dir})")
    a("-l", "--listen", dest="listen", help="TANK protocol listener [addr:]port (default :11011)")
    a("-P", "--http-listen", dest="http_listen", help="metrics and health [addr:]port, or off (default :9102)")
    a("--catalog", dest="catalog_url", help="catalog URL: sqlite:///path or postgresql+psycopg://user@host/db")
    a("--catalog-notices-url", dest="catalog_notices_url",
      help="a direct PostgreSQL URL for the change notices when --catalog goes through a transaction-mode pooler "
           "(PgBouncer), where LISTEN does not work (default: none; the broker then looks every 0.25 s)")
    a("--store", dest="store_url", help="object store URL: file:///dir or s3://bucket/prefix")
    a("--s3-path-style", dest="s3_path_style", action="store_const", const=True, help="path-style S3 addressing")
    a("--s3-sse", dest="s3_sse",
      help="server-side encryption of every object written: off (the bucket's default), s3 (SSE-S3) or kms (SSE-KMS)")
    a("--s3-sse-kms-key-id", dest="s3_sse_kms_key_id",
      help="with --s3-sse kms: the KMS key id, ARN or alias/NAME (default: the account's aws/s3 key)")
    a("--broker-id", dest="broker_id", help="broker id, or auto (the host name's trailing number)")
    a("-r", "--read-only", dest="read_only", action="store_const", const=True, help="refuse produce and create")
    a("--block-max-bytes", dest="block_max_bytes", help="close a block at this size (default 8MiB)")
    a("--block-max-age-ms", dest="block_max_age_ms",
      help=f"close a block this long after its oldest record (default {defaults.block_max_age_ms})")
    a("--block-linger-ms", dest="block_linger_ms",
      help="with no upload in flight, close a block this long after its oldest record (default: off)")
    a("--block-max-puts-per-s", dest="block_max_puts_per_s",
      help="at most this many blocks a second closed early by --block-linger-ms (default 10)")
    a("--block-expand-in-commit-runs", dest="block_expand_in_commit_runs",
      help=f"on PostgreSQL, a block of at most this many runs writes their catalog rows in its commit, a wider one "
           f"after its acks (default {defaults.block_expand_in_commit_runs}; 0: every block after its acks)")
    a("--remote-read-budget-bytes", dest="remote_read_budget_bytes",
      help="memory for reads from the bucket: GET buffers, read-ahead, caches (default 256MiB)")
    a("--remote-read-yield-ms", dest="remote_read_yield_ms",
      help="remote reads pause at most this long at a time while a block uploads or commits (default 200; 0: never)")
    a("--produce-ack-timeout-ms", dest="produce_ack_timeout_ms",
      help="how long a durable produce waits for its commit before answering 'not confirmed' (default 10000)")
    a("--remote-retention-interval-ms", dest="remote_retention_interval_ms",
      help=f"run remote retention over the partitions led here this often (default {defaults.remote_retention_interval_ms})")
    a("--local-retention-interval-ms", dest="local_retention_interval_ms",
      help=f"run local retention over every partition this often, besides each roll "
           f"(default {defaults.local_retention_interval_ms})")
    a("--shutdown-timeout-s", dest="shutdown_timeout_s",
      help=f"graceful shutdown budget in seconds (default {defaults.shutdown_timeout_s:g})")
    a("--advertise", dest="advertise",
      help="addr:port clients and other brokers reach this broker at (default: the listen address)")
    a("--cluster-lease-ms", dest="cluster_lease_ms",
      help="membership lease: a broker that has not renewed it for this long is taken over (default 10000)")
    a("--log-level", dest="log_level", help=f"debug, info, warning or error (default {defaults.log_level})")
    a("--log-format", dest="log_format", help=f"text or json (default {defaults.log_format})")
    a("--tls-cert", dest="tls_cert", help="TLS on the TANK listener: certificate chain file (PEM), reloaded on change")
    a("--tls-key", dest="tls_key", help="TLS private key file (PEM) for --tls-cert")
    a("--tls-client-ca", dest="tls_client_ca", help="require client certificates signed by this CA (mutual TLS)")
    a("--listen-plain", dest="listen_plain", help="a second, plaintext TANK listener [addr:]port (default: none)")
    a("--acl", dest="acl", metavar="FILE",
      help="access rules: who may produce, consume, create and reload, per topic (default: everyone may do all)")


def load_settings(
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Builds the settings from flags, environment, config file and defaults, in that precedence."""
    environ = os.environ if environ is None else environ
    flags = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
    values: dict[str, Any] = {}
    config_path = flags.get("config") or environ.get(ENV_PREFIX + "CONFIG")
    topic_defaults: dict[str, str] = {}
    if config_path:
        try:
            document = tomllib.loads(Path(config_path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"config file {config_path}: {exc}") from None
        for key, value in document.items():
            if key == "topic_defaults":
                if not isinstance(value, dict):
                    raise SettingsError(f"config file {config_path}: topic_defaults must be a table")
                topic_defaults = {str(k).lower(): str(v) for k, v in value.items()}
            elif key == "cluster" and isinstance(value, dict):  # [cluster] lease_ms = ..., advertise = ...
                for sub, sub_value in value.items():
                    name = sub if sub == "advertise" else f"cluster_{sub}"
                    if name not in _CONVERTERS:
                        raise SettingsError(f"config file {config_path}: unknown setting cluster.{sub}")
                    values[name] = _convert(name, sub_value, f"config file {config_path}")
            elif key in _CONVERTERS:
                values[key] = _convert(key, value, f"config file {config_path}")
            else:
                raise SettingsError(f"config file {config_path}: unknown setting {key!r}")
    for name in _CONVERTERS:
        env_value = environ.get(ENV_PREFIX + name.upper())
        if env_value is not None and env_value != "":
            values[name] = _convert(name, env_value, f"environment {ENV_PREFIX + name.upper()}")
    for name in _CONVERTERS:
        if flags.get(name) is not None:
            values[name] = _convert(name, flags[name], f"flag {_FLAG_NAMES.get(name, '--' + name.replace('_', '-'))}")
    if "broker_id" not in values:
        values["broker_id"] = parse_broker_id("auto")  # the documented default
    settings = replace(Settings(), **values, topic_defaults=topic_defaults)
    for path in (settings.data_dir, settings.state_dir):
        if path.exists() and not path.is_dir():
            raise SettingsError(f"data directory {settings.data_dir}: {path} is not a directory")
    return settings
