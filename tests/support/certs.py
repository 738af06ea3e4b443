"""Certificates made for a test by the `openssl` command: a CA and the certificates it signs, as PEM files."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class Certs:
    """A CA named `ca_name` in `folder` (`<ca_name>.pem`, `<ca_name>.key`), and the certificates it issues."""

    def __init__(self, folder: Path, ca_name: str = "ca"):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca = ca_name
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                 f"{ca_name}.key", "-out", f"{ca_name}.pem", "-subj", f"/CN={ca_name}", "-days", "2", cwd=folder)

    @property
    def ca_path(self) -> Path:
        return self.folder / f"{self.ca}.pem"

    def issue(self, name: str, *, days: int = 2) -> tuple[Path, Path]:
        """(certificate, key) for 127.0.0.1 and localhost, signed by this CA; days=-1 makes one that has expired."""
        (self.folder / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=self.folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{self.ca}.pem", "-CAkey", f"{self.ca}.key", "-out",
                 f"{name}.pem", "-days", str(days), "-extfile", f"{name}.ext", cwd=self.folder)
        return self.folder / f"{name}.pem", self.folder / f"{name}.key"
