"""A throwaway PostgreSQL that speaks TLS only, with a server certificate made for the test and a password.

`start_tls_cluster(root)` initialises a cluster (tests/support/postgres.py), sets the password of `postgres` while
the cluster still trusts local connections, then restarts it with `ssl = on`, the certificate for 127.0.0.1 and
localhost signed by `certs.ca_path`, and a pg_hba.conf that admits TCP connections over TLS with the password only
(`hostssl ... scram-sha-256`; there is no `host` line, so a plaintext connection is refused too).
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any
from pathlib import Path
from urllib.parse import quote

from tests.support.certs import Certs
from tests.support.ports import free_port

PASSWORD = "Cat4log-pw-7e1d9b"  # distinctive, so that a test can look for it in any output
DATABASE = "tiered"


@dataclass
class TlsPg:
    cluster: Any  # tests.support.postgres.PgCluster
    certs: Certs
    wrong_ca: Path  # a CA that did not sign the server's certificate

    def url(self, *, ca: Path | None = None, host: str = "127.0.0.1", sslmode: str | None = "verify-full") -> str:
        """The catalog URL, its password in it; sslmode None: no query (libpq's environment decides)."""
        base = f"postgresql+psycopg://postgres:{quote(PASSWORD, safe='')}@{host}:{self.cluster.port}/{DATABASE}"
        if sslmode is None:
            return base
        if sslmode.startswith("verify"):
            return f"{base}?sslmode={sslmode}&sslrootcert={ca or self.certs.ca_path}"
        return f"{base}?sslmode={sslmode}"

    def stop(self) -> None:
        try:
            self.cluster.stop("immediate")
        except RuntimeError:
            pass
        shutil.rmtree(self.cluster.root, ignore_errors=True)


def start_tls_cluster(root: Path) -> TlsPg:
    # Imported here: tests/support/postgres.py is a pytest plugin, which must be imported by pytest first.
    from tests.support.postgres import PgCluster, _find_bindir

    certs = Certs(root / "certs")
    server_cert, server_key = certs.issue("server")
    wrong = Certs(root / "wrong-ca", ca_name="other-ca")
    # Its own directory under the temp dir, as pg_cluster's: as root the server runs as `postgres`, which could not
    # reach a directory inside pytest's private tmp_path.
    cluster = PgCluster(_find_bindir(), Path(tempfile.mkdtemp(prefix="tiered-pg-tls-")), free_port())
    cluster.init()
    cluster.start()
    cluster.execute(f"ALTER USER postgres PASSWORD '{PASSWORD}'")
    cluster.execute(f'CREATE DATABASE "{DATABASE}"')
    cluster.stop()
    for source, name in ((server_cert, "server.crt"), (server_key, "server.key")):
        target = cluster.datadir / name
        shutil.copyfile(source, target)
        os.chmod(target, 0o600)  # PostgreSQL refuses a key others may read
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(target, pw.pw_uid, pw.pw_gid)
    with open(cluster.datadir / "postgresql.conf", "a") as conf:
        conf.write("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
                   "password_encryption = 'scram-sha-256'\n")
    (cluster.datadir / "pg_hba.conf").write_text(
        "local all all trust\n"
        "hostssl all all 127.0.0.1/32 scram-sha-256\n"
    )
    cluster.start()
    return TlsPg(cluster, certs, wrong.ca_path)
