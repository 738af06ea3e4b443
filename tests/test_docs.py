"""The documents stay true to the repository: docs/protocol.md and docs/architecture.md are what the code cites.

- nothing points outside the repository (a clone has no sibling directories);
- every protocol section the code, tests, benchmarks and documents cite exists in docs/protocol.md. In this
  repository a section sign always means a section of docs/protocol.md, spelled `docs/protocol.md §N` or, before
  the references are renamed, with the old file name; bare references in the protocol tests mean the same;
- every design section cited (`docs/architecture.md "Name"` or `... data path step N`) exists in docs/architecture.md;
- every hex example the protocol example tests check is written in docs/protocol.md;
- every relative link in README.md and docs/*.md, and every code path and test the two design documents name, exists.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs"
PROTOCOL = DOCS / "protocol.md"
ARCHITECTURE = DOCS / "architecture.md"
CITING_DIRS = ("tiered", "tests", "bench")
# Not part of the repository: version control, the virtual environment, and what .gitignore keeps out.
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist", "data", ".cache"}
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".json", ".tpl", ".sh", ""}

SECTION_REF = re.compile(r"§(\d+(?:\.\d+)?)(?:\s*-\s*§(\d+(?:\.\d+)?))?(?:\s+\"([^\"]+)\")?")
DESIGN_REF = re.compile(r"(?:DESIGN\.md|docs/architecture\.md)(?P<rest>[^)\n]*(?:\n[^)\n]*)?)")
STEPS = re.compile(r"^[,;]?\s*(?:data\s+path\s+)?steps?\s+(\d+)(?:\s*(?:-|and)\s*(\d+))?")
QUOTED = re.compile(r"^[,;]?\s*\"([^\"]+)\"")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.py)(?:::(\w+))?")
TIERED_PACKAGES = {p.name for p in (REPO_ROOT / "tiered").iterdir() if p.is_dir()}


def repository_files():
    for directory, dirs, files in os.walk(REPO_ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in files:
            yield Path(directory, name)


def citing_files():
    this_file = Path(__file__).resolve()
    for top in CITING_DIRS:
        yield from sorted(p for p in (REPO_ROOT / top).rglob("*.py") if p.resolve() != this_file)
    yield REPO_ROOT / "README.md"
    yield from sorted(DOCS.glob("*.md"))


def headings(path: Path) -> list[tuple[int, str, int]]:
    """(level, title, line number) of every markdown heading outside code blocks."""
    found = []
    fenced = False
    for number, line in enumerate(path.read_text().splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#+) (.+)", line)):
            found.append((len(m[1]), m[2].strip(), number))
    return found


def protocol_sections() -> dict[str, str]:
    """Section number ("3", "3.4") -> the text of that section, from its heading to the next one of any level."""
    lines = PROTOCOL.read_text().splitlines()
    marks = headings(PROTOCOL)
    sections = {}
    for i, (_, title, start) in enumerate(marks):
        end = marks[i + 1][2] if i + 1 < len(marks) else len(lines)
        if m := re.match(r"(\d+(?:\.\d+)?)\.?\s", title):
            sections[m[1]] = "\n".join(lines[start:end])
    return sections


def section_exists(number: str, sections: dict[str, str]) -> bool:
    """A heading, or item M of the numbered list of section N (`§16.8`)."""
    if number in sections:
        return True
    major, _, item = number.partition(".")
    return bool(item) and re.search(rf"(?m)^{item}\. ", sections.get(major, "")) is not None


def cited_sections(text: str):
    """(section, quoted label or None) for every section reference; a range §a.b-§a.d yields every section in it."""
    for m in SECTION_REF.finditer(text):
        first, last, label = m.groups()
        yield first, label
        if last is None:
            continue
        yield last, None
        (a_major, _, a_minor), (b_major, _, b_minor) = first.partition("."), last.partition(".")
        if a_major == b_major and a_minor and b_minor:
            for minor in range(int(a_minor) + 1, int(b_minor)):
                yield f"{a_major}.{minor}", None


def test_nothing_points_outside_the_repository():
    needle = b".." + b"/shared"
    offenders = [str(p.relative_to(REPO_ROOT)) for p in repository_files() if needle in p.read_bytes()]
    assert not offenders, f"these files point at a directory a clone does not have: {offenders}"


def test_every_cited_protocol_section_exists():
    sections = protocol_sections()
    assert {"0", "3.1", "3.12", "4.3", "15", "16"} <= set(sections)
    cited = 0
    missing = []
    for path in citing_files():
        for number, label in cited_sections(path.read_text()):
            cited += 1
            where = f"{path.relative_to(REPO_ROOT)}: §{number}"
            if not section_exists(number, sections):
                missing.append(where)
            elif label and label not in sections.get(number, ""):
                missing.append(f'{where} "{label}" (no such words in that section)')
    assert cited > 50
    assert not missing, f"sections cited but not in docs/protocol.md: {missing}"


def test_every_cited_design_section_exists():
    marks = headings(ARCHITECTURE)
    titles = {title for _, title, _ in marks}
    steps = {int(m[1]) for _, title, _ in marks if (m := re.match(r"(\d+)\. ", title))}
    assert steps == set(range(1, 10)), "the data path keeps its nine numbered steps"
    cited = 0
    problems = []
    for path in citing_files():
        for m in DESIGN_REF.finditer(path.read_text()):
            rest = " ".join(m["rest"].split())
            where = f"{path.relative_to(REPO_ROOT)}: {m[0].split()[0]}{rest[:40]}"
            if s := STEPS.match(rest):
                wanted = range(int(s[1]), int(s[2] or s[1]) + 1) if "-" in s[0] else {int(s[1]), int(s[2] or s[1])}
                problems += [f"{where} (no step {n})" for n in wanted if n not in steps]
            elif q := QUOTED.match(rest):
                if q[1] not in titles:
                    problems.append(f'{where} (no heading "{q[1]}")')
            elif path.parent != DOCS and path.name != "README.md":
                problems.append(f"{where} (name a heading in quotes, or a data path step)")
            cited += 1
    assert cited > 10
    assert not problems, f"design references that docs/architecture.md cannot answer: {problems}"


def checked_examples() -> list[str]:
    """The constant hex strings the protocol example tests pass to h(), whitespace normalised."""
    found = []
    for path in sorted((REPO_ROOT / "tests" / "protocol").glob("test_examples*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "h"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.append(" ".join(node.args[0].value.split()))
    return found


def test_every_checked_hex_example_is_in_the_protocol_document():
    examples = checked_examples()
    assert len(set(examples)) > 40
    document = " ".join(PROTOCOL.read_text().split())
    missing = sorted({e for e in examples if e not in document})
    assert not missing, f"examples the tests check but docs/protocol.md does not show: {missing}"


@pytest.mark.parametrize("path", [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_point_at_existing_files(path):
    targets = [t for t in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:|#", t)]
    broken = [t for t in targets if not (path.parent / t.split("#", 1)[0]).exists()]
    assert not broken, f"{path.name}: links to missing files: {broken}"


def test_the_readme_links_every_document():
    linked = set(LINK.findall((REPO_ROOT / "README.md").read_text()))
    assert {f"docs/{p.name}" for p in DOCS.glob("*.md")} <= linked


@pytest.mark.parametrize("path", [PROTOCOL, ARCHITECTURE], ids=lambda p: p.name)
def test_code_paths_and_tests_named_by_the_documents_exist(path):
    named = CODE_PATH.findall(path.read_text())
    assert len(named) > 20
    problems = []
    for relative, test_name in named:
        first = relative.split("/", 1)[0]
        target = REPO_ROOT / "tiered" / relative if first in TIERED_PACKAGES else REPO_ROOT / relative
        if not target.is_file():
            problems.append(relative)
        elif test_name and not re.search(rf"(?m)^(?:async )?def {test_name}\(", target.read_text()):
            problems.append(f"{relative}::{test_name}")
    assert not problems, f"{path.name} names what does not exist: {problems}"


def test_no_file_keeps_a_merge_conflict():
    """A merge resolved in a hurry can commit its markers; in a docstring they even import cleanly."""
    marker = re.compile(r"^(<{7}|>{7}) ", re.M)
    skip = {".git", ".venv", "node_modules", ".pytest_cache", ".mypy_cache", "__pycache__"}
    found = []
    for folder, dirs, files in os.walk(REPO_ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".mypy_cache")]
        for name in files:
            if name.endswith((".py", ".md", ".toml", ".yaml", ".yml", ".c", ".h", ".txt", ".tpl", ".cfg")):
                path = Path(folder, name)
                if marker.search(path.read_text(errors="replace")):
                    found.append(str(path.relative_to(REPO_ROOT)))
    assert not found, found
