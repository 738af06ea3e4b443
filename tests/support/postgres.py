"""pytest plugin: a throwaway PostgreSQL cluster per test session, and fresh migrated catalogs per test.

Fixtures:
- `pg_cluster` (session): a real PostgreSQL server from /usr/lib/postgresql/*/bin in a temp dir, fsync off,
  on 127.0.0.1 and a free port. `.url(dbname)`, `.create_database()`, `.stop()`, `.start()`, `.restart()`
  (for tests that take the server away mid-commit; the cluster's data survives).
- `pg_empty_url`: a fresh, empty database (for migration tests).
- `pg_url`: a database built by the migrations, holding no rows, for this test alone (recycled between tests:
  see `_MigratedDatabases`).
- `catalog_url`: parametrized over the backends TIERED_TEST_CATALOGS names (comma-separated; default
  "sqlite,postgresql"; "pgbouncer" is PostgreSQL through PgBouncer in transaction mode, tests/support/pgbouncer.py):
  a fresh migrated catalog URL on each. tests/catalog/ adds "pgbouncer" to the default.

As root (CI containers), the server runs as the `postgres` user through `runuser`, in a directory chowned to it.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tiered.cli.dev import find_pg_bindir

TEMPLATE_DB = "tiered_template"


def _find_bindir() -> Path:
    bindir = find_pg_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries not found (initdb, pg_ctl): run `make system-deps`")
    return bindir


class PgCluster:
    """A PostgreSQL cluster in its own temp dir. Connections use trust auth as user `postgres`."""

    def __init__(self, bindir: Path, root: Path, port: int):
        self.bindir = bindir
        self.root = root
        self.datadir = root / "data"
        self.port = port
        self._as_postgres = os.geteuid() == 0
        self._names = itertools.count(1)

    def _run(self, *argv: str) -> None:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}\n{log[-4000:]}")

    def init(self) -> None:
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-A", "trust", "-U", "postgres", "-E", "UTF8", "-D", str(self.datadir))

    def start(self) -> None:
        options = (
            f"-F -p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.root / "server.log"), "-o", options, "start", "-w")

    def stop(self, mode: str = "fast") -> None:
        """Stops the server: "fast" rolls back open transactions, "immediate" is a crash (no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.datadir), "stop", "-m", mode, "-w")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def execute(self, sql: str) -> None:
        """Runs one statement outside a transaction (CREATE DATABASE and friends) on the `postgres` database."""
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(sql)

    def create_database(self, template: str = "template1") -> str:
        """A new database with a unique name; returns its URL."""
        name = f"t{os.getpid()}_{next(self._names)}"
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url(name)


@pytest.fixture(scope="session")
def pg_cluster():
    root = Path(tempfile.mkdtemp(prefix="tiered-pg-"))
    cluster = PgCluster(_find_bindir(), root, free_port())
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop("immediate")
        except RuntimeError:
            pass  # never started, or already stopped by a test
        shutil.rmtree(root, ignore_errors=True)


class _MigratedDatabases:
    """Databases built by the migrations, recycled between tests.

    The first is built by `upgrade(url)` and serves as a template; more are cloned from it (CREATE DATABASE ...
    TEMPLATE copies files) when needed. After a test, its database is emptied (TRUNCATE ... RESTART IDENTITY,
    after ending any connection the test left open) and reused: cloning costs ~0.5 s, emptying ~20 ms. A database
    whose schema the test changed is dropped from the pool instead.
    """

    def __init__(self, cluster: PgCluster):
        from tiered.catalog.migrate import head, upgrade
        from tiered.catalog.models import Base

        self.cluster = cluster
        self.head = head()
        self.tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
        cluster.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
        upgrade(cluster.url(TEMPLATE_DB))
        self.free: list[str] = []

    def take(self) -> str:
        return self.free.pop() if self.free else self.cluster.create_database(template=TEMPLATE_DB)

    def give_back(self, url: str) -> None:
        import psycopg

        dbname = url.rsplit("/", 1)[1]
        try:
            self.cluster.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                f" WHERE datname = '{dbname}' AND pid <> pg_backend_pid()"
            )
            dsn = f"host=127.0.0.1 port={self.cluster.port} user=postgres dbname={dbname}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                if conn.execute("SELECT version_num FROM alembic_version").fetchall() != [(self.head,)]:
                    return
                conn.execute("SET lock_timeout = '5s'")
                conn.execute(f"TRUNCATE {self.tables} RESTART IDENTITY")
        except psycopg.Error:
            return  # the server was stopped by the test, or the schema is gone: do not reuse
        self.free.append(url)


@pytest.fixture(scope="session")
def _pg_databases(pg_cluster) -> _MigratedDatabases:
    return _MigratedDatabases(pg_cluster)


@pytest.fixture
def pg_empty_url(pg_cluster) -> str:
    return pg_cluster.create_database()


@pytest.fixture
def pg_url(_pg_databases):
    url = _pg_databases.take()
    yield url
    _pg_databases.give_back(url)


def libpq_url(url: str) -> str:
    """A catalog URL as psycopg.connect takes it: no SQLAlchemy driver name, no `pooled` parameter."""
    from tiered.catalog.engine import normalize_url, split_pooled

    parsed, _ = split_pooled(normalize_url(url))
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


CATALOG_BACKENDS = ("sqlite", "postgresql", "pgbouncer")


def test_catalogs(default: str = "sqlite,postgresql") -> list[str]:
    """The catalog backends to run on: TIERED_TEST_CATALOGS, else `default`. An unknown name stops the run."""
    names = [n.strip() for n in os.environ.get("TIERED_TEST_CATALOGS", default).split(",") if n.strip()]
    unknown = sorted(set(names) - set(CATALOG_BACKENDS))
    if unknown:
        raise pytest.UsageError(f"TIERED_TEST_CATALOGS: unknown {', '.join(unknown)} (known: {', '.join(CATALOG_BACKENDS)})")
    return names


test_catalogs.__test__ = False  # a helper named test_*, not a test


def fresh_catalog_url(request, backend: str, tmp_path: Path) -> str:
    """A fresh catalog built by the migrations on `backend` (one of CATALOG_BACKENDS)."""
    if backend == "postgresql":
        return request.getfixturevalue("pg_url")
    if backend == "pgbouncer":
        return request.getfixturevalue("pgbouncer_url")
    from tiered.catalog.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    upgrade(url)
    return url


@pytest.fixture(params=test_catalogs())
def catalog_url(request, tmp_path) -> str:
    """A fresh catalog built by the migrations, once on each backend of TIERED_TEST_CATALOGS."""
    return fresh_catalog_url(request, request.param, tmp_path)
