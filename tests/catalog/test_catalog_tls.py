"""The catalog over TLS: `sslmode=verify-full` with the CA that signed the server's certificate connects (and the
connection is encrypted); a wrong CA, or a plaintext connection, is refused in one line without the password."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from sqlalchemy import text

from tiered.catalog import Catalog
from tiered.catalog.migrate import upgrade

from tests.support.broker import REPO
from tests.support.pg_tls import PASSWORD, TlsPg, start_tls_cluster

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def tls_pg(tmp_path_factory):
    pg = start_tls_cluster(tmp_path_factory.mktemp("tls-pg"))
    yield pg
    pg.stop()


def db_upgrade(url: str, **pg_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERED_", "PG"))}
    env.update(pg_env, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "tiered.cli.main", "db", "upgrade", "--catalog", url],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_verify_full_connects_over_tls(tls_pg: TlsPg, host: str) -> None:
    url = tls_pg.url(host=host)
    upgrade(url)
    catalog = Catalog.open(url)
    try:
        with catalog.engine.connect() as connection:
            row = connection.execute(text(
                "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).one()
    finally:
        catalog.close()
    assert row.ssl is True and row.version in ("TLSv1.2", "TLSv1.3")


def test_the_cli_upgrades_the_catalog_through_verify_full(tls_pg: TlsPg) -> None:
    done = db_upgrade(tls_pg.url())
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    assert "postgres:***@127.0.0.1" in done.stdout


@pytest.mark.parametrize(("which", "expected"), [
    ("wrong CA", "certificate verify failed"),
    ("plaintext", "no encryption"),
])
def test_a_wrong_ca_or_plaintext_is_refused_in_one_line(tls_pg: TlsPg, which: str, expected: str) -> None:
    url = tls_pg.url(ca=tls_pg.wrong_ca) if which == "wrong CA" else tls_pg.url(sslmode="disable")
    done = db_upgrade(url)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiered db upgrade: postgresql+psycopg://postgres:***@"), lines
    assert expected in lines[0]
    assert PASSWORD not in done.stdout + done.stderr


def test_the_ca_and_mode_from_libpqs_environment(tls_pg: TlsPg) -> None:
    """What the chart's catalog.rootCA sets: PGSSLROOTCERT and PGSSLMODE=verify-full, the URL naming neither."""
    url = tls_pg.url(sslmode=None)
    done = db_upgrade(url, PGSSLROOTCERT=str(tls_pg.certs.ca_path), PGSSLMODE="verify-full")
    assert done.returncode == 0, done.stderr
    done = db_upgrade(url, PGSSLROOTCERT=str(tls_pg.wrong_ca), PGSSLMODE="verify-full")
    assert done.returncode == 1 and "certificate verify failed" in done.stderr
