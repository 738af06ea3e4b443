"""The catalog's change notices, received (PostgreSQL LISTEN; the sending side is tiered.catalog.changes).

A broker that receives them looks at the catalog as soon as a claim, a handover's assignment or a creation commits,
and otherwise only every `IDLE_TICK_S` (tiered.tiering.cluster.coordinator): what an idle cluster costs then follows
what changed. A notice carries nothing but "look": what changed is read from the change versions as before, so a
notice lost while the listener reconnects, or never sent, delays a look by at most an idle tick and loses nothing.

One connection per broker, outside the catalog's pool (a pooled connection is handed back after each transaction
and would stop listening), on the event loop (psycopg's asyncio connection to connect, then a reader on its socket: no thread, and nothing runs
while no notice comes). Its loop runs under the
tier's supervisor: a lost connection is one line, retried with the supervisor's backoff, and while it is down the
coordinator looks every `TICK_S` as if nobody told it anything. Behind a transaction-mode pooler (PgBouncer) LISTEN
does not work: the listener then connects to `catalog_notices_url` (a direct URL to the same PostgreSQL) when one is
set, and otherwise there is none, the coordinator looks every `TICK_S` and the broker says so once at start
(`listen_plan`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

import psycopg
from sqlalchemy.engine import URL

from tiered.cancellation import within
from tiered.catalog.changes import NOTICE_CHANNEL
from tiered.catalog.engine import normalize_url, split_pooled
from tiered.catalog.errors import CatalogUnavailable
from tiered.tiering.cluster.coordinator import TICK_S

log = logging.getLogger("tiered.cluster")

CONNECT_S = 10.0  # the deadline of the connection and of LISTEN
# TCP keepalives: a connection the network dropped silently is found within about 10 + 3 x 5 s, and made again.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def conninfo(url: URL) -> str:
    """The libpq connection string of the catalog's URL (its SQLAlchemy driver name dropped)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass(frozen=True)
class ListenPlan:
    """Where a broker listens for change notices (None: nowhere), and what it says about it once at start."""

    url: URL | None
    note: str | None = None


def listen_plan(backend: str, catalog_url: URL, pooled: bool, notices_url: str) -> ListenPlan:
    """Where the listener connects, from the catalog's backend and URL (without its `pooled` parameter), whether a
    transaction-mode pooler is in between, and the `catalog_notices_url` setting (empty: unset)."""
    if backend != "postgresql":
        return ListenPlan(None, "catalog_notices_url is not used: a SQLite catalog sends no change notices"
                          if notices_url else None)
    if notices_url:
        return ListenPlan(split_pooled(normalize_url(notices_url))[0])
    if pooled:
        return ListenPlan(None, f"no change notices: the catalog is reached through a transaction-mode pooler, where "
                                f"LISTEN does not work, so this broker looks at the catalog every {TICK_S:g} s; set "
                                f"catalog_notices_url (--catalog-notices-url, TIERED_CATALOG_NOTICES_URL) to a direct "
                                f"URL to the same PostgreSQL to receive them")
    return ListenPlan(catalog_url)


class Notices:
    """Calls `noticed()` for every notice, and `listening(bool)` when it starts and stops receiving them."""

    def __init__(self, url: URL, noticed: Callable[[], None], listening: Callable[[bool], None]):
        self.url = url
        self.noticed = noticed
        self.listening = listening

    async def run(self) -> None:
        """Listens until cancelled; raises CatalogUnavailable when the connection fails (the supervisor restarts
        it)."""
        try:
            conn = await within(
                psycopg.AsyncConnection.connect(conninfo(self.url), autocommit=True, connect_timeout=int(CONNECT_S),
                                                **KEEPALIVES), CONNECT_S)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise CatalogUnavailable(f"change notices: cannot connect: {exc}") from None
        try:
            async with conn:
                await within(conn.execute(f"LISTEN {NOTICE_CHANNEL}"), CONNECT_S)
                await self._receive(conn)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise CatalogUnavailable(f"change notices: the connection failed: {exc}") from None
        finally:
            self.listening(False)

    async def _receive(self, conn: psycopg.AsyncConnection) -> None:
        """Reads the notices as the socket brings them, with a reader on the event loop: nothing runs while none
        come (psycopg's own `notifies()` wakes every 0.1 s to look, ten times a second on an idle broker). Returns
        never; raises when the connection fails or ends."""
        loop = asyncio.get_running_loop()
        failed: asyncio.Future[None] = loop.create_future()
        pgconn = conn.pgconn

        def readable() -> None:
            try:
                pgconn.consume_input()  # raises on a closed or failed connection
                while pgconn.notifies() is not None:
                    self.noticed()
            except psycopg.Error as exc:
                if not failed.done():
                    failed.set_exception(exc)

        fd = pgconn.socket
        loop.add_reader(fd, readable)
        try:
            self.listening(True)
            log.info("listening for the catalog's change notices")
            self.noticed()  # what changed while nobody listened is looked at now
            await failed
        finally:
            loop.remove_reader(fd)
