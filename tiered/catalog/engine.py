"""Opening the catalog: URLs, engines, transactions, and the `Catalog` handle every query function takes.

The calling convention, everywhere in tiered.catalog: a query function takes a `Catalog` first and runs in its own
transaction (`cat.write()` or `cat.read()`), so one call is one atomic step. The API is synchronous; the asyncio
server calls it through tiered.tiering.catalog_access.AsyncCatalog (worker threads, deadlines), and a `Catalog` may
be shared by threads.

URLs: `sqlite:///path` (the embedded single-node default: WAL, busy timeout, foreign keys, full sync) or
`postgresql+psycopg://user@host/db` (`postgresql://` and `postgres://` are read as psycopg 3). Passwords are
masked wherever a URL is shown (`mask_url`, `repr`).

Pooled: `?pooled=true` on a PostgreSQL URL says a pooler in transaction mode (PgBouncer's `pool_mode =
transaction`) stands between the catalog and PostgreSQL, so that consecutive transactions may run on different
server sessions. Nothing may then outlive a transaction: psycopg prepares no statement on the server
(prepare_threshold=None), the timeouts are set per transaction (SET LOCAL, through set_config) instead of as
connection options, and reads run in a transaction rather than in autocommit (a SET LOCAL needs one). The catalog
uses nothing else that is session-scoped: no LISTEN, no session advisory lock (migrations take a transaction's
one), no temporary table. docs/scale.md, "Connection pooling", has the pool sizes.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, exc, literal_column
from sqlalchemy.engine import URL, make_url

from tiered.catalog.errors import CatalogUnavailable

LOCK_TIMEOUT_MS = 10_000
# Every statement and connection attempt on PostgreSQL is bounded, so a hung server or network gives an error (a
# transient CatalogUnavailable, retried) rather than a worker thread stuck forever.
STATEMENT_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 5


POOLED = "pooled"  # the URL query parameter that says a transaction-mode pooler is in between
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def normalize_url(url: str | URL) -> URL:
    """The URL as SQLAlchemy should open it: PostgreSQL always through psycopg 3."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername not in ("postgresql+psycopg", "sqlite", "sqlite+pysqlite"):
        raise ValueError(f"unsupported catalog URL {mask_url(parsed)}: use sqlite:///path or postgresql+psycopg://user@host/db")
    return parsed


def split_pooled(url: URL) -> tuple[URL, bool]:
    """The URL without its `pooled` parameter (the driver would refuse it), and whether it said true."""
    if POOLED not in url.query:
        return url, False
    value = url.query[POOLED]
    text = (value[-1] if isinstance(value, tuple) else value).lower()
    if text not in _TRUE + _FALSE:
        raise ValueError(f"bad {POOLED}={text!r} in catalog URL {mask_url(url)}: use {POOLED}=true or {POOLED}=false")
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"{POOLED}= is for PostgreSQL catalog URLs, not {mask_url(url)}")
    return url.difference_update_query([POOLED]), text in _TRUE


def sqlite_file(url: str | URL) -> Path | None:
    """The file a SQLite catalog URL names; None for another backend or an in-memory database."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def mask_url(url: str | URL) -> str:
    """The URL with its password replaced by ***, fit for logs and messages. Parsed by SQLAlchemy, the parser that
    connects, so a password holding `#`, `?` or `/` (which urlsplit misreads) is found whole. A text that is not a
    URL is returned with everything between `://` and the last `@` masked."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    text = str(url)
    try:
        parsed = make_url(text)
    except exc.ArgumentError:
        scheme, sep, rest = text.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}" if sep and "@" in rest else text
    return parsed.render_as_string(hide_password=True) if parsed.password is not None else text


def url_password(url: str) -> str | None:
    """The password in `url` as the driver will use it (None when there is none, or `url` is not a URL)."""
    try:
        return make_url(url).password
    except exc.ArgumentError:
        return None


def make_engine(
    url: str | URL, *, pool_size: int = 5, max_overflow: int = 10, lock_timeout_ms: int | None = LOCK_TIMEOUT_MS
) -> Engine:
    """An engine for `url`, with the per-backend setup the catalog's transactions rely on.

    `lock_timeout_ms` bounds every wait for a lock (SQLite's busy timeout, PostgreSQL's lock_timeout): a call
    stuck behind another transaction fails with CatalogUnavailable instead of hanging. None waits forever.
    """
    parsed, pooled = split_pooled(normalize_url(url))
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, lock_timeout_ms)
    connect_args: dict[str, object] = {"connect_timeout": CONNECT_TIMEOUT_S}
    timeouts = {"statement_timeout": STATEMENT_TIMEOUT_MS}
    if lock_timeout_ms is not None:
        timeouts["lock_timeout"] = int(lock_timeout_ms)
    if pooled:
        # The next transaction may run on another server session: a prepared statement would be missing there.
        connect_args["prepare_threshold"] = None
    elif "options" not in parsed.query:
        connect_args["options"] = " ".join(f"-c {name}={value}" for name, value in timeouts.items())
    engine = create_engine(
        parsed, pool_pre_ping=True, pool_size=pool_size, max_overflow=max_overflow, connect_args=connect_args,
        execution_options={"tiered_pooled": pooled},  # read by Catalog
    )
    if pooled:
        # One statement at the start of every transaction, on the driver connection (so the statement counter
        # counts the same statements as unpooled); set_config(..., true) is SET LOCAL: it ends with the transaction.
        settings = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in timeouts.items())

        import psycopg

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            try:
                conn.connection.driver_connection.execute(f"SELECT {settings}")
            except psycopg.OperationalError as error:  # not wrapped by SQLAlchemy: sent on the driver connection
                raise CatalogUnavailable(str(error).strip() or type(error).__name__) from error

    return engine


def _sqlite_engine(url: URL, lock_timeout_ms: int | None) -> Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    busy_timeout_ms = 2**31 - 1 if lock_timeout_ms is None else int(lock_timeout_ms)
    # The pool hands a connection to one thread at a time, so sqlite3's own thread check is only in the way.
    engine = create_engine(url, pool_pre_ping=True, connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # Take transactions away from the sqlite3 module (which begins them lazily and too late): the "begin"
        # listener below issues BEGIN itself.
        dbapi_connection.isolation_level = None
        for pragma in (
            "journal_mode = WAL",
            f"busy_timeout = {busy_timeout_ms}",
            "foreign_keys = ON",
            # An acknowledged produce must survive a power cut: sync the WAL on every commit.
            "synchronous = FULL",
        ):
            dbapi_connection.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front (BEGIN IMMEDIATE): a deferred transaction that reads and then
        # writes can fail with SQLITE_BUSY instead of waiting. Issued on the driver connection, so that the
        # statement counter counts the same statements on both backends.
        mode = "IMMEDIATE" if conn.get_execution_options().get("tiered_write") else "DEFERRED"
        conn.connection.driver_connection.execute(f"BEGIN {mode}")

    return engine


def _sqlite_busy(error: sqlite3.Error) -> bool:
    # SQLite reports "no such table" and friends as OperationalError too; only lock waits are transient there.
    return isinstance(error, sqlite3.OperationalError) and ("locked" in str(error) or "busy" in str(error))


def _is_transient(error: exc.DBAPIError) -> bool:
    if error.connection_invalidated or isinstance(error, exc.InterfaceError):
        return True
    if isinstance(error.orig, sqlite3.Error):
        return _sqlite_busy(error.orig)
    # psycopg: connection failures, server shutdown, lock and statement timeouts, deadlock and serialization
    # failures. All leave the database as it was before the transaction, or with its outcome unknown.
    return isinstance(error, exc.OperationalError)


@contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raises a lost connection or lock timeout as CatalogUnavailable; everything else passes through."""
    try:
        yield
    except exc.DBAPIError as error:
        if _is_transient(error):
            raise CatalogUnavailable(str(error.orig).strip() or type(error.orig).__name__) from error
        raise
    except sqlite3.OperationalError as error:  # from the BEGIN issued on the driver connection
        if _sqlite_busy(error):
            raise CatalogUnavailable(str(error)) from error
        raise


def inline_limit(n: int):
    """A LIMIT written into the statement's text instead of sent as a parameter (SQLAlchemy's default). PostgreSQL
    plans a prepared statement (psycopg prepares after 5 executions) for an unknown LIMIT as if it returned a tenth
    of the rows, which makes the generic plan look dearer than the custom plans for LIMIT 1: it then plans every
    execution anew. With the number in the text the generic plan is kept, and planning happens once per session.
    One statement text per distinct limit: callers use a few."""
    return literal_column(str(int(n)))


def utcnow(now: datetime | None = None) -> datetime:
    """`now` if given (tests pass a fake clock), else the current UTC time."""
    return now if now is not None else datetime.now(timezone.utc)


class Catalog:
    """A thread-safe handle on the catalog database: its engine, its transactions and a statement counter."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.backend = engine.dialect.name  # "postgresql" or "sqlite"
        # Behind a transaction-mode pooler (see the module docstring): reads are transactions too.
        self.pooled = bool(engine.get_execution_options().get("tiered_pooled"))
        self._statements = 0
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._count)

    @classmethod
    def open(
        cls,
        url: str | URL,
        *,
        pool_size: int = 5,
        max_overflow: int = 10,
        lock_timeout_ms: int | None = LOCK_TIMEOUT_MS,
    ) -> Catalog:
        """Opens the catalog at `url` (connections are made on first use). See make_engine for the options."""
        return cls(make_engine(url, pool_size=pool_size, max_overflow=max_overflow, lock_timeout_ms=lock_timeout_ms))

    def close(self) -> None:
        """Closes every pooled connection. The Catalog must not be used afterwards."""
        event.remove(self.engine, "before_cursor_execute", self._count)
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Catalog({mask_url(self.engine.url)})"

    @property
    def url(self) -> str:
        """The database URL with the password masked."""
        return mask_url(self.engine.url)

    @property
    def statements(self) -> int:
        """SQL statements sent so far by this Catalog (BEGIN/COMMIT not counted): for the benchmark."""
        return self._statements

    def _count(self, *_args) -> None:
        with self._lock:
            self._statements += 1

    def counted(self) -> None:
        """Counts a statement sent on the driver's own cursor (a COPY), which SQLAlchemy's events do not see."""
        self._count()

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One read-write transaction: committed when the block ends, rolled back if it raises.

        On SQLite it holds the database write lock from BEGIN (IMMEDIATE); on PostgreSQL it runs at READ COMMITTED
        and a function that must serialise with others locks rows (SELECT ... FOR UPDATE, in a fixed order).
        """
        with translate_errors(), self.engine.connect() as conn:
            conn.execution_options(tiered_write=True)
            with conn.begin():
                yield conn

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """One read-only transaction that sees a single snapshot across all its statements (REPEATABLE READ on
        PostgreSQL; SQLite's deferred transaction keeps the snapshot of its first read): for a reader that must
        compare rows read by several statements while commits go on."""
        with translate_errors(), self.engine.connect() as conn:
            if self.backend == "postgresql":
                conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only connection. On PostgreSQL in autocommit mode (each statement is its own snapshot, and there
        is no BEGIN/ROLLBACK round trip), or one read-only transaction when pooled (its timeouts are SET LOCAL); on
        SQLite one deferred transaction (a snapshot of the WAL)."""
        with translate_errors(), self.engine.connect() as conn:
            if self.backend == "postgresql":
                if self.pooled:
                    conn.execution_options(postgresql_readonly=True)
                else:
                    conn.execution_options(isolation_level="AUTOCOMMIT")
            with conn.begin():
                yield conn
