"""The Dockerfile, read (no container engine here): base image, user, ports, entrypoint, no secrets, build context."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass

import yaml

from tests.support.helm import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
CHART_VALUES = yaml.safe_load((REPO_ROOT / "helm" / "tiered" / "values.yaml").read_text())
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SECRETISH = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|ACCESS_KEY|CREDENTIAL|PRIVATE", re.IGNORECASE)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str

    def json_args(self) -> list[str]:
        """The exec (JSON array) form; shell form is refused where the exec form matters."""
        value = json.loads(self.args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self
        return value


def parse_dockerfile(text: str) -> list[list[Instruction]]:
    """Instructions grouped by stage: comments dropped, backslash continuations joined."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    stages: list[list[Instruction]] = []
    for entry in logical:
        keyword, _, args = entry.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip())
        if instruction.keyword == "FROM":
            stages.append([])
        assert stages, f"{instruction.keyword} before the first FROM"
        stages[-1].append(instruction)
    return stages


def last(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert found, f"no {keyword} in the final stage"
    return found[-1]


STAGES = parse_dockerfile(DOCKERFILE.read_text())
FINAL = STAGES[-1]


def test_multi_stage_on_python_slim() -> None:
    assert len(STAGES) >= 2
    for stage in STAGES:
        image = stage[0].args.split()[0]
        assert image == "python:3.11-slim", image
    build = " ".join(i.args for i in STAGES[0] if i.keyword == "RUN")
    assert re.search(r"pip wheel --no-deps\b.* \.$", build), build


def test_final_stage_installs_the_wheel_with_its_dependencies() -> None:
    runs = [i.args for i in FINAL if i.keyword == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert len(installs) == 1
    assert "from=build" in installs[0] and ".whl" in installs[0]
    assert "--no-deps" not in installs[0]


def test_runs_as_the_non_root_user_the_chart_expects() -> None:
    user = last(FINAL, "USER").args
    assert re.fullmatch(r"\d+(:\d+)?", user), f"USER must be numeric for runAsNonRoot to verify it: {user}"
    uid, _, gid = user.partition(":")
    assert int(uid) != 0 and int(gid or uid) != 0
    assert int(uid) == CHART_VALUES["podSecurityContext"]["runAsUser"] == CHART_VALUES["securityContext"]["runAsUser"]
    assert int(gid or uid) == CHART_VALUES["podSecurityContext"]["runAsGroup"]


def test_entrypoint_cmd_and_workdir() -> None:
    assert last(FINAL, "ENTRYPOINT").json_args() == ["tiered"]
    assert "tiered" in PYPROJECT["project"]["scripts"]
    assert last(FINAL, "CMD").json_args() == ["serve", "-p", "/var/lib/tiered", "-l", ":11011"]
    assert last(FINAL, "WORKDIR").args == "/var/lib/tiered"
    assert last(FINAL, "STOPSIGNAL").args == "SIGTERM"


def test_exposes_the_ports_the_chart_uses() -> None:
    exposed = {int(p.split("/")[0]) for i in FINAL if i.keyword == "EXPOSE" for p in i.args.split()}
    assert exposed == {CHART_VALUES["ports"]["tank"], CHART_VALUES["ports"]["http"]} == {11011, 9102}


def test_healthcheck_uses_the_liveness_endpoint() -> None:
    checks = [i for i in FINAL if i.keyword == "HEALTHCHECK"]
    if checks:
        assert "/healthz" in checks[-1].args and ":9102" in checks[-1].args


def test_no_secret_looking_env_arg_or_label() -> None:
    for stage in STAGES:
        for instruction in stage:
            if instruction.keyword in ("ENV", "ARG", "LABEL"):
                tokens = shlex.split(instruction.args)
                # key=value only: the legacy `ENV key value` form blurs which word is the name.
                assert tokens and (instruction.keyword == "ARG" or all("=" in t for t in tokens)), instruction
                names = [t.partition("=")[0] for t in tokens]
                for name in names:
                    assert not SECRETISH.search(name), f"{instruction.keyword} {name} looks like a secret"
            if instruction.keyword in ("COPY", "ADD"):
                assert not re.search(r"\.env\b|\.pem\b|id_rsa|\.aws|\.pgpass|kubeconfig", instruction.args), instruction


# --- the build context ------------------------------------------------------------------------------------------

def dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore globs: `**` spans directories, `*` and `?` stay within one path element."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def in_build_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """The last rule matching the path or one of its parent directories decides, as in Docker."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for exclude, regex in rules:
        if any(regex.match(c) for c in candidates):
            included = not exclude
    return included


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        rules.append((not negate, dockerignore_regex(pattern)))
    return rules


def test_dockerignore_matcher() -> None:
    rules = [(True, dockerignore_regex("*")), (False, dockerignore_regex("src")),
             (True, dockerignore_regex("**/__pycache__"))]
    assert in_build_context("src/a/b.py", rules)
    assert not in_build_context("src/a/__pycache__/b.pyc", rules)
    assert not in_build_context("docs/x.md", rules)
    assert not in_build_context("srcx", rules)


def test_build_context_holds_the_sources_and_nothing_private() -> None:
    rules = dockerignore_rules()
    copied = {src for i in STAGES[0] if i.keyword == "COPY" for src in i.args.split()[:-1] if not src.startswith("--")}
    # What setuptools needs: pyproject.toml, the readme it names, and every package it finds.
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"]}
    needed |= {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= copied, f"the build stage does not copy {needed - copied}"
    for source in copied:
        assert (REPO_ROOT / source).exists(), source
        assert in_build_context(source, rules), f"{source} is excluded by .dockerignore"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    for path in tracked.stdout.splitlines():
        if path.startswith(("tiered/", "migrations/")):
            assert in_build_context(path, rules), path
    for private in [".git/config", ".venv/bin/python", ".cache/helm/helm", "data/topic/0/1.ilog", ".env",
                    "tests/conftest.py", "helm/tiered/values.yaml", "tiered/__pycache__/config.cpython-311.pyc",
                    "credentials.json", "id_rsa"]:
        assert not in_build_context(private, rules), private

