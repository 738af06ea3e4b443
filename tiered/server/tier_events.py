"""The server's side of the tier seam (tiered.tier_interface.TierSink): what the tier below reports changes what a
partition serves, here and only here.

- committed: the catalog's high-water mark moves up; on a durable topic the records become visible, and long-poll
  waiters on the partition wake (visibility follows durability).
- fenced: a commit was refused because another leader claimed the partition; it is followed from now on.
- copied: a sealed segment is in the bucket (local retention may delete it; nothing changes for readers).
- first_available_moved: remote retention moved the start of the partition's history.
- lead: plans for partitions the tier claimed, carried out by the broker (Broker.apply_plans).
- follow: the partition is led by another broker, or by nobody yet: history up to the catalog's high-water mark is
  served here, the tail and produces go to the leader (0xfc) or wait for one (0xfd).
- evicted: another process took this broker's id over; this one stops (its clients reconnect to the others).
- topics_known: topics another broker created are created locally, so that any broker serves any topic; a topic
  whose configuration changed in the catalog (`tiered topic config`) is reconfigured here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tiered.server.registry import Registry, Role
from tiered.server.waiters import Waiters
from tiered.storage.topic_config import ConfigError
from tiered.tier_interface import Leader, LocalPartition, NewLocalTopic, PartitionPlan
from tiered.topic_partition import TopicPartition

if TYPE_CHECKING:
    from tiered.server.broker import Broker

log = logging.getLogger("tiered.server")


class TierEvents:
    def __init__(self, registry: Registry, waiters: Waiters):
        self.registry = registry
        self.waiters = waiters
        self._broker: Broker | None = None  # bound once it exists: it is built after the tier that reports here
        self._unservable: set[str] = set()  # topics that could not be created here (said once)
        self._refused_configs: dict[str, str] = {}  # topic -> a catalog configuration refused here (said once)

    def bind(self, broker: Broker) -> None:
        self._broker = broker

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            raise RuntimeError("TierEvents.bind() was not called")
        return self._broker

    def committed(self, tp: TopicPartition, first_seq: int, last_seq: int, size_bytes: int) -> None:
        part = self.registry.get(*tp)
        if part is None:
            return
        if last_seq > part.committed:
            part.committed = last_seq
        if not part.catalog_first:  # the partition's first commit: the catalog holds it from here
            part.catalog_first_moved(first_seq)
        if part.durable:
            self.waiters.visible(tp, first_seq, size_bytes)

    def fenced(self, tp: TopicPartition, reason: str) -> None:
        self.follow(tp, None, None)

    def copied(self, tp: TopicPartition, base: int, last: int) -> None:
        part = self.registry.get(*tp)
        if part is not None and not part.catalog_first:
            part.catalog_first_moved(base)

    def first_available_moved(self, tp: TopicPartition, seq: int) -> None:
        part = self.registry.get(*tp)
        if part is not None:
            part.catalog_first_moved(seq)

    def follow(self, tp: TopicPartition, leader: Leader | None, committed: int | None,
               first_available: int | None = None) -> None:
        part = self.registry.get(*tp)
        if part is None:
            return
        moved = part.role is not Role.FOLLOWER or part.leader != leader
        if part.role is Role.LEADER:
            # What it committed as leader agrees with the catalog; past that, the disk may hold records the
            # catalog never got (the new leader continues without them): not served from here.
            part.trusted_local = part.committed
        part.role = Role.FOLLOWER
        part.leader = leader
        if committed is not None and committed > part.committed:
            part.committed = committed
        if first_available:
            part.catalog_first_moved(first_available)
        if moved:
            self.waiters.wake_partition(tp)  # long-polls answer now: redirected, or at EOF

    async def lead(self, plans: Sequence[PartitionPlan]) -> None:
        await self.broker.apply_plans(plans)

    async def topics_known(self, topics: Sequence[NewLocalTopic]) -> None:
        for topic in topics:
            known = self.registry.topics.get(topic.name)
            if known is not None:
                if known.config_text != topic.config_text:
                    self._reconfigure(topic.name, topic.config_text)
                if len(known.partitions) < topic.partitions:  # the disk lost its last partitions' directories
                    self.registry.add_missing_partitions(topic.name, topic.partitions, self.broker.tier)
                continue
            if topic.name in self._unservable:
                continue
            log.info("topic %s (%d partitions) is in the catalog: creating it here", topic.name, topic.partitions)
            try:
                await self.broker.ensure_local_topic(topic.name, topic.partitions, topic.config_text)
            except Exception as exc:
                self._unservable.add(topic.name)
                log.error("topic %s cannot be created here and is not served: %s", topic.name, exc)

    def evicted(self, reason: str) -> None:
        self.broker.request_stop(reason)

    def _reconfigure(self, name: str, config_text: str) -> None:
        if self._refused_configs.get(name) == config_text:
            return  # said once
        try:
            self.broker.apply_topic_config(name, config_text)
        except (ConfigError, OSError) as exc:
            self._refused_configs[name] = config_text
            log.error("topic %s: the catalog's configuration cannot be applied here, the previous one stays: %s",
                      name, exc)
        else:
            self._refused_configs.pop(name, None)

    def local_partition(self, tp: TopicPartition) -> LocalPartition | None:
        part = self.registry.get(*tp)
        if part is None or not self.registry.servable(part):
            return None  # not claimed: a partition that could not be opened is never led here
        state = self.broker.local_state
        applied = state.applied_epoch(tp.topic, tp.partition) if state is not None else None
        return LocalPartition(tp.topic, tp.partition, part.log.first_available, part.log.last_held, applied)
