"""Fixtures of the tiering tests: the catalog (SQLite and PostgreSQL, by `catalog_url`) and its async access."""

from __future__ import annotations

import pytest

from tiered.catalog import Catalog
from tiered.tiering.catalog_access import AsyncCatalog


@pytest.fixture
def cat(catalog_url):
    catalog = Catalog.open(catalog_url)
    yield catalog
    catalog.close()


@pytest.fixture
def acat(cat):
    access = AsyncCatalog(cat)
    yield access
    access.shutdown()
