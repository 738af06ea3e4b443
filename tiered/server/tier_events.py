"""The server's side of the tier seam (tiered.tier_interface.TierSink): what the tier below reports changes what a
partition serves, here and only here.

- committed: the catalog's high-water mark moves up; on a durable topic the records become visible, and long-poll
  waiters on the partition wake (visibility follows durability).
- fenced: another leader claimed the partition; produce and consume are answered "no leader" from now on.
- copied: a sealed segment is in the bucket (local retention may delete it; nothing changes for readers).
- first_available_moved: remote retention moved the start of the partition's history.
"""

from __future__ import annotations

import logging

from tiered.server.registry import Registry, Role
from tiered.server.waiters import Waiters

log = logging.getLogger("tiered.server")


class TierEvents:
    def __init__(self, registry: Registry, waiters: Waiters):
        self.registry = registry
        self.waiters = waiters

    def committed(self, topic: str, partition: int, first_seq: int, last_seq: int, size_bytes: int) -> None:
        part = self.registry.get(topic, partition)
        if part is None:
            return
        if last_seq > part.committed:
            part.committed = last_seq
        if not part.catalog_first:
            part.catalog_first = first_seq
        if part.durable:
            self.waiters.visible(topic, partition, first_seq, size_bytes)

    def fenced(self, topic: str, partition: int, reason: str) -> None:
        part = self.registry.get(topic, partition)
        if part is not None:
            part.role = Role.FENCED
            self.waiters.wake_partition(topic, partition)

    def copied(self, topic: str, partition: int, base: int, last: int) -> None:
        part = self.registry.get(topic, partition)
        if part is not None and not part.catalog_first:
            part.catalog_first = base

    def first_available_moved(self, topic: str, partition: int, seq: int) -> None:
        part = self.registry.get(topic, partition)
        if part is not None and seq > part.catalog_first:
            part.catalog_first = seq
