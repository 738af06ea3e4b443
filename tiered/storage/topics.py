"""The data directory: one directory per topic, one per partition (docs/protocol.md §3.7, §7).

    <base>/<topic>/config          topic-level overrides (written by CreateTopic when non-empty)
    <base>/<topic>/<p>/            partitions 0..N-1, contiguous
    <base>/<topic>/<p>/config      partition-level overrides (read at open and by ReloadConf)
    <base>/.<topic>/               a topic being created; renamed into place when complete

A broker with a catalog below makes a partition's directory when the partition's log first writes a file
(tiered.server.registry), not at the topic's creation: a topic is then created with its last partition's directory
only, so that the disk alone still tells the partition count as TANK's scan reads it (the highest directory + 1),
and a partition below it without a directory is one never written here (`TopicDir.absent`), whose log is empty.

Topic names follow TANK's rule (tiered.topic_rules, shared with the client), which keeps every topic path inside
the data directory. Other entries starting with '.' (our `.tiered` state directory, TANK's `.cleanup.log`, ...)
are ignored. Because `.tiered` is ours, a topic cannot be named `tiered`: its staging directory would be that one.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

from tiered.storage.names import PARTITION_CONFIG
from tiered.storage.segment import fsync_dir
from tiered.storage.topic_config import ConfigError, TopicConfig, parse_config_text
# Re-exported ("name as name"): the broker names them through this module.
from tiered.topic_rules import (
    MAX_PARTITIONS as MAX_PARTITIONS,
    MAX_TOPIC_NAME as MAX_TOPIC_NAME,
    RESERVED_TOPIC_NAMES as RESERVED_TOPIC_NAMES,
    STATE_DIRS as STATE_DIRS,
    TOPIC_NAME_PATTERN as TOPIC_NAME_PATTERN,
    InvalidTopicName as InvalidTopicName,
    is_valid_topic_name as is_valid_topic_name,
    validate_new_topic_name as validate_new_topic_name,
    validate_partition_count as validate_partition_count,
    validate_topic_name as validate_topic_name,
)

log = logging.getLogger("tiered.storage")

TOPIC_CONFIG = "config"


class TopicDirExists(FileExistsError):
    pass


class TopicDirError(OSError):
    """The data directory is not in a state where the operation can proceed safely."""


@dataclass(frozen=True, slots=True)
class TopicDir:
    name: str
    partitions: int
    config_text: str  # "" when the topic has no config file
    # Partitions below the highest found that have no directory (none, or a file in its place): each is the
    # registry's to treat as a partition that cannot be opened, never a reason to leave the whole topic out.
    missing: tuple[int, ...] = ()
    # Those of `missing` with nothing at all in their place: on a disk whose directories are made when a partition's
    # log first writes (scan_report's `on_demand`), partitions never written here, not damage.
    absent: tuple[int, ...] = ()


def topic_path(base: str, name: str) -> str:
    return os.path.join(base, validate_topic_name(name))


def _write_synced(path: str, data: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def create_topic_dir(base: str, name: str, partitions: int, config_text: str = "", *, on_demand: bool = False) -> str:
    """Creates `<base>/<name>/` atomically (built as `.<name>`, fsynced, renamed). Returns its path. With
    `on_demand`, only the last partition's directory is made (the module's docstring): the others at their first write.

    Raises InvalidTopicName, ValueError (partition count), ConfigError (the config would not load),
    TopicDirExists, or TopicDirError when a stray `.<name>` from an interrupted creation is in the way.
    """
    validate_new_topic_name(name)
    validate_partition_count(partitions)
    values, _warnings = parse_config_text(config_text)
    TopicConfig.from_layers(values)
    final = os.path.join(base, name)
    staging = os.path.join(base, "." + name)
    if os.path.lexists(final):
        raise TopicDirExists(f"topic {name!r} already exists")
    try:
        os.mkdir(staging, 0o755)
    except FileExistsError:
        # Left by a creation that a crash interrupted (a kill -9 while a broker laid the topic out): removed when it
        # holds only what a creation writes before its rename (empty partition directories, the config file), which
        # no reader has ever seen; anything else is an operator's to look at.
        if not _only_a_creation_left(staging):
            raise TopicDirError(f"{staging} is left from an interrupted creation and holds more than a creation "
                                f"writes; remove it to create {name!r}") from None
        log.warning("removing %s, left by an interrupted creation of topic %r", staging, name)
        shutil.rmtree(staging)
        os.mkdir(staging, 0o755)
    for p in range(partitions - 1 if on_demand else 0, partitions):
        os.mkdir(os.path.join(staging, str(p)), 0o755)
    if config_text.strip():
        _write_synced(os.path.join(staging, TOPIC_CONFIG), config_text)
    # One fsync of the staging directory makes its entries durable, the partitions' empty directories with them:
    # a directory is created whole by its mkdir, which the filesystem's journal (ext4, XFS) commits, in order,
    # no later than this fsync. A sync per partition directory cost a flush each: 4,096 of them for a topic of
    # 4,096 partitions, seconds on a disk that honours them.
    fsync_dir(staging)
    if os.path.lexists(final):  # created meanwhile by someone else: leave both for an operator to compare
        raise TopicDirExists(f"topic {name!r} already exists")
    os.rename(staging, final)
    fsync_dir(base)
    return final


def _only_a_creation_left(staging: str) -> bool:
    """Whether `staging` holds nothing but what create_topic_dir writes before its rename: empty partition
    directories and the topic's config file."""
    try:
        for entry in os.scandir(staging):
            if entry.name == TOPIC_CONFIG and entry.is_file(follow_symlinks=False):
                continue
            if not (entry.name.isdigit() and entry.is_dir(follow_symlinks=False) and not os.listdir(entry.path)):
                return False
    except OSError:
        return False
    return True


def write_topic_config(base: str, name: str, config_text: str) -> None:
    """Replaces `<base>/<name>/config` atomically (written aside, fsynced, renamed; removed when the text is empty),
    so that a restart opens the topic with the configuration the catalog gave it last."""
    path = os.path.join(topic_path(base, name), TOPIC_CONFIG)
    if not config_text.strip():
        if os.path.lexists(path):
            os.remove(path)
            fsync_dir(os.path.dirname(path))
        return
    staging = path + ".new"
    _write_synced(staging, config_text)
    os.replace(staging, path)
    fsync_dir(os.path.dirname(path))


def scan_report(base: str, *, on_demand: bool = False) -> tuple[list[TopicDir], list[str]]:
    """The topics under `base` (sorted by name) and the problems found, each a sentence naming the path. With
    `on_demand` (partition directories made at their first write), a partition with nothing in its place is not one."""
    topics: list[TopicDir] = []
    problems: list[str] = []
    for entry in sorted(os.listdir(base)):
        path = os.path.join(base, entry)
        if entry.startswith("."):
            if entry not in STATE_DIRS and os.path.isdir(path) and is_valid_topic_name(entry[1:]):
                problems.append(f"{path}: stray directory of an interrupted topic creation (left alone)")
            continue
        if not os.path.isdir(path):
            problems.append(f"{path}: not a directory, ignored")
            continue
        if not is_valid_topic_name(entry):
            problems.append(f"{path}: not a valid topic name, ignored")
            continue
        try:
            topic, topic_problems = _scan_topic(path, entry, on_demand)
        except OSError as exc:  # its directory cannot be listed (permissions, an I/O error): the others are served
            problems.append(f"{path}: cannot be read ({exc.strerror or exc}), topic not loaded")
            continue
        problems.extend(topic_problems)
        if topic is not None:
            topics.append(topic)
    return topics, problems


def scan(base: str, *, on_demand: bool = False) -> list[TopicDir]:
    """The topics under `base`; problems are logged as warnings (nothing is deleted)."""
    topics, problems = scan_report(base, on_demand=on_demand)
    for problem in problems:
        log.warning("%s", problem)
    return topics


def _scan_topic(path: str, name: str, on_demand: bool) -> tuple[TopicDir | None, list[str]]:
    problems = []
    ids = []
    named = []  # partition names that are not directories
    config_text = ""
    for entry in os.listdir(path):
        entry_path = os.path.join(path, entry)
        if entry == TOPIC_CONFIG and os.path.isfile(entry_path):
            with open(entry_path, encoding="utf-8") as f:
                config_text = f.read()
        elif entry.isdigit() and str(int(entry)) == entry and int(entry) < MAX_PARTITIONS:
            if os.path.isdir(entry_path):
                ids.append(int(entry))
            else:
                named.append(int(entry))
                problems.append(f"{entry_path}: not a directory, where partition {entry}'s should be")
        else:
            problems.append(f"{entry_path}: not a partition directory or topic config, ignored")
    ids.sort()
    if not ids:
        problems.append(f"{path}: topic without partition directories, not loaded")
        return None, problems
    count = max(ids + named) + 1
    missing = tuple(sorted(set(range(count)) - set(ids)))
    absent = tuple(sorted(set(missing) - set(named)))
    damaged = sorted(set(named)) if on_demand else list(missing)
    if damaged:
        problems.append(f"{path}: partitions {damaged} have no directory (found {ids}): the others are served")
    return TopicDir(name, count, config_text, missing, absent), problems


class PartitionConfigError(Exception):
    """A ReloadConf failure. `kind` and its response code: unknown_topic 0x0b, unknown_partition 0x0a,
    missing 0x02, io 0x02, parse 0x03."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


def read_partition_config(base: str, topic: str, partition: int) -> tuple[dict[str, str], list[str]]:
    """The partition-level config layer (`<base>/<topic>/<p>/config`, not the topic one, as TANK's ReloadConf).

    Returns (values, warnings); the values are checked to load. Raises PartitionConfigError.
    """
    if not is_valid_topic_name(topic) or not os.path.isdir(os.path.join(base, topic)):
        raise PartitionConfigError("unknown_topic", f"unknown topic {topic!r}")
    directory = os.path.join(base, topic, str(partition))
    if partition < 0 or not os.path.isdir(directory):
        raise PartitionConfigError("unknown_partition", f"unknown partition {topic}/{partition}")
    path = os.path.join(directory, PARTITION_CONFIG)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise PartitionConfigError("missing", f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PartitionConfigError("io", f"cannot read {path}: {exc}") from None
    try:
        values, warnings = parse_config_text(text)
        TopicConfig.from_layers(values)
    except ConfigError as exc:
        raise PartitionConfigError("parse", f"{path}: {exc}") from None
    return values, warnings
