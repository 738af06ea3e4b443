"""The catalog's change notices (tiered.catalog.changes sends them, tiered.tiering.cluster.notices receives them) and
how often an idle coordinator looks: while notices come, a change is seen when its transaction commits, not at a
tick, and without one an idle broker looks only every IDLE_TICK_S or just after a live member's lease expires; while
none come (SQLite, a pooler, a listener down) it looks every TICK_S as before. On a manual clock: a look that comes
without the clock moving was brought by a notice."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy.engine import make_url

from tiered.cancellation import cancel_until_done
from tiered.catalog import Catalog
from tiered.catalog.cluster import leave, look, register
from tiered.catalog.errors import CatalogUnavailable
from tiered.catalog.topics import create_topic
from tiered.metrics import Metrics
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.cluster.coordinator import IDLE_TICK_S, TICK_S, Coordinator, Endpoints
from tiered.tiering.cluster.notices import ListenPlan, Notices, listen_plan
from tests.support.clock import ManualClock
from tests.support.ports import free_port
from tests.tiering.test_coordinator import LEASE_MS, ME, OTHER, Leadership, Sink, _until


async def coordinator_of(cat: Catalog) -> tuple[Coordinator, AsyncCatalog]:
    access = AsyncCatalog(cat)
    coordinator = Coordinator(access, Sink(), Leadership(cat), broker_id=ME, lease_ms=LEASE_MS, metrics=Metrics(),
                              clock=ManualClock())
    await coordinator.join(Endpoints("127.0.0.1:11011", ""))
    return coordinator, access


async def stop(*tasks: asyncio.Task) -> None:
    """Cancels the tasks until they end, as the supervisor does (a single cancel can be lost to Python 3.11's
    asyncio.wait_for when a catalog call completes as it is cancelled: the tick loop then waited on the manual clock
    forever), and collects their outcomes."""
    await cancel_until_done(list(tasks))
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_notice_brings_the_idle_look_at_once_and_without_one_it_comes_at_the_idle_tick(pg_url):
    cat = Catalog.open(pg_url)
    coordinator, access = await coordinator_of(cat)
    notices = asyncio.create_task(Notices(cat.engine.url, coordinator.noticed, coordinator.listening).run())
    loop = None
    try:
        await _until(lambda: coordinator._told)
        loop = asyncio.create_task(coordinator.tick_loop())
        await _until(lambda: coordinator.clock.sleeping > 0)  # looked once, waiting for a notice or the idle tick
        create_topic(cat, "t", 2, leaders={0: ME, 1: ME})  # by another broker, say: a version taken, a notice sent
        await _until(lambda: sorted(coordinator.leadership.leading()) == [("t", 0), ("t", 1)])  # the clock never moved
        # Without a notice, the next look is the idle tick's: IDLE_TICK_S, not TICK_S.
        await _until(lambda: coordinator.clock.sleeping > 0 and not coordinator._wake.is_set())
        for _ in range(3):  # the looks after its own claims (each its own notice, and FOLLOW_S/LED_S) settle
            coordinator.clock.advance(TICK_S)
            await _until(lambda: coordinator.clock.sleeping > 0)
        before = cat.statements
        coordinator.clock.advance(TICK_S)
        await coordinator.clock.settle()
        assert cat.statements == before  # no look at TICK_S
        coordinator.clock.advance(IDLE_TICK_S)
        await _until(lambda: cat.statements > before)  # one at the idle tick
    finally:
        await stop(*(t for t in (loop, notices) if t is not None))
        access.close()
    assert not coordinator._told  # a listener that stops says so: the coordinator looks every TICK_S again


async def test_without_notices_an_idle_broker_looks_every_tick(cat):
    coordinator, access = await coordinator_of(cat)
    loop = asyncio.create_task(coordinator.tick_loop())
    try:
        await _until(lambda: coordinator.clock.sleeping > 0)
        create_topic(cat, "t", 1, leaders={0: ME})
        coordinator.clock.advance(TICK_S)
        await _until(lambda: ("t", 0) in coordinator.leadership.leading())
    finally:
        await stop(loop)
        access.shutdown()  # the fixture closes the catalog


def test_a_look_says_when_each_other_live_lease_expires_by_the_catalogs_clock(pg_url):
    with Catalog.open(pg_url) as cat:
        register(cat, ME, "me", "127.0.0.1:11011", "", LEASE_MS)
        register(cat, OTHER, "other", "127.0.0.2:11011", "", LEASE_MS)
        [expiry] = look(cat).expiries(ME)  # its own lease is not among them
        assert LEASE_MS / 1000 - 5 < expiry <= LEASE_MS / 1000
        leave(cat, OTHER, "other")
        assert look(cat).expiries(ME) == []  # gone: no lease of a live member left to wait for


def test_a_look_carries_the_catalogs_clock(cat):
    register(cat, ME, "me", "127.0.0.1:11011", "", LEASE_MS)
    seen = look(cat)
    assert seen.expiries(ME) == []
    assert timedelta(0) < seen.members[0].lease_expires_at - seen.now <= timedelta(milliseconds=LEASE_MS)


async def test_a_listener_that_cannot_connect_fails_with_one_line_and_says_it_does_not_listen():
    states = []
    url = make_url(f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none")
    with pytest.raises(CatalogUnavailable, match="change notices: cannot connect"):
        await Notices(url, lambda: None, states.append).run()
    assert states == []  # never listened: the coordinator was never told it does


async def test_a_listener_whose_connection_is_cut_fails_with_one_line_and_says_it_stopped_listening(pg_url):
    states: list[bool] = []
    noticed: list[None] = []
    with Catalog.open(pg_url) as cat:
        task = asyncio.create_task(Notices(cat.engine.url, lambda: noticed.append(None), states.append).run())
        try:
            await _until(lambda: states == [True])
            create_topic(cat, "t", 1)  # a version taken: a notice
            await _until(lambda: len(noticed) >= 2)  # the one at start, and this one
            with cat.write() as conn:
                conn.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                     "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()")
            await _until(task.done)
            with pytest.raises(CatalogUnavailable, match="change notices: the connection failed"):
                await task
        finally:
            await stop(task)
    assert states == [True, False]


CATALOG = make_url("postgresql+psycopg://tiered@pgbouncer:6432/catalog")  # as Catalog holds it: `pooled` dropped
DIRECT = "postgresql+psycopg://tiered@postgres:5432/catalog"


@pytest.mark.parametrize("backend, pooled, notices_url, url, note", [
    ("postgresql", False, "", CATALOG, None),  # a direct catalog URL: the listener uses it
    ("postgresql", False, DIRECT, make_url(DIRECT), None),  # the setting wins even so
    ("postgresql", True, DIRECT, make_url(DIRECT), None),  # behind a pooler: the direct URL
    ("postgresql", True, "postgresql://tiered@postgres/catalog?pooled=false", make_url(
        "postgresql+psycopg://tiered@postgres/catalog"), None),  # read as the catalog's URLs are
    ("postgresql", True, "", None, "no change notices"),  # behind a pooler without it: looks every TICK_S, said once
    ("sqlite", False, "", None, None),  # one broker: nothing to listen to
    ("sqlite", False, DIRECT, None, "catalog_notices_url is not used"),
])
def test_where_the_listener_connects(backend, pooled, notices_url, url, note):
    plan = listen_plan(backend, CATALOG, pooled, notices_url)
    assert plan.url == url
    assert (plan.note is None) if note is None else (plan.note is not None and plan.note.startswith(note))
    if note == "no change notices":
        assert f"every {TICK_S:g} s" in plan.note and "catalog_notices_url" in plan.note


async def test_behind_pgbouncer_a_claim_through_the_pooler_wakes_the_look_through_the_direct_url(pgbouncer_url,
                                                                                                 pg_url):
    """The coordinator's catalog goes through PgBouncer in transaction mode; its listener, given the direct URL,
    hears a creation committed through the pooler (as another broker's would be), and the look comes at once: the
    manual clock never moves."""
    cat = Catalog.open(pgbouncer_url)
    assert cat.pooled
    coordinator, access = await coordinator_of(cat)
    plan = listen_plan(cat.backend, cat.engine.url, cat.pooled, pg_url)
    assert plan == ListenPlan(make_url(pg_url))
    notices = asyncio.create_task(Notices(plan.url, coordinator.noticed, coordinator.listening).run())
    loop = None
    try:
        await _until(lambda: coordinator._told)
        loop = asyncio.create_task(coordinator.tick_loop())
        await _until(lambda: coordinator.clock.sleeping > 0)  # looked once, waiting for a notice or the idle tick
        with Catalog.open(pgbouncer_url) as other:  # another broker's catalog, through the pooler too
            create_topic(other, "t", 2, leaders={0: ME, 1: ME})
        await _until(lambda: sorted(coordinator.leadership.leading()) == [("t", 0), ("t", 1)])
    finally:
        await stop(*(t for t in (loop, notices) if t is not None))
        access.close()
