"""Fixtures of the ops tests: an in-process durable broker with its HTTP endpoint on 127.0.0.1, on moto's S3 (through
the fault proxy) and a SQLite catalog."""

from __future__ import annotations

import pytest

from tiered.server.app import App, tiering_service

from tests.support.broker import local_settings


@pytest.fixture
async def ops_broker(tmp_path, s3_endpoint, s3_bucket, monkeypatch):
    """`await ops_broker(**settings)` starts an App with `-P 127.0.0.1:0`; `app.http.port` is its HTTP port.
    Every app started is stopped after the test."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    apps: list[App] = []

    async def make(**overrides) -> App:
        values = {"catalog_url": f"sqlite:///{tmp_path}/catalog.db", "store_url": f"s3://{s3_bucket}/tiered",
                  "s3_path_style": True, "shutdown_timeout_s": 5.0, "http_listen": "127.0.0.1:0",
                  "block_max_age_ms": 50, **overrides}
        settings = local_settings(tmp_path / "data", **values)
        app = App(settings, tier=tiering_service(ack_timeout_s=10.0))
        await app.start()
        apps.append(app)
        return app

    make.data_dir = tmp_path / "data"
    make.bucket = s3_bucket
    make.catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    yield make
    for app in apps:
        await app.stop()
