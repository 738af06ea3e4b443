"""A background pass that fails because the catalog or the store is down logs one line when the outage starts and
one when it ends, not a traceback per pass; the log also names every address the broker listens on."""

from __future__ import annotations

import asyncio
import logging

from tiered.catalog.errors import CatalogUnavailable
from tiered.server.app import App
from tiered.tiering.service import TieringService
from tiered.tiering.store import StoreError

from tests.support.broker import local_settings


async def test_an_outage_is_one_line_each_way(tmp_path, caplog):
    service = TieringService(local_settings(tmp_path))
    failures = [CatalogUnavailable("connection refused"), CatalogUnavailable("connection refused"),
                StoreError("bucket unreachable"), None, None]
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        failure = failures[calls - 1] if calls <= len(failures) else None
        if failure is not None:
            raise failure

    caplog.set_level(logging.INFO, logger="tiered.tiering")
    task = asyncio.ensure_future(service._every(0.0, "reconciler", step))
    for _ in range(1000):
        if calls >= len(failures):
            break
        await asyncio.sleep(0.001)
    task.cancel()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "reconciler" in r.getMessage()]
    assert lines == [("WARNING", "reconciler failed: connection refused; retrying every 0 s"),
                     ("INFO", "reconciler works again")]
    assert not any(r.exc_info for r in caplog.records)


async def test_the_log_names_the_http_address_and_an_empty_catalogs_migration(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    app = App(local_settings(tmp_path / "data", http_listen="127.0.0.1:0"))
    await app.start()
    try:
        port = app.http.port
    finally:
        await app.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert f"HTTP endpoint (/metrics, /healthz, /readyz, /v1/tier) on 127.0.0.1:{port}" in messages
    assert any(m.startswith("catalog migrated from empty to ") for m in messages)
    assert not any("from None" in m for m in messages)
