"""The broker: opens the registry, reconciles it with the tier below, serves TANK's protocol, runs the timers, and
shuts down gracefully.

Start-up order: recover the local logs; bind the listener (its address is what the broker advertises); start the
tier; create locally the topics the catalog has and the disk lacks; join the service: the tier claims the partitions
this broker should lead and hands over their plans (tiered.tiering.cluster.startup), carried out here (truncate, continue
from the catalog's high-water mark, remember the epoch) before the tier uploads what a plan keeps; the other
partitions are followed. Only then accept connections.

Shutdown order (SIGTERM): hand every partition led here to another live broker (produces to them are answered "no
leader" meanwhile, then redirected; the open block is committed first); stop accepting; wake long-poll waiters so
they answer now; let in-flight requests finish (durable produces wait for their block's commit); commit what is
left; close connections; close partition logs. All within `shutdown_timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from tiered.acl import RELOAD_INTERVAL_S as ACL_RELOAD_INTERVAL_S
from tiered.clock import SYSTEM_CLOCK, Clock
from tiered.tls import RELOAD_INTERVAL_S, CertReloader
from tiered.config import Settings
from tiered import metrics as m
from tiered.heap import Heap
from tiered.metrics import Metrics
from tiered.server.access import Access
from tiered.server.admin import AdminHandler
from tiered.server.compaction import Compactor
from tiered.server.connection import IDLE_TIMEOUT_S, Connection, advertised_endpoint, bind_listener, serve
from tiered.server.consume import ConsumeHandler
from tiered.server.fetch import FetchResolver
from tiered.server.limits import AcceptErrors, ReceiveBudget, Throttled, max_connections
from tiered.server.produce import ProduceHandler
from tiered.server.registry import Partition, Registry, Role
from tiered.server.waiters import Waiters
from tiered.storage.local_state import LocalState
from tiered.storage.topics import TopicDirExists
from tiered.tasks import Supervisor
from tiered.tier_interface import PartitionPlan, Tier

log = logging.getLogger("tiered.server")


@dataclass
class Handlers:
    produce: ProduceHandler
    consume: ConsumeHandler
    admin: AdminHandler


class Broker:
    def __init__(self, settings: Settings, registry: Registry, waiters: Waiters, metrics: Metrics, tier: Tier, *,
                 local_state: LocalState | None = None, clock: Clock = SYSTEM_CLOCK,
                 now_s: Callable[[], float] = time.time):
        self.settings = settings
        self.registry = registry
        self.waiters = waiters
        self.metrics = metrics
        self.tier = tier
        self.local_state = local_state
        self.clock = clock
        self.now_s = now_s
        self.fetch = FetchResolver(tier)
        self.supervisor = Supervisor(metrics, clock=clock)
        self.compactor = Compactor(registry, metrics, tier, clock=clock, now_s=now_s)
        self.handlers = Handlers(ProduceHandler(self), ConsumeHandler(self), AdminHandler(self))
        self.connections: set[Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.plain_server: asyncio.base_events.Server | None = None  # --listen-plain, when TLS is on
        tls = settings.server_tls()
        # Raises TLSError (one line) when the files do not load: a broker does not start without its certificate.
        self.tls: CertReloader | None = CertReloader(tls, clock.monotonic()) if tls else None
        # Raises RulesError (one line) when the access rules file does not load.
        self.access = Access(settings.acl, metrics, clock)
        self.started_at = time.time()
        self.idle_timeout_s = IDLE_TIMEOUT_S
        self.retention_interval_s = settings.local_retention_interval_ms / 1000
        self.stopping = False
        self.ready = False
        self.http_port: int | None = None  # the HTTP endpoint's port, when it serves (set by the App)
        self.advertised_host = ""  # the host of the TANK endpoint this broker advertises (set at start)
        self.receive_budget = ReceiveBudget()
        self.max_connections = max_connections()
        self.connections_refused = Throttled("connection limit reached ({limit} open): refused {count} connection(s)")
        self._stop_started = False
        # Set when the broker must stop by itself (another process took its broker id); `exit_code` is then 1.
        self.stop_requested = asyncio.Event()
        self.exit_code = 0
        self._creating = asyncio.Lock()  # one local topic creation at a time (a request, or the catalog's view)
        metrics.gauge(m.PARTITIONS_DAMAGED, self._damaged_gauge)
        self.heap = Heap(clock.monotonic)  # long-lived objects set aside from the cyclic collector (tiered.heap)
        metrics.gauge(m.HEAP_FROZEN_OBJECTS, self.heap.frozen)
        metrics.counter_fn(m.HEAP_SETTLES, lambda: float(self.heap.settles))

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.registry.open_all(self.tier)
        host, port = self.settings.listen_endpoint()
        sock = bind_listener(host, port)
        plain = self.settings.listen_plain_endpoint()
        plain_sock = None
        try:
            plain_sock = bind_listener(*plain) if plain is not None else None
            await self.tier.start()
            await self._open_partitions()
            bound_host, bound_port = sock.getsockname()[:2]
            advertised = advertised_endpoint(self.settings.advertise, bound_host, bound_port)
            self.advertised_host = advertised.rpartition(":")[0]
            http = f"{self.advertised_host}:{self.http_port}" if self.http_port else ""
            # Where plaintext clients reach this broker: the listener itself with TLS off, else the plaintext one.
            if self.tls is None:
                advertised_plain = advertised
            elif plain_sock is not None:
                advertised_plain = advertised_endpoint("", *plain_sock.getsockname()[:2])
            else:
                advertised_plain = ""
            await self.tier.join(advertised, http, advertised_plain)
        except BaseException:
            sock.close()
            if plain_sock is not None:
                plain_sock.close()
            raise
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(AcceptErrors(loop.get_exception_handler()))
        self.heap.settle("start-up")
        self.server = await serve(self, sock, self.tls.listener_context if self.tls else None)
        if plain_sock is not None:
            self.plain_server = await serve(self, plain_sock)
        if self.tls is not None:
            self.supervisor.every("tls reload", RELOAD_INTERVAL_S, self._reload_tls)
        if self.access.file is not None:
            self.supervisor.every("access rules reload", ACL_RELOAD_INTERVAL_S, self.access.reload)
        self.supervisor.every("local retention", self.retention_interval_s, self._retention_pass)
        self.supervisor.start("compaction", self.compactor.run)
        self.ready = True
        log.info(
            "serving %d topics, %d partitions on %s",
            len(self.registry.topics),
            self.registry.partition_count(),
            ", ".join(f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in self.server.sockets),
        )
        if self.tls is not None:
            log.info("TLS on%s", ", client certificates required" if self.settings.tls_client_ca else "")
        if self.access.file is not None:
            log.info("access rules from %s (%d rules)", self.access.file.path, len(self.access.file.rules.rules))
        if self.plain_server is not None:
            log.info("plaintext listener on %s:%d", *self.plain_server.sockets[0].getsockname()[:2])

    async def _reload_tls(self) -> None:
        """New connections use the certificate files as they are now (tiered.tls.CertReloader)."""
        assert self.tls is not None
        self.tls.check(self.clock.monotonic())

    async def _open_partitions(self) -> None:
        if not self.tier.lower_tier:
            for part in self.registry.all_partitions():
                if self.registry.servable(part):  # one that could not be opened is never written
                    part.role = Role.LEADER
            return
        applied = self.local_state.applied_epoch if self.local_state is not None else (lambda t, p: None)
        plan = await self.tier.open_partitions(self.registry.local_view(applied))
        for name, why in plan.not_served.items():
            log.info("topic %s is not served here: %s", name, why)
        for topic in plan.create:
            log.info("creating topic %s locally from the catalog (%d partitions)", topic.name, topic.partitions)
            try:
                await self.ensure_local_topic(topic.name, topic.partitions, topic.config_text)
            except Exception as exc:
                log.error("topic %s cannot be created locally and is not served: %s", topic.name, exc)
        await self.apply_plans(plan.partitions)

    async def ensure_local_topic(self, name: str, partitions: int, config_text: str) -> bool:
        """Creates the topic locally unless it exists; True if it was created here. In a worker thread: a topic of
        thousands of partitions takes a while to lay out on disk."""
        async with self._creating:
            if name in self.registry.topics:
                return False
            await asyncio.to_thread(self.registry.create_topic, name, partitions, config_text, self.tier)
            self.heap.settle(f"topic {name} was laid out")
            return True

    async def apply_plans(self, plans: Sequence[PartitionPlan]) -> None:
        """Carries the tier's plans out on the local logs, remembers their epochs, then lets the tier lead each
        partition (uploading the tail a plan keeps) and serves it. A partition whose plan fails is reported and
        stays unserved; the others are served."""
        ready: list[tuple[Partition, PartitionPlan]] = []
        for plan in plans:
            part = self.registry.get(plan.topic, plan.partition)
            if part is None:
                log.error("%s/%d: planned but not open locally; not served", plan.topic, plan.partition)
                continue
            # A partition that could not be opened is not claimed (TierEvents.local_partition); should a plan come
            # for one anyway, it is moved aside first, or not served.
            damaged = self.registry.damaged.get(part.tp)
            if damaged is not None and not damaged.served:
                if not self.registry.reopen_empty(part, damaged.reason, self.tier):
                    log.error("%s", self.registry.damaged[part.tp].describe())
                    continue
            try:
                self._carry_out(part, plan)
            except Exception as exc:
                # The local log cannot take the plan (an I/O error, a damaged file): with the catalog holding the
                # history, the partition starts again empty, as on a lost disk; the plan then only continues.
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())
                if not self.registry.reopen_empty(part, reason, self.tier):
                    log.error("%s/%d cannot be opened and is not served: %s", plan.topic, plan.partition, reason)
                    continue
                try:
                    self._carry_out(part, plan)
                except Exception as again:
                    log.error("%s/%d cannot be opened and is not served: %s", plan.topic, plan.partition, again)
                    continue
            part.committed = plan.committed
            part.catalog_first_moved(plan.first_available)
            part.leader = None
            if plan.truncate_after is not None or plan.reupload_after is not None or part.log.last_held < plan.committed:
                log.info("%s/%d (epoch %d): %s", plan.topic, plan.partition, plan.epoch, plan.reason)
            ready.append((part, plan))
        if self.local_state is not None:
            self.local_state.record_applied({(p.topic, p.partition): plan.epoch for p, plan in ready})
        for part, plan in ready:
            tail = () if plan.reupload_after is None else part.log.iter_records(plan.reupload_after + 1,
                                                                                 part.log.last_held)
            await self.tier.resume(plan, part.config, tail)
            part.role = Role.LEADER
            segments = part.log.segments
            if segments:
                self.registry.note_sealed(part.tp)  # a truncation recovered its log anew
            for segment in segments:
                self.tier.sealed(part.tp, segment)
        if ready:
            self.heap.settle(f"{len(ready)} partitions were led")

    @staticmethod
    def _carry_out(part: Partition, plan: PartitionPlan) -> None:
        if plan.truncate_after is not None:
            part.log.truncate_after(plan.truncate_after)
        part.log.ensure_next_seq(plan.next_seq)

    def _damaged_gauge(self) -> dict[str, float]:
        served = sum(d.served for d in self.registry.damaged.values())
        return {'served="true"': served, 'served="false"': len(self.registry.damaged) - served}

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    def request_stop(self, reason: str) -> None:
        """Stops the broker as SIGTERM does, and makes its process exit 1 (`tiered serve` waits for this too)."""
        log.error("stopping: %s", reason)
        self.exit_code = 1
        self.stop_requested.set()

    async def stop(self, timeout_s: float | None = None) -> None:
        """Graceful: stop accepting, answer waiters, finish in-flight work, commit the open block, close."""
        if self._stop_started:
            return
        self._stop_started = True
        self.ready = False
        try:
            await self._stop(timeout_s)
        finally:
            self.heap.thaw()  # after the handover: a full pass over every partition would stall it

    async def _stop(self, timeout_s: float | None) -> None:
        timeout_s = self.settings.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = self.clock.monotonic() + timeout_s
        if self.server is not None:
            # Still listening: clients of the partitions handed over are told where they went.
            await self.tier.hand_over(deadline)
        self.stopping = True
        if self.server is not None:
            self.server.close()
        if self.plain_server is not None:
            self.plain_server.close()
        await self.compactor.stop(deadline)  # before the logs close under a pass
        await self.supervisor.stop()
        self.waiters.wake_all("shutdown")
        await self.tier.flush(deadline)
        pending = [t for c in self.connections for t in c.tasks]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - self.clock.monotonic()))
        await self._close_connections(deadline)
        await self.tier.stop(deadline)
        self.registry.close()
        log.info("stopped")

    async def _close_connections(self, deadline: float) -> None:
        """Closes every connection at once. A TLS close waits for the client's close_notify (at most
        tiered.tls.SHUTDOWN_TIMEOUT_S); a client that never answers is cut off at the deadline, so shutdown stays within
        its budget whatever the clients do."""
        conns = list(self.connections)
        if not conns:
            return
        closing = [asyncio.ensure_future(conn.close()) for conn in conns]
        _, late = await asyncio.wait(closing, timeout=max(0.0, deadline - self.clock.monotonic()))
        if late:
            log.warning("%d connection(s) did not close by the shutdown deadline; cut off", len(late))
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.abort()
            await asyncio.wait(late, timeout=1.0)

    # -- the data path ----------------------------------------------------------------------------------------

    def apply_topic_config(self, name: str, config_text: str) -> None:
        """The catalog's configuration of a topic changed (`tiered topic config`): every partition follows it, and the
        tier for those it leads. Raises ConfigError when it cannot be used here (nothing changes)."""
        for part in self.registry.reconfigure_topic(name, config_text):
            self.tier.reconfigured(part.tp, part.config)
        log.info("topic %s: configuration applied from the catalog (%s)", name,
                 ", ".join(line.strip() for line in config_text.splitlines() if line.strip()) or "no keys")

    async def create_topic(self, name: str, partitions: int, config_text: str) -> None:
        """Raises TopicExists (the catalog has it) or TopicDirExists (the disk has it)."""
        plans = await self.tier.create_topic(name, partitions, config_text)
        if not await self.ensure_local_topic(name, partitions, config_text) and not self.tier.lower_tier:
            raise TopicDirExists(name)
        if not self.tier.lower_tier:
            for part in self.registry.topics[name].partitions:
                part.role = Role.LEADER
            return
        await self.apply_plans(plans)
        await self.tier.topic_created(name, partitions)

    # -- timers -----------------------------------------------------------------------------------------------

    async def _retention_pass(self) -> None:
        self.enforce_retention()

    def enforce_retention(self) -> int:
        """TANK checks retention only on roll; we also check on a timer so idle partitions are trimmed too. Only
        the partitions holding sealed segments are visited (`Registry.with_sealed`): retention never deletes an
        active segment, so a partition without sealed segments has nothing it could delete."""
        deleted = 0
        now = self.now_s()
        for part in self.registry.with_sealed():
            deleted += len(part.log.enforce_retention(now, part.log.may_delete))
        return deleted

    async def check_ready(self) -> tuple[bool, str]:
        """Ready or not, and why; ready with the partitions that could not be opened named (each darkens only
        itself: the broker serves the others)."""
        damaged = self.registry.damaged_report()
        if not self.ready:
            ok, why = False, "the broker is not serving"
        elif problems := self.supervisor.problems():
            ok, why = False, problems
        else:
            ok, why = await self.tier.check_ready()
        return ok, "\n".join(w for w in (why, damaged) if w)
