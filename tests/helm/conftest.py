"""Rendering the chart once per (values file, extra flags) per session, parsed into Kubernetes objects."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.support.helm import REPO_ROOT, Helm

CHART = REPO_ROOT / "helm" / "tiered"
HERE = Path(__file__).parent
VALUES = sorted((HERE / "values").glob("*.yaml"))
BAD_VALUES = sorted((HERE / "bad-values").glob("*.yaml"))
RELEASE = "rel"
NAMESPACE = "streams"
# The Kubernetes version the chart is rendered for and validated against (kubernetes-validate ships its schemas).
KUBE_VERSION = "1.33.0"


@dataclass(frozen=True)
class Rendered:
    """The objects of one `helm template`, in helm's order, plus the raw text."""

    text: str
    objects: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
        return found[0]

    @property
    def config_map(self) -> dict[str, Any]:
        """The ConfigMap holding the broker's config file (another may hold the access rules)."""
        (found,) = [o for o in self.of_kind("ConfigMap") if "tiered.toml" in o["data"]]
        return found

    @property
    def broker(self) -> dict[str, Any]:
        """The StatefulSet's broker container."""
        (container,) = self.one("StatefulSet")["spec"]["template"]["spec"]["containers"]
        return container


def parse_manifests(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="session")
def render(helm: Helm) -> Callable[..., Rendered]:
    """render(values_name, *flags) -> Rendered; values_name is a file stem under tests/helm/values."""
    cache: dict[tuple[str, ...], Rendered] = {}

    def _render(values_name: str, *flags: str) -> Rendered:
        key = (values_name, *flags)
        if key not in cache:
            text = helm.check(
                "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                "-f", str(HERE / "values" / f"{values_name}.yaml"), *flags,
            )
            cache[key] = Rendered(text=text, objects=parse_manifests(text))
        return cache[key]

    return _render


@pytest.fixture(scope="session")
def notes(helm: Helm) -> Callable[[str], str]:
    """notes(values_name) -> the rendered NOTES.txt, from a client-side dry-run install (no cluster)."""
    cache: dict[str, str] = {}

    def _notes(values_name: str) -> str:
        if values_name not in cache:
            out = helm.check(
                "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", "-o", "json",
                "-f", str(HERE / "values" / f"{values_name}.yaml"),
            )
            cache[values_name] = json.loads(out)["info"]["notes"]
        return cache[values_name]

    return _notes


def values_of(values_name: str) -> dict[str, Any]:
    return yaml.safe_load((HERE / "values" / f"{values_name}.yaml").read_text())


# The downward API fields the chart reads, with the values a kubelet would give one pod.
POD_FIELDS = {"status.podIP": "10.244.1.7"}
VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def pod_environ(container: dict[str, Any]) -> dict[str, str]:
    """The plain environment the kubelet gives the container: fieldRef entries from POD_FIELDS, and `$(NAME)` in
    a value replaced by an earlier entry's value (`$$` is a literal `$`; a reference to an unknown or later name
    stays as written), as Kubernetes expands them. Secret references are left out: no Secret exists here."""
    environ: dict[str, str] = {}

    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return environ.get(match.group(1), match.group(0))

    for entry in container.get("env", []):
        if "value" in entry:
            environ[entry["name"]] = VAR_REF.sub(expand, entry["value"])
        elif "fieldRef" in entry.get("valueFrom", {}):
            environ[entry["name"]] = POD_FIELDS[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return environ
