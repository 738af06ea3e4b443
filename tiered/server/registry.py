"""The broker's topics and partitions: which exist, their configs, their open partition logs, and what the tier
below reported about them.

A topic's effective config is layered: TANK's built-in defaults < the broker's `topic_defaults` < the topic's
`config` file < the partition's `config` file. Partition logs are opened (and recovered) when the broker starts,
so a torn tail is reported at start-up rather than on the first request that happens to touch it.

With a tier below, a partition's directory is made when its log first writes a file (`PartitionLog.make_directory`:
a produce led here, a compaction checkpoint), not when its topic is created nor when it is claimed: a creation costs
each broker one directory per topic, not one per partition of the topic on every broker (tiered.storage.topics).
Until then the partition has an empty log whose directory is not made (`PartitionLog.made`): led or followed, it is
served like any other (its history read from the bucket), and nothing reads a directory an empty log does not have.

A partition that cannot be opened (recovery refuses it, an I/O or permission error, a file or nothing where its
directory should be) darkens only itself, never its topic: it is recorded in `damaged` (logged, counted by the
`tiered_partitions_damaged` gauge, named by /readyz) and
- with a tier below (the catalog holds its history), its directory is moved aside, whole, into
  `<data>/.tiered/damaged/` for an operator, and the partition opens again empty: the path of a lost disk, where
  a claim continues from the catalog's high-water mark and older seqs are read from the bucket;
- otherwise (a plain TANK broker, whose disk is the only history: starting empty would hand its seqs out again),
  or when the move fails, it stays in the registry with an empty log that is never written and never led (a
  produce is answered "no leader", a consume finds nothing), until an operator repairs it and restarts.

Only the server changes a Partition: its request handlers and its TierSink (tiered.server.tier_events).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping

from tiered.bounds import PartitionBounds
from tiered.storage import topics as topic_dirs
from tiered.storage.partition_log import PartitionLog
from tiered.storage.segment import SealedSegment, fsync_dir
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
    # Visibility follows durability: with a tier below, a durable topic shows only committed records. Kept current
    # here, its one owner (at construction and by `reconfigure`, the one writer of `config`; `lower_tier` never
    # changes), and read as a plain attribute by the produce path, Python and native (server/_produce.c) alike.
    durable: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.tp = TopicPartition(self.topic, self.partition)
        self._set_config(self.config)

    def reconfigure(self, config: TopicConfig) -> None:
        """The partition's configuration is now `config`: its log's limits and whether it is durable follow."""
        self._set_config(config)
        self.log.reconfigure(config)

    def _set_config(self, config: TopicConfig) -> None:
        self.config = config
        self.durable = self.lower_tier and config.produce_ack == "durable"

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


@dataclass(frozen=True, slots=True)
class Damaged:
    """A partition whose directory could not be opened: why, and what became of it."""

    tp: TopicPartition
    reason: str  # the error, one line
    served: bool  # opened again empty (its history is the catalog's); False: not served here
    kept_at: str | None = None  # where its files were moved (None: there was nothing to move, or they stayed)
    reopen_error: str | None = None  # why moving it aside and opening it again empty failed

    def describe(self) -> str:
        what = ("opened again empty, its history served from the bucket" if self.served
                else "not served here until it is repaired")
        kept = f"; its files are in {self.kept_at}" if self.kept_at else ""
        failed = f" (moving it aside failed: {self.reopen_error})" if self.reopen_error else ""
        return f"partition {self.tp} could not be opened ({self.reason}): {what}{failed}{kept}"


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
        # The partitions that could not be opened (see the module's docstring). Their files go to `damaged_dir`.
        self.damaged: dict[TopicPartition, Damaged] = {}
        self.damaged_dir = self.data_dir / ".tiered" / "damaged"
        # The partitions whose log may hold sealed segments: the only ones local retention can delete from (the
        # active segment is never a candidate), so the only ones its periodic pass visits. A partition enters at
        # open (a log recovered with sealed segments), at each roll (`on_seal`) and when a plan rewrote its log
        # (`note_sealed`); it leaves when a pass finds no sealed segment left (`with_sealed`). An idle broker's
        # pass then costs what the disks hold, not how many partitions exist.
        self._with_sealed: set[TopicPartition] = set()
        # The partitions whose config compacts them (`log.cleanup.policy=cleanup`): the only ones the compactor's
        # periodic pass looks at, kept by every write of a partition's config (`_partition`, `configure`), so that
        # an idle broker's pass costs what is compacted, not how many partitions exist.
        self._compacted: set[TopicPartition] = set()

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
        found_topics, problems = topic_dirs.scan_report(str(self.data_dir), on_demand=tier.lower_tier)
        for problem in problems:
            log.warning("data directory: %s", problem)
        for found in found_topics:
            try:
                self.open_topic(found.name, found.partitions, found.config_text, tier, missing=found.missing,
                                absent=found.absent)
            except Exception as exc:  # one topic that cannot be opened (its config) does not keep the others dark
                log.error("topic %s cannot be opened and is not served: %s", found.name, exc)
        self.open_time_ms = int((time.monotonic() - started) * 1000)

    def open_topic(self, name: str, partitions: int, config_text: str, tier: Tier,
                   missing: Collection[int] = (), absent: Collection[int] = ()) -> Topic:
        """Opens the topic's partitions; `missing` are those without a directory, `absent` those of them with nothing
        in its place (tiered.storage.topics.scan_report): with a tier below, partitions not led here yet. Raises
        ConfigError for a topic config that cannot be used; a partition that cannot be opened is `damaged`."""
        config = self.topic_config(config_text)
        topic = Topic(name, config_text, config)
        rng = random.Random()
        missing, absent = frozenset(missing), frozenset(absent)  # looked up per partition: thousands of them
        for p in range(partitions):
            if tier.lower_tier and p in absent:  # no directory, no config file of its own: made at its first write
                topic.partitions.append(self._new_partition(name, p, config, tier, rng, made=False))
                continue
            part_config = self._partition_config(name, p, config_text)
            try:
                if p in missing:
                    raise FileNotFoundError(f"{self.data_dir / name / str(p)} is not a partition directory")
                part = self._open_partition(name, p, part_config, tier)
            except Exception as exc:  # whatever it is, it is this partition's: the topic's others open
                part = self._unopened(name, p, part_config, tier, exc)
            topic.partitions.append(part)
        self.topics[name] = topic
        return topic

    def add_missing_partitions(self, name: str, partitions: int, tier: Tier) -> int:
        """The catalog counts `partitions` for a topic whose disk has fewer (its last partitions' directories are
        gone, which no scan of the disk can tell): each missing one is a partition without a directory, reopened empty
        with a tier below. Returns how many were added."""
        topic = self.topics[name]
        added = 0
        for p in range(len(topic.partitions), partitions):
            config = self._partition_config(name, p, topic.config_text)
            missing = FileNotFoundError(f"{self.data_dir / name / str(p)} is not a partition directory")
            topic.partitions.append(self._unopened(name, p, config, tier, missing))
            added += 1
        return added

    def _unopened(self, topic: str, partition: int, config: TopicConfig, tier: Tier, exc: BaseException) -> Partition:
        """The Partition of a directory that could not be opened: with an empty log that is never written, opened
        again empty at once when a tier below holds its history (reopen_empty)."""
        tp = TopicPartition(topic, partition)
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        self.damaged[tp] = Damaged(tp, reason, served=False)
        plog = PartitionLog.open_new(str(self.data_dir / topic / str(partition)), config, rng=random.Random(),
                                     now_s=self.now_s, **self._tier_callbacks(tp, tier))
        part = self._partition(topic, partition, plog, config, tier)
        if not (tier.lower_tier and self.reopen_empty(part, reason, tier)):
            log.error("%s", self.damaged[tp].describe())
        return part

    def reopen_empty(self, part: Partition, reason: str, tier: Tier) -> bool:
        """With a tier below: moves the partition's directory aside (into `damaged_dir`, whole, for an operator)
        and opens it again empty in place of `part.log`, as a lost disk would be; the claim that leads it continues
        from the catalog. Only while the partition is not led here (its log is not being written). True if it was
        reopened; False (logged by the caller) if anything failed: the partition stays unserved."""
        tp = part.tp
        if not tier.lower_tier or part.role is Role.LEADER:
            return False
        directory = self.data_dir / part.topic / str(part.partition)
        kept_at = None
        try:
            part.log.close()
            if os.path.lexists(directory):
                self.damaged_dir.mkdir(parents=True, exist_ok=True)
                stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.now_s()))
                kept = self.damaged_dir / f"{part.topic}.{part.partition}.{stamp}"
                n = 1
                while os.path.lexists(kept):
                    n += 1
                    kept = self.damaged_dir / f"{part.topic}.{part.partition}.{stamp}.{n}"
                os.rename(directory, kept)
                fsync_dir(str(directory.parent))  # the move is durable before anything is written in its place
                kept_at = str(kept)
            part.log = PartitionLog.open(str(directory), part.config, now_s=self.now_s,
                                         **self._tier_callbacks(tp, tier))
        except Exception as exc:
            self.damaged[tp] = Damaged(tp, reason, False, kept_at, " ".join(f"{type(exc).__name__}: {exc}".split()))
            part.log = PartitionLog.open_new(str(directory), part.config, rng=random.Random(), now_s=self.now_s,
                                             **self._tier_callbacks(tp, tier))  # empty, never written: not led
            return False
        self.damaged[tp] = Damaged(tp, reason, served=True, kept_at=kept_at)
        log.error("%s", self.damaged[tp].describe())
        return True

    def servable(self, part: Partition) -> bool:
        """Whether `part` may be led here: False for a partition that could not be opened and was not reopened."""
        damaged = self.damaged.get(part.tp)
        return damaged is None or damaged.served

    def damaged_report(self) -> str:
        """One line per partition that could not be opened, for /readyz; empty when there are none."""
        return "\n".join(d.describe() for d in self.damaged.values())

    def _partition_config(self, name: str, partition: int, config_text: str, made: bool = True) -> TopicConfig:
        """The topic's layers and the partition's own `config` file over them; a file that cannot be used is
        logged and left out. A partition whose directory is not `made` has no file of its own."""
        if not made:
            return self.topic_config(config_text)
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
            self.configure(part, self._partition_config(name, part.partition, config_text, part.log.made))
        return list(topic.partitions)

    def configure(self, part: Partition, config: TopicConfig) -> None:
        """The partition's config from now on (its log's and durability too): the one write of a served partition's
        config, so the compacted set follows it."""
        part.reconfigure(config)
        self._note_policy(part.tp, config)

    def _note_policy(self, tp: TopicPartition, config: TopicConfig) -> None:
        if config.log_cleanup_policy == "cleanup":
            self._compacted.add(tp)
        else:
            self._compacted.discard(tp)

    def compacted(self) -> list[Partition]:
        """The partitions whose config compacts them (led here or not)."""
        return [part for tp in list(self._compacted) if (part := self.get(*tp)) is not None]

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

        def on_seal(segment: SealedSegment) -> None:
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

    def _partition(self, topic: str, partition: int, plog: PartitionLog, config: TopicConfig,
                   tier: Tier) -> Partition:
        part = Partition(topic, partition, plog, config, tier.lower_tier)
        self._note_policy(part.tp, config)
        return part

    def create_topic(self, name: str, partitions: int, config_text: str, tier: Tier) -> Topic:
        """Creates the topic's directories atomically and opens it. Raises on a bad name, config or an existing topic.
        With a tier below, only the last partition's directory is made now (the module's docstring)."""
        topic_dirs.validate_topic_name(name)
        self.topic_config(config_text)  # refuse a bad config before anything is written
        on_demand = tier.lower_tier
        topic_dirs.create_topic_dir(str(self.data_dir), name, partitions, config_text, on_demand=on_demand)
        # Its partition directories were just made, empty (or are made at their first write), and hold no config file
        # of their own: each log is opened as new (no recovery pass, no second mkdir, no config file to look for),
        # with one random generator.
        config = self.topic_config(config_text)
        rng = random.Random()
        topic = Topic(name, config_text, config)
        topic.partitions = [self._new_partition(name, p, config, tier, rng, made=not on_demand or p == partitions - 1)
                            for p in range(partitions)]
        self.topics[name] = topic
        return topic

    def _new_partition(self, topic: str, partition: int, config: TopicConfig, tier: Tier, rng: random.Random, *,
                       made: bool) -> Partition:
        """A partition with an empty log, its directory made (and empty) or not made yet."""
        plog = PartitionLog.open_new(os.path.join(self.data_dir, topic, str(partition)), config, rng=rng,
                                     now_s=self.now_s, made=made,
                                     **self._tier_callbacks(TopicPartition(topic, partition), tier))
        return self._partition(topic, partition, plog, config, tier)

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
