"""The whole broker process, assembled once: the registry and waiters, the tier below the local disk and the sink it
reports to, the TANK listener and the HTTP endpoint, started and stopped in order. `tiered serve` runs one App;
tests start one in-process.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from tiered.clock import SYSTEM_CLOCK, Clock
from tiered.config import Settings
from tiered.metrics import Metrics
from tiered.server.broker import Broker
from tiered.server.http import HttpEndpoint
from tiered.server.registry import Registry
from tiered.server.tier_events import TierEvents
from tiered.server.waiters import Waiters
from tiered.storage.local_state import LocalState
from tiered.tier_interface import LocalOnly, Tier, TierSink

log = logging.getLogger("tiered.server")

# Builds the tier from what it reports to: (settings, sink, metrics, disk_id, clock) -> Tier. The clock is the App's:
# time enters the process in one place and the tier runs on it.
TierFactory = Callable[[Settings, TierSink, Metrics, str, Clock], Tier]


def tiering_service(**options) -> TierFactory:
    """The catalog-and-bucket tier (tiered.tiering.service.TieringService), with `options` for its constructor."""

    def make(settings: Settings, sink: TierSink, metrics: Metrics, disk_id: str, clock: Clock) -> Tier:
        from tiered.tiering.service import TieringService

        return TieringService(settings, sink, metrics, disk_id=disk_id, clock=clock, **options)

    return make


class App:
    def __init__(self, settings: Settings, *, tier: TierFactory | None = None, local_only: bool = False,
                 clock: Clock = SYSTEM_CLOCK, now_s: Callable[[], float] = time.time):
        """`tier` defaults to the catalog and object store the settings name; `local_only` runs a plain TANK
        broker with neither (tests of the TANK behaviour alone)."""
        self.settings = settings
        self.metrics = Metrics()
        self.waiters = Waiters()
        make_tier = None if local_only else (tier or tiering_service())
        local_state = LocalState(settings.state_dir) if make_tier is not None else None
        self.registry = Registry(settings.data_dir, settings.topic_defaults, now_s=now_s)
        events = TierEvents(self.registry, self.waiters)
        self.tier: Tier = make_tier(settings, events, self.metrics, local_state.disk_id, clock) if make_tier else LocalOnly()
        self.broker = Broker(settings, self.registry, self.waiters, self.metrics, self.tier, local_state=local_state,
                             clock=clock, now_s=now_s)
        events.bind(self.broker)
        routes = {"/v1/tier": self.tier_status, "/v1/compaction": self.broker.compactor.view}
        self.http = HttpEndpoint(self.metrics.render, self.broker.check_ready, lambda: not self.broker.stopping,
                                 routes, {"/v1/compact": self.compact})

    def tier_status(self) -> list[dict]:
        """Per partition: what the local disk holds, what the bucket holds, and what is still on its way there."""
        out = []
        for part in self.registry.all_partitions():
            plog = part.log
            bounds = part.bounds()
            out.append({
                "topic": part.topic,
                "partition": part.partition,
                "local_first": plog.first_available,
                "local_last": plog.last_assigned,
                "local_bytes": plog.stats().bytes,
                "remote_first": part.catalog_first,
                "hwmark": bounds.hwmark,
                "role": part.role.value,
                "leader": part.leader.endpoint if part.leader is not None else "",
                **self.tier.partition_status(part.tp),
                "compaction": compaction.view() if (compaction := self.broker.compactor.status(part)) else None,
            })  # fmt: skip
        return out

    def compact(self, query: dict[str, str]) -> tuple[int, object]:
        """`POST /v1/compact?topic=NAME[&partition=N]`: a compaction asked for by hand (tiered topic compact)."""
        raw = query.get("partition")
        if raw is not None and not raw.isdigit():
            return 400, {"error": f"bad partition {raw!r}: want a number"}
        try:
            return 202, self.broker.compactor.ask(query.get("topic", ""), [int(raw)] if raw is not None else None)
        except KeyError as exc:
            return 404, {"error": exc.args[0]}
        except ValueError as exc:
            return 409, {"error": str(exc)}

    async def start(self) -> None:
        # Health first: /healthz answers (and /readyz says "not ready") while local recovery runs.
        endpoint = self.settings.http_endpoint()
        if endpoint is not None:
            await self.http.start(*endpoint)
            self.broker.http_port = self.http.port
            log.info("HTTP endpoint (/metrics, /healthz, /readyz, /v1/tier) on %s:%d", endpoint[0], self.http.port)
        await self.broker.start()

    async def stop(self) -> None:
        await self.broker.stop()
        await self.http.stop()
