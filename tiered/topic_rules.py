"""What a topic may be: its name, its partition count, its config. The checks the broker makes, shared with the
client so that a request the broker would refuse is refused before it is sent, with the reason.

CreateTopic answers one byte (`invalid`, `bad_config`), so the reason would otherwise stay in the broker's log. This
module does no I/O and imports no server code: tiered.client, tiered.cli and the broker (tiered.storage.topics,
the CreateTopic handler) all call these functions.

- Names follow TANK's `is_valid_topic_name()`: 1..64 characters of [A-Za-z0-9_-], not starting or ending with '-'
  or '_'. That also keeps every topic path inside the data directory ('/', '.', '..' are impossible) and every
  name inside the wire's latin-1 str8. `tiered` is reserved: `.tiered` is the broker's own state directory.
- Partition ids are u16 on the wire, but every partition is a directory with open files and a row in every scan:
  a topic has 1..4096 partitions, numbered from 0 (docs/operations.md, "Limits").
- Config keys are TANK's and ours (tiered.storage.topic_config.KEYS); values must parse as there.
"""

from __future__ import annotations

import re

from tiered.storage.topic_config import KEYS, ConfigError, TopicConfig, parse_config_text

MAX_TOPIC_NAME = 64
MAX_PARTITIONS = 4096
MAX_PARTITION_ID = 0xFFFF  # partition ids on the wire
STATE_DIRS = frozenset({".tiered"})  # dot entries of the data directory that are ours (tiered.config's state_dir)
RESERVED_TOPIC_NAMES = frozenset(d[1:] for d in STATE_DIRS)
NAME_RULE = f"1..{MAX_TOPIC_NAME} characters of A-Z a-z 0-9 _ -, not starting or ending with - or _"
# The one spelling of TANK's rule: object keys (tiered.tiering.objects.keys) and block footers match topics with it too.
TOPIC_NAME_PATTERN = r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62}[A-Za-z0-9])?"
_TOPIC_NAME = re.compile(TOPIC_NAME_PATTERN, re.ASCII)


class InvalidTopicName(ValueError):
    pass


class UnknownConfigKey(ConfigError):
    def __init__(self, key: str, value: str):
        ValueError.__init__(self, f"unknown topic config key {key!r}; known keys: {', '.join(sorted(KEYS))}")
        self.key, self.value, self.why = key, value, "unknown key"


def is_valid_topic_name(name: str) -> bool:
    return isinstance(name, str) and _TOPIC_NAME.fullmatch(name) is not None


def validate_topic_name(name: str) -> str:
    if not is_valid_topic_name(name):
        shown = name if len(name) <= 80 else f"{name[:40]}...({len(name)} characters)"
        raise InvalidTopicName(f"invalid topic name {shown!r}: {NAME_RULE}")
    return name


def validate_new_topic_name(name: str) -> str:
    """A name a topic may be created with: valid and not reserved."""
    validate_topic_name(name)
    if name in RESERVED_TOPIC_NAMES:
        raise InvalidTopicName(f"topic name {name!r} is reserved: .{name} is the broker's own directory")
    return name


def validate_partition_count(partitions: int) -> int:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"a topic has 1..{MAX_PARTITIONS} partitions, not {partitions}")
    return partitions


def validate_partition(partition: int) -> int:
    if not 0 <= partition < MAX_PARTITIONS:
        raise ValueError(f"partition {partition} does not exist: partitions are numbered 0..{MAX_PARTITIONS - 1}")
    return partition


def check_config_text(text: str) -> TopicConfig:
    """The config as the broker would load it. Raises ConfigError for a bad line or value and for an unknown key
    (the broker only warns about those, as TANK does; a client that names one has made a typo)."""
    values, _warnings = parse_config_text(text)
    for key, value in values.items():
        if key not in KEYS:
            raise UnknownConfigKey(key, value)
    return TopicConfig.from_layers(values)
