"""A CA and the certificates it signs, made with the `openssl` command for TLS tests (tests/server/test_tls.py,
test_access.py, tests/cluster/test_tls_redirect.py, the catalog over TLS in tests/support/pg_tls.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HAVE_OPENSSL = shutil.which("openssl") is not None


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class Certs:
    """A CA and certificates it signs, as PEM files in `folder`."""

    def __init__(self, folder: Path, ca_name: str = "ca"):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca = ca_name
        _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
             f"{ca_name}.key", "-out", f"{ca_name}.pem", "-subj", f"/CN={ca_name}", "-days", "2", cwd=folder)

    @property
    def ca_path(self) -> Path:
        return self.folder / f"{self.ca}.pem"

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def issue(self, name: str, *, days: int = 2, cn: str | None = None,
              san: str = "IP:127.0.0.1,DNS:localhost") -> tuple[str, str]:
        """(cert, key) signed by this CA: subject CN `cn` (default `name`; "" for a subject without a CN) and the
        subjectAltNames `san`; days=-1 makes one that has expired."""
        (self.folder / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        subject = f"/CN={name if cn is None else cn}" if cn != "" else "/O=tiered-tests"
        _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=self.folder)
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{self.ca}.pem", "-CAkey", f"{self.ca}.key", "-out",
             f"{name}.pem", "-days", str(days), "-extfile", f"{name}.ext", cwd=self.folder)
        return self.path(f"{name}.pem"), self.path(f"{name}.key")
