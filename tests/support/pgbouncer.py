"""pytest plugin: PgBouncer in transaction mode in front of the session's PostgreSQL (tests/support/postgres.py),
as the catalog is deployed with many brokers (docs/scale.md, "Connection pooling").

Fixtures:
- `pgbouncer` (session): a `pgbouncer` process (Debian's package) on 127.0.0.1 and a free port, `pool_mode =
  transaction`, every database of the cluster behind it (`* =`). `.url(dbname)` is the catalog URL through it,
  with `?pooled=true`.
- `pgbouncer_url`: a fresh migrated catalog (a `pg_url` database) reached through PgBouncer.

As root (CI containers) it runs as the `postgres` user (PgBouncer refuses to run as root).
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported for real by pytest as a plugin: importing it here would bypass its assertion rewriting
    from tests.support.postgres import PgCluster

POOL_SIZE = 20  # server connections per (database, user): more than the tests' engines hold at once


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raise_file_limit() -> None:
    """In the child: as many open files as allowed, for max_client_conn (tests leave idle clients to the GC)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (OSError, ValueError):
            pass  # the limit stays: enough unless clients leak by the thousand


def _find_pgbouncer() -> str:
    for candidate in (shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError("pgbouncer not found: run `make system-deps`")


class PgBouncer:
    """A PgBouncer process in front of `cluster`, trusting user `postgres` like the cluster does."""

    def __init__(self, cluster: PgCluster, root: Path, port: int):
        self.cluster = cluster
        self.root = root
        self.port = port
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        (self.root / "users.txt").write_text('"postgres" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.cluster.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {POOL_SIZE}\nmax_client_conn = 5000\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
            "server_login_retry = 1\n"
        )
        as_user: dict[str, int] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, pw.pw_uid, pw.pw_gid)
            as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        # Started directly (not through runuser), so that SIGTERM reaches it. It logs to stderr as well as to its
        # logfile: a pipe nobody reads would fill up and stop it.
        self.proc = subprocess.Popen([_find_pgbouncer(), str(self.root / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_raise_file_limit, **as_user)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}?pooled=true"

    def url_for(self, direct_url: str) -> str:
        """The URL through PgBouncer of the database `direct_url` names."""
        return self.url(direct_url.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def pgbouncer(pg_cluster):
    root = Path(tempfile.mkdtemp(prefix="tiered-pgbouncer-"))
    bouncer = PgBouncer(pg_cluster, root, _free_port())
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pgbouncer_url(pgbouncer, pg_url) -> str:
    # When the test ends its database is emptied for reuse, which ends PgBouncer's server connections to it from
    # the server side: PgBouncer sees them close ("server conn crashed?") and opens new ones for the next test.
    return pgbouncer.url_for(pg_url)
