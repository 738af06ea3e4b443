"""Catalog test fixtures: an open Catalog on each backend. Here `catalog_url` (tests/support/postgres.py) runs on
PgBouncer in transaction mode too, unless TIERED_TEST_CATALOGS says otherwise."""

from __future__ import annotations

import pytest

from tiered.catalog import Catalog

from tests.support.postgres import fresh_catalog_url, test_catalogs


@pytest.fixture(params=test_catalogs("sqlite,postgresql,pgbouncer"))
def catalog_url(request, tmp_path) -> str:
    return fresh_catalog_url(request, request.param, tmp_path)


@pytest.fixture
def cat(catalog_url):
    catalog = Catalog.open(catalog_url)
    yield catalog
    catalog.close()
