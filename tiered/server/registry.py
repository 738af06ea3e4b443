"""The broker's topics and partitions: which exist, their configs, their open partition logs, and what the tier
below reported about them.

A topic's effective config is layered: TANK's built-in defaults < the broker's `topic_defaults` < the topic's
`config` file < the partition's `config` file. Partition logs are opened (and recovered) when the broker starts,
so a torn tail is reported at start-up rather than on the first request that happens to touch it.

Only the server changes a Partition: its request handlers and its TierSink (tiered.server.tier_events).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping

from tiered.bounds import PartitionBounds
from tiered.storage import topics as topic_dirs
from tiered.storage.partition_log import PartitionLog
from tiered.storage.topic_config import ConfigError, TopicConfig, parse_config_text
from tiered.tier_interface import Leader, LocalPartition, LocalTopic, Tier
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.server")


class Role(Enum):
    OPENING = "opening"  # being reconciled with the catalog: not served yet
    LEADER = "leader"  # produce and consume served here
    FOLLOWER = "follower"  # led by another broker (or by nobody yet): history served here, the tail redirected


@dataclass
class Partition:
    topic: str
    partition: int
    log: PartitionLog
    config: TopicConfig
    lower_tier: bool  # a tier below the local disk holds (and makes visible) what is committed
    role: Role = Role.OPENING
    committed: int = 0  # the catalog's high-water mark: every seq up to it is in the bucket and the catalog
    # The catalog's first available seq (0: it holds nothing of the partition yet). Changed only through
    # `catalog_first_moved`: it never moves back.
    catalog_first: int = 0
    leader: Leader | None = None  # a FOLLOWER's leader, where its tail is redirected (None: no leader yet)
    # A FOLLOWER serves its local records only up to here: past it the disk may hold records this broker appended
    # but never committed (it lost the partition), which the catalog's history does not have.
    trusted_local: int = 0
    # Its name as one value, built once here: what the server passes to the tier (tiered.tier_interface).
    tp: TopicPartition = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.tp = TopicPartition(self.topic, self.partition)

    @property
    def durable(self) -> bool:
        """Visibility follows durability: with a tier below, a durable topic shows only committed records."""
        return self.lower_tier and self.config.produce_ack == "durable"

    def bounds(self) -> PartitionBounds:
        """A leader's bounds come from its own log; a follower's from the catalog (as of its last look) and the local
        records it may trust. This is the one place that says where a partition begins (Discover, consume, Status)."""
        plog = self.log
        local_first = plog.first_available
        local_last = plog.last_held
        following = self.role is not Role.LEADER
        if following:
            local_last = min(local_last, self.trusted_local)
            if local_last < local_first:
                local_first = local_last = 0
        # Once the catalog holds the partition, its first available seq is the partition's, above the disk's first
        # seq as well as below it: remote retention moves it forward only, and local records below it (kept longer by
        # a longer local retention, or found again at a restart) expired and are never served. The disk decides only
        # while the catalog holds nothing of the partition: its records are then the only history there is.
        first = self.catalog_first or local_first
        hwmark = self.committed if self.durable or following else plog.last_assigned
        return PartitionBounds(first, hwmark, local_first, local_last, self.lower_tier)

    def catalog_first_moved(self, seq: int) -> None:
        """The catalog's first available seq is `seq` (as of some read of it): raised, never lowered, since a report
        may be older than one already applied (a follow from the coordinator's last look after a retention pass
        here) and the catalog's own never moves back."""
        if seq > self.catalog_first:
            self.catalog_first = seq

    @property
    def hwmark(self) -> int:
        return self.bounds().hwmark

    @property
    def first_available(self) -> int:
        return self.bounds().first_available


@dataclass
class Topic:
    name: str
    config_text: str
    config: TopicConfig
    partitions: list[Partition] = field(default_factory=list)


class Registry:
    """Every topic the broker serves, opened from the data directory."""

    def __init__(self, data_dir: Path, topic_defaults: Mapping[str, str], *, now_s: Callable[[], float] = time.time):
        self.data_dir = Path(data_dir)
        self.topic_defaults = dict(topic_defaults)
        self.now_s = now_s
        self.topics: dict[str, Topic] = {}
        self.open_time_ms = 0
        # The partitions whose log may hold sealed segments: the only ones local retention can delete from (the
        # active segment is never a candidate), so the only ones its periodic pass visits. A partition enters at
        # open (a log recovered with sealed segments), at each roll (`on_seal`) and when a plan rewrote its log
        # (`note_sealed`); it leaves when a pass finds no sealed segment left (`with_sealed`). An idle broker's
        # pass then costs what the disks hold, not how many partitions exist.
        self._with_sealed: set[TopicPartition] = set()

    def topic_config(self, config_text: str, partition_values: Mapping[str, str] | None = None) -> TopicConfig:
        """Raises ConfigError naming the key and value that cannot be used."""
        layers = [self.topic_defaults, parse_config_text(config_text)[0]]
        if partition_values:
            layers.append(dict(partition_values))
        return TopicConfig.from_layers(*layers)

    def open_all(self, tier: Tier) -> None:
        """Opens every topic of the data directory; `tier` is told of each partition's rolls and may veto the
        deletion of its sealed segments."""
        started = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        found_topics, problems = topic_dirs.scan_report(str(self.data_dir))
        for problem in problems:
            log.warning("data directory: %s", problem)
        for found in found_topics:
            try:
                self.open_topic(found.name, found.partitions, found.config_text, tier)
            except Exception as exc:  # one topic that cannot be opened does not keep the others dark
                log.error("topic %s cannot be opened and is not served: %s", found.name, exc)
        self.open_time_ms = int((time.monotonic() - started) * 1000)

    def open_topic(self, name: str, partitions: int, config_text: str, tier: Tier) -> Topic:
        config = self.topic_config(config_text)
        topic = Topic(name, config_text, config)
        for p in range(partitions):
            topic.partitions.append(self._open_partition(name, p, self._partition_config(name, p, config_text), tier))
        self.topics[name] = topic
        return topic

    def _partition_config(self, name: str, partition: int, config_text: str) -> TopicConfig:
        """The topic's layers and the partition's own `config` file over them; a file that cannot be used is
        logged and left out."""
        try:
            values, _ = topic_dirs.read_partition_config(str(self.data_dir), name, partition)
            return self.topic_config(config_text, values)
        except topic_dirs.PartitionConfigError as exc:
            if exc.kind != "missing":
                log.warning("partition config of %s/%d not applied: %s", name, partition, exc)
        except ConfigError as exc:
            log.warning("partition config of %s/%d not applied: %s", name, partition, exc)
        return self.topic_config(config_text)

    def reconfigure_topic(self, name: str, config_text: str) -> list[Partition]:
        """Applies a new topic-level configuration (the catalog's, changed by `tiered topic config`) to every
        partition, under each partition's own file as at open, and keeps it on disk for the next start. Raises
        ConfigError (nothing changed) when it cannot be used. Returns the partitions reconfigured."""
        topic = self.topics[name]
        config = self.topic_config(config_text)
        topic_dirs.write_topic_config(str(self.data_dir), name, config_text)
        topic.config_text, topic.config = config_text, config
        for part in topic.partitions:
            part.config = self._partition_config(name, part.partition, config_text)
            part.log.reconfigure(part.config)
        return list(topic.partitions)

    def _open_partition(self, topic: str, partition: int, config: TopicConfig, tier: Tier) -> Partition:
        tp = TopicPartition(topic, partition)
        plog = PartitionLog.open(str(self.data_dir / topic / str(partition)), config, now_s=self.now_s,
                                 **self._tier_callbacks(tp, tier))
        if plog.segments:
            self._with_sealed.add(tp)
        return self._partition(topic, partition, plog, config, tier)

    def _tier_callbacks(self, tp: TopicPartition, tier: Tier) -> dict[str, Any]:
        """PartitionLog's on_seal and may_delete keywords for a partition of `tier`."""
        with_sealed = self._with_sealed

        def on_seal(segment) -> None:
            with_sealed.add(tp)
            tier.sealed(tp, segment)

        return {"on_seal": on_seal, "may_delete": lambda segment: tier.may_delete_local(tp, segment)}

    def note_sealed(self, tp: TopicPartition) -> None:
        """The partition's log was rewritten (a plan's truncation): local retention looks at it again."""
        self._with_sealed.add(tp)

    def with_sealed(self) -> list[Partition]:
        """The partitions whose logs hold sealed segments (local retention's candidates); those found with none
        left are forgotten until their next roll."""
        found = []
        for tp in list(self._with_sealed):
            part = self.get(*tp)
            if part is None:
                self._with_sealed.discard(tp)
            elif part.log.segments:
                found.append(part)
            else:
                # Forgotten first, looked at second: a roll in between (on_seal, any thread) adds it back.
                self._with_sealed.discard(tp)
                if part.log.segments:
                    self._with_sealed.add(tp)
                    found.append(part)
        return found

    @staticmethod
    def _partition(topic: str, partition: int, plog: PartitionLog, config: TopicConfig, tier: Tier) -> Partition:
        return Partition(topic, partition, plog, config, tier.lower_tier)

    def create_topic(self, name: str, partitions: int, config_text: str, tier: Tier) -> Topic:
        """Creates the topic's directories atomically and opens it. Raises on a bad name, config or an existing topic."""
        topic_dirs.validate_topic_name(name)
        self.topic_config(config_text)  # refuse a bad config before anything is written
        topic_dirs.create_topic_dir(str(self.data_dir), name, partitions, config_text)
        # Its partition directories were just made, empty, and hold no config file of their own: each log is opened
        # as new (no recovery pass, no second mkdir, no config file to look for), with one random generator.
        config = self.topic_config(config_text)
        rng = random.Random()
        topic = Topic(name, config_text, config)
        base = os.path.join(self.data_dir, name)
        topic.partitions = [self._partition(name, p, PartitionLog.open_new(
            os.path.join(base, str(p)), config, rng=rng, now_s=self.now_s,
            **self._tier_callbacks(TopicPartition(name, p), tier)), config, tier) for p in range(partitions)]
        self.topics[name] = topic
        return topic

    def get(self, topic: str, partition: int) -> Partition | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return None
        return t.partitions[partition]

    def all_partitions(self) -> Iterator[Partition]:
        for topic in self.topics.values():
            yield from topic.partitions

    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics.values())

    def local_view(self, applied_epoch: Callable[[str, int], int | None]) -> list[LocalTopic]:
        """What the disk holds, for the tier's start-up plan."""
        return [
            LocalTopic(t.name, t.config_text, tuple(
                LocalPartition(t.name, p.partition, p.log.first_available, p.log.last_held,
                               applied_epoch(t.name, p.partition))
                for p in t.partitions))
            for t in self.topics.values()
        ]

    def close(self) -> None:
        for part in self.all_partitions():
            part.log.close()
