"""Fixtures for the durability tests: in-process brokers on moto's S3 (through the fault proxy) and a catalog, each
on a data directory of the test's choosing, and the catalog's consistency check after every step."""

from __future__ import annotations

import pytest

from tiered.catalog import Catalog
from tiered.catalog.check import check_catalog
from tiered.server.app import App, tiering_service

from tests.support.broker import local_settings

SMALL_SEGMENTS = {"log.segment.bytes": "4k", "log.index.interval.bytes": "256", "retention.segments.count": "2"}


@pytest.fixture
async def brokers(tmp_path, s3_endpoint, s3_bucket, monkeypatch, request):
    """`await brokers.start(disk, catalog_url, **settings)`: an App serving from `tmp_path / disk`, broker id 0 unless
    given; `brokers.check(catalog_url)` asserts the catalog's consistency check passes."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    started: list[App] = []

    class Brokers:
        root = tmp_path
        bucket = s3_bucket

        async def start(self, disk: str, catalog_url: str, **overrides) -> App:
            if "block_max_age_ms" not in overrides:  # blocks close at 50 ms, and a lone durable produce is acked
                # after a 5 ms linger (the latency-first policy): the sequential produces of these tests wait less
                overrides.update(block_max_age_ms=50, block_linger_ms=5, block_max_puts_per_s=1000.0)
            overrides.setdefault("shutdown_timeout_s", 3.0)
            settings = local_settings(tmp_path / disk, catalog_url=catalog_url, store_url=f"s3://{s3_bucket}/t",
                                      s3_path_style=True, **overrides)
            app = App(settings, tier=tiering_service())
            await app.start()
            started.append(app)
            return app

        def check(self, catalog_url: str, topic: str | None = None) -> None:
            with Catalog.open(catalog_url) as cat:
                report = check_catalog(cat, topic)
            assert report.ok, report.problems

    yield Brokers()
    for app in started:
        await app.stop()
