"""The broker's topics and partitions: which exist, their configs, and their open partition logs.

A topic's effective config is layered: TANK's built-in defaults < the broker's `topic_defaults` < the topic's
`config` file < the partition's `config` file. Partition logs are opened (and recovered) when the broker starts,
so a torn tail is reported at start-up rather than on the first request that happens to touch it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from tiered.storage import topics as topic_dirs
from tiered.storage.partition_log import PartitionLog
from tiered.storage.topic_config import TopicConfig, parse_config_text

log = logging.getLogger("tiered.server")


@dataclass
class Partition:
    topic: str
    partition: int
    log: PartitionLog
    config: TopicConfig
    # The lowest seq any tier still holds; the remote tier lowers it below the local log's first available.
    remote_first_available: int = 0
    remote_hwmark: int = 0  # the catalog's high-water mark: every seq up to it is durable in the bucket
    fenced: bool = False  # a newer leader epoch took the partition over: it is no longer served here

    @property
    def first_available(self) -> int:
        local = self.log.first_available
        if self.remote_first_available and (not local or self.remote_first_available < local):
            return self.remote_first_available
        return local

    @property
    def hwmark(self) -> int:
        return self.log.visible_seq

    @property
    def durable(self) -> bool:
        return self.config.produce_ack == "durable"


@dataclass
class Topic:
    name: str
    config_text: str
    config: TopicConfig
    partitions: list[Partition] = field(default_factory=list)


class Registry:
    """Every topic the broker serves, opened from the data directory."""

    def __init__(
        self,
        data_dir: Path,
        topic_defaults: Mapping[str, str],
        *,
        now_s: Callable[[], float] = time.time,
        visible_on_append: Callable[[TopicConfig], bool] = lambda config: True,
    ):
        self.data_dir = Path(data_dir)
        self.topic_defaults = dict(topic_defaults)
        self.now_s = now_s
        self.visible_on_append = visible_on_append
        self.topics: dict[str, Topic] = {}
        self.open_time_ms = 0
        self.on_seal = None  # set by the tiering layer: called with (Partition, SealedSegment)
        # Local retention's veto, set by the tiering layer (a segment stays until it is in the bucket).
        self.may_delete: Callable[[Partition, object], bool] = lambda part, segment: True

    def topic_config(self, config_text: str, partition_values: Mapping[str, str] | None = None) -> TopicConfig:
        """Raises ConfigError naming the key and value that cannot be used."""
        layers = [self.topic_defaults, parse_config_text(config_text)[0]]
        if partition_values:
            layers.append(dict(partition_values))
        return TopicConfig.from_layers(*layers)

    def open_all(self) -> None:
        started = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        found_topics, problems = topic_dirs.scan_report(str(self.data_dir))
        for problem in problems:
            log.warning("data directory: %s", problem)
        for found in found_topics:
            self.open_topic(found.name, found.partitions, found.config_text)
        self.open_time_ms = int((time.monotonic() - started) * 1000)

    def open_topic(self, name: str, partitions: int, config_text: str) -> Topic:
        config = self.topic_config(config_text)
        topic = Topic(name, config_text, config)
        for p in range(partitions):
            part_config = config
            try:
                values, _ = topic_dirs.read_partition_config(str(self.data_dir), name, p)
                part_config = self.topic_config(config_text, values)
            except topic_dirs.PartitionConfigError as exc:
                if exc.kind != "missing":
                    log.warning("partition config of %s/%d not applied: %s", name, p, exc)
            topic.partitions.append(self._open_partition(name, p, part_config))
        self.topics[name] = topic
        return topic

    def _open_partition(self, topic: str, partition: int, config: TopicConfig) -> Partition:
        holder: list[Partition] = []

        def sealed(segment) -> None:
            if self.on_seal is not None and holder:
                self.on_seal(holder[0], segment)

        plog = PartitionLog.open(
            str(self.data_dir / topic / str(partition)),
            config,
            now_s=self.now_s,
            on_seal=sealed,
            may_delete=lambda segment: bool(holder) and self.may_delete(holder[0], segment),
            visible_on_append=self.visible_on_append(config),
        )
        part = Partition(topic, partition, plog, config)
        holder.append(part)
        return part

    def create_topic(self, name: str, partitions: int, config_text: str) -> Topic:
        """Creates the topic's directories atomically and opens it. Raises on a bad name, config or an existing topic."""
        topic_dirs.validate_topic_name(name)
        self.topic_config(config_text)  # refuse a bad config before anything is written
        topic_dirs.create_topic_dir(str(self.data_dir), name, partitions, config_text)
        return self.open_topic(name, partitions, config_text)

    def get(self, topic: str, partition: int) -> Partition | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return None
        return t.partitions[partition]

    def all_partitions(self):
        for topic in self.topics.values():
            yield from topic.partitions

    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics.values())

    def close(self) -> None:
        for part in self.all_partitions():
            part.log.close()
