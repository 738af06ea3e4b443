"""The broker: opens the registry, serves TANK's protocol, runs the timers, and shuts down gracefully.

Shutdown order (SIGTERM): stop accepting; wake long-poll waiters so they answer now; let in-flight requests finish
(durable produces wait for their block's commit); close the open block and commit it; close connections; close
partition logs. All within `shutdown_timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

from tiered.config import Settings
from tiered.storage.partition_log import AppendResult

from tiered.server.admin import AdminHandler
from tiered.server.connection import IDLE_TIMEOUT_S, Connection, serve
from tiered.server.consume import ConsumeHandler
from tiered.server.fetch import FetchResolver
from tiered.server.metrics import Metrics
from tiered.server.produce import ProduceHandler
from tiered.server.registry import Partition, Registry
from tiered.server.waiters import Waiters

log = logging.getLogger("tiered.server")

RETENTION_INTERVAL_S = 30.0


@dataclass
class Handlers:
    produce: ProduceHandler
    consume: ConsumeHandler
    admin: AdminHandler


class Broker:
    def __init__(self, settings: Settings, *, now_s: Callable[[], float] = time.time, tiering=None):
        self.settings = settings
        self.now_s = now_s
        self.tiering = tiering  # the durable/tiered layer (tiered.tiering.service), None for a local-only broker
        self.registry = Registry(
            settings.data_dir,
            settings.topic_defaults,
            now_s=now_s,
            visible_on_append=(lambda config: config.produce_ack != "durable") if tiering else (lambda config: True),
        )
        self.waiters = Waiters()
        self.metrics = Metrics()
        self.fetch = FetchResolver()
        self.handlers = Handlers(ProduceHandler(self), ConsumeHandler(self), AdminHandler(self))
        self.connections: set[Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.started_at = time.time()
        self.idle_timeout_s = IDLE_TIMEOUT_S
        self.retention_interval_s = RETENTION_INTERVAL_S
        self._timers: list[asyncio.Task] = []
        self.stopping = False
        self.ready = False

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.registry.open_all()
        if self.tiering is not None:
            await self.tiering.start(self)
        host, port = self.settings.listen_endpoint()
        self.server = await serve(self, host, port)
        self._timers.append(asyncio.get_running_loop().create_task(self._retention_timer()))
        self.ready = True
        log.info(
            "serving %d topics, %d partitions on %s",
            len(self.registry.topics),
            self.registry.partition_count(),
            ", ".join(f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in self.server.sockets),
        )

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def stop(self, timeout_s: float | None = None) -> None:
        """Graceful: stop accepting, answer waiters, finish in-flight work, commit the open block, close."""
        if self.stopping:
            return
        self.stopping = True
        self.ready = False
        timeout_s = self.settings.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        if self.server is not None:
            self.server.close()
        for timer in self._timers:
            timer.cancel()
        self.waiters.wake_all("shutdown")
        if self.tiering is not None:
            await self.tiering.flush(deadline)
        pending = [t for c in self.connections for t in c.tasks]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        for conn in list(self.connections):
            await conn.close()
        if self.tiering is not None:
            await self.tiering.stop(deadline)
        self.registry.close()
        log.info("stopped")

    # -- the data path ----------------------------------------------------------------------------------------

    def after_append(self, part: Partition, appended: AppendResult) -> asyncio.Future | None:
        """Called after each local append. Returns the durable-ack future, or None when the append is already final."""
        if self.tiering is not None:
            ack = self.tiering.appended(part, appended)
            if ack is not None:
                return ack
        self.waiters.visible(part.topic, part.partition, appended.first_seq, len(appended.record))
        return None

    def made_visible(self, part: Partition, first_seq: int, size_bytes: int) -> None:
        """Called by the durable layer when a commit makes records of a partition visible."""
        self.waiters.visible(part.topic, part.partition, first_seq, size_bytes)

    async def create_topic(self, name: str, partitions: int, config_text: str) -> None:
        if self.tiering is not None:
            await self.tiering.create_topic(name, partitions, config_text)
        topic = self.registry.create_topic(name, partitions, config_text)
        if self.tiering is not None:
            await self.tiering.topic_opened(topic)

    # -- timers -----------------------------------------------------------------------------------------------

    async def _retention_timer(self) -> None:
        while True:
            await asyncio.sleep(self.retention_interval_s)
            try:
                self.enforce_retention()
            except Exception:
                log.exception("local retention check failed")

    def enforce_retention(self) -> int:
        """TANK checks retention only on roll; we also check on a timer so idle partitions are trimmed too."""
        deleted = 0
        now = self.now_s()
        may_delete = self.registry.may_delete
        for part in self.registry.all_partitions():
            deleted += len(part.log.enforce_retention(now, lambda seg, p=part: may_delete(p, seg)))
        return deleted
