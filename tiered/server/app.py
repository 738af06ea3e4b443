"""The whole broker process: the TANK listener, the HTTP endpoint, and the tiered storage layer, started and stopped
in order. `tiered serve` runs one App; tests start one in-process."""

from __future__ import annotations

import logging

from tiered.config import Settings
from tiered.server.broker import Broker
from tiered.server.http import HttpEndpoint

log = logging.getLogger("tiered.server")


class App:
    def __init__(self, settings: Settings, *, tiering=None, local_only: bool = False, now_s=None):
        """`tiering` defaults to the catalog and object store the settings name; `local_only` runs a plain TANK
        broker with neither (tests of the TANK behaviour alone)."""
        self.settings = settings
        if tiering is None and not local_only:
            from tiered.tiering.service import TieringService

            tiering = TieringService(settings)
        kwargs = {"now_s": now_s} if now_s is not None else {}
        self.broker = Broker(settings, tiering=tiering, **kwargs)
        routes = {"/v1/tier": tiering.tier_status} if tiering is not None else {}
        self.http = HttpEndpoint(self.broker.metrics.render, self.ready, lambda: not self.broker.stopping, routes)

    async def ready(self) -> tuple[bool, str]:
        if not self.broker.ready:
            return False, "the broker is not serving"
        if self.broker.tiering is not None:
            return await self.broker.tiering.check_ready()
        return True, ""

    async def start(self) -> None:
        # Health first: /healthz answers (and /readyz says "not ready") while local recovery runs.
        endpoint = self.settings.http_endpoint()
        if endpoint is not None:
            await self.http.start(*endpoint)
            log.info("HTTP endpoint (/metrics, /healthz, /readyz, /v1/tier) on %s:%d", endpoint[0], self.http.port)
        await self.broker.start()

    async def stop(self) -> None:
        await self.broker.stop()
        await self.http.stop()
