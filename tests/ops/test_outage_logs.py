"""A background pass that fails because the catalog or the store is down logs one line when the outage starts and
one when it ends, not a traceback per pass; the log also names every address the broker listens on."""

from __future__ import annotations

import asyncio
import logging

from tiered.catalog.errors import CatalogUnavailable
from tiered.metrics import TASK_FAILURES, Metrics
from tiered.server.app import App
from tiered.tasks import OUTAGES, Supervisor
from tiered.tiering.objects.store import StoreError

from tests.support.broker import local_settings


async def test_an_outage_is_one_line_each_way(tmp_path, caplog):
    metrics = Metrics()
    supervisor = Supervisor(metrics, outages=(*OUTAGES, StoreError))
    failures = [CatalogUnavailable("connection refused"), CatalogUnavailable("connection refused"),
                StoreError("bucket unreachable"), None, None]
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        failure = failures[calls - 1] if calls <= len(failures) else None
        if failure is not None:
            raise failure

    caplog.set_level(logging.INFO, logger="tiered.tasks")
    supervisor.every("reconciler", 0.0, step)
    for _ in range(1000):
        if calls >= len(failures):
            break
        await asyncio.sleep(0.001)
    await supervisor.stop()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "reconciler" in r.getMessage()]
    assert lines == [("WARNING", "reconciler failed: CatalogUnavailable: connection refused; retrying"),
                     ("INFO", "reconciler works again")]
    assert not any(r.exc_info for r in caplog.records)
    assert metrics.count(TASK_FAILURES) == 3  # every failed pass is counted, only the first is logged


async def test_a_bug_in_a_background_task_is_logged_whole_and_the_task_restarted(caplog):
    metrics = Metrics()
    supervisor = Supervisor(metrics, first_backoff_s=0.001, max_backoff_s=0.2)
    runs = 0

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise KeyError("a bug")
        await asyncio.sleep(3600)

    supervisor.start("segment copier", loop)
    for _ in range(1000):
        if runs >= 2:
            break
        await asyncio.sleep(0.001)
    assert runs == 2
    assert supervisor.problems() == "segment copier: KeyError: 'a bug'"  # what /readyz says until it recovers
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "segment copier" in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info is not None
    for _ in range(1000):  # running cleanly for a while after its restart: healthy again
        if not supervisor.problems():
            break
        await asyncio.sleep(0.001)
    assert supervisor.problems() == ""
    await supervisor.stop()


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
