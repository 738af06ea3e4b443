"""Catalog test fixtures: an open Catalog on each backend (`catalog_url` is in tests/support/postgres.py)."""

from __future__ import annotations

import pytest

from tiered.catalog import Catalog


@pytest.fixture
def cat(catalog_url):
    catalog = Catalog.open(catalog_url)
    yield catalog
    catalog.close()
