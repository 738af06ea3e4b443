"""`tiered db upgrade` / `tiered db current`: the handlers, driven through their own argparse registration."""

from __future__ import annotations

from pathlib import Path

import argparse

import pytest

from tiered.catalog.migrate import current, head
from tiered.cli import db


def run(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="tiered")
    db.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["db", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path):
    if request.param == "postgresql":
        return request.getfixturevalue("pg_empty_url")
    return f"sqlite:///{tmp_path / 'catalog.db'}"


def test_upgrade_then_current(capsys, empty_url):
    code, out, err = run(capsys, "current", "--catalog", empty_url)
    if empty_url.startswith("sqlite"):  # a file that is not there: said so, and not created
        assert code == 1 and "no catalog at " in err and "nothing was created" in err
        assert not Path(empty_url.removeprefix("sqlite:///")).exists()
    else:
        assert code == 1 and f"is empty (no revision), not at head {head()}" in out
    code, out, _ = run(capsys, "upgrade", "--catalog", empty_url)
    assert (code, out) == (0, f"catalog {empty_url} upgraded from empty to revision {head()} (head)")
    assert current(empty_url) == head()
    code, out, _ = run(capsys, "upgrade", "--catalog", empty_url)
    assert (code, out) == (0, f"catalog {empty_url} is already at revision {head()} (head)")
    code, out, _ = run(capsys, "current", "--catalog", empty_url)
    assert (code, out) == (0, f"catalog {empty_url} is at revision {head()} (head)")


def test_default_catalog_comes_from_the_settings(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("TIERED_CATALOG_URL", raising=False)
    monkeypatch.delenv("TIERED_CONFIG", raising=False)
    code, out, _ = run(capsys, "upgrade", "-p", str(tmp_path / "data"))
    expected = tmp_path / "data" / ".tiered" / "catalog.db"
    assert code == 0 and str(expected) in out
    assert current(f"sqlite:///{expected}") == head()
    monkeypatch.setenv("TIERED_CATALOG_URL", f"sqlite:///{tmp_path / 'env.db'}")
    code, out, _ = run(capsys, "upgrade")
    assert code == 0 and "env.db" in out


def test_unreachable_catalog_is_one_line_with_the_password_masked(capsys, pg_cluster):
    url = f"postgresql://tiered:s3cret@127.0.0.1:{pg_cluster.port}/no_such_db"
    for command in ("upgrade", "current"):
        code, out, err = run(capsys, command, "--catalog", url)
        assert code == 1 and out == ""
        assert err.startswith(f"tiered db {command}: postgresql://tiered:***@127.0.0.1:")
        assert "no_such_db" in err and "s3cret" not in err


def test_unsupported_url(capsys):
    code, _, err = run(capsys, "upgrade", "--catalog", "mysql://root@localhost/x")
    assert code == 1 and "unsupported catalog URL" in err
