"""Topic and partition configuration: TANK's `key=value` files (docs/protocol.md §12) plus our own keys.

File format (TANK `parse_partition_config()`):

    # comment                  everything after '#' on a line is ignored
    log.segment.bytes = 1gb    one key=value per line; whitespace around both is trimmed
                               keys are case-insensitive; a value is 1..128 characters

Layers: built-in defaults < `<topic>/config` < `<topic>/<p>/config`. A layer is the dict that
`parse_config_text` returns; `TopicConfig.from_layers` applies them in order and validates every value.
Unknown keys are kept as warnings (TANK prints them and carries on).

Sizes are 1024-based terms (`1g`, `512kb`, `1gb+512mb`); durations are seconds-based terms (`1h+30min`,
`2d,12h`). As in TANK, `month` means 365 days and `m` is not a duration unit (`5m` is refused).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from tiered.protocol.codes import UINT64_MAX

MAX_VALUE_CHARS = 128
U32_MAX = (1 << 32) - 1

_KIB = 1024
SIZE_UNITS: dict[str, int] = {}
for _names, _scale in (
    (("t", "tb", "tbs", "tib", "terabyte", "terabytes"), _KIB**4),
    (("g", "gb", "gbs", "gib", "gibabyte", "gigabyte", "gigabytes"), _KIB**3),
    (("m", "mb", "mbs", "mib", "megabyte", "megabytes"), _KIB**2),
    (("k", "kb", "kbs", "kib", "kilobyte", "kilobytes"), _KIB),
    (("", "b", "byte", "bytes"), 1),
):
    for _name in _names:
        SIZE_UNITS[_name] = _scale

_DAY = 86400
DURATION_UNITS: dict[str, int] = {}
for _words, _seconds in (
    (("w", "week", "weeks"), 7 * _DAY),
    (("y", "year", "years"), 365 * _DAY),
    (("mon", "month", "months"), 365 * _DAY),  # TANK's bug, kept: a "month" is a year
    (("d", "day", "days"), _DAY),
    (("h", "hour", "hours"), 3600),
    (("min", "mins", "minute", "minutes"), 60),
    (("", "s", "sec", "secs", "second", "seconds"), 1),
):
    for _name in _words:
        DURATION_UNITS[_name] = _seconds

# A value is one or more `<digits><unit>` terms, optionally separated by one ',' or '+'.
_TERM = re.compile(r"(\d+)([a-z]*)([,+]?)")


class ConfigError(ValueError):
    """A config line or value that TANK would refuse. Names the key and the value."""

    def __init__(self, key: str, value: str, why: str):
        self.key = key
        self.value = value
        self.why = why
        super().__init__(f"invalid value {value!r} for {key!r}: {why}")


def _parse_terms(text: str, units: dict[str, int], what: str) -> int:
    value = text.strip().lower()
    if not value:
        raise ValueError(f"empty {what}")
    total = 0
    position = 0
    while position < len(value):
        match = _TERM.match(value, position)
        if match is None:
            raise ValueError(f"cannot parse {what} {text!r} at character {position}")
        digits, unit, separator = match.groups()
        if unit not in units:
            raise ValueError(f"unknown {what} unit {unit!r} in {text!r}")
        total += int(digits) * units[unit]
        position = match.end()
        if separator and position == len(value):
            raise ValueError(f"{what} {text!r} ends with a separator")
    return total


def parse_size(text: str) -> int:
    """`1gb`, `512k`, `1g+512mb`, `100` (bytes) -> bytes, 1024-based."""
    size = _parse_terms(text, SIZE_UNITS, "size")
    if size > UINT64_MAX:
        raise ValueError(f"size {text!r} does not fit in 64 bits")
    return size


def parse_duration(text: str) -> int:
    """`1h+30min`, `2d,12h`, `1w`, `90` (seconds) -> seconds. `5m` is invalid, as in TANK."""
    secs = _parse_terms(text, DURATION_UNITS, "duration")
    if secs > U32_MAX:
        raise ValueError(f"duration {text!r} does not fit in 32 bits of seconds")
    return secs


def _parse_uint(text: str, limit: int = U32_MAX) -> int:
    if not text.isdigit():
        raise ValueError("not an unsigned integer")
    value = int(text)
    if value > limit:
        raise ValueError(f"larger than {limit}")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise ValueError("expected true or false")


def parse_config_text(text: str) -> tuple[dict[str, str], list[str]]:
    """One config file -> ({lowercased key: value}, warnings). A line without a value raises ConfigError.

    Values are not interpreted here (TopicConfig.from_layers does that); unknown keys are kept in the dict and
    named in the warnings, so the caller can print them as TANK does.
    """
    values: dict[str, str] = {}
    warnings: list[str] = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, value = line.partition("=")
        key = key.strip().lower()
        value = value.strip()
        if not 1 <= len(value) <= MAX_VALUE_CHARS:
            raise ConfigError(key, value, f"line {number}: a value must be 1..{MAX_VALUE_CHARS} characters")
        if not key:
            raise ConfigError(key, value, f"line {number}: missing key")
        if key not in KEYS:
            warnings.append(f"line {number}: unknown configuration key {key!r} ignored")
        values[key] = value
    return values, warnings


CLEANUP_POLICIES = ("delete", "cleanup")
PRODUCE_ACKS = ("durable", "local")


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Effective settings of one partition. Field names are the keys with dots as underscores."""

    retention_segments_count: int = 0  # max sealed segments kept; 0 = no limit, else >= 2
    log_retention_bytes: int = 0  # max total sealed bytes; 0 = no limit, else >= 128
    log_retention_secs: int = 0  # sealed segment deleted once freeze_ts + this < now; 0 = forever
    log_segment_bytes: int = 1024**3  # roll when the active segment is larger than this (>= 64)
    log_index_interval_bytes: int = 4096  # index sparsity (>= 128)
    log_index_size_max_bytes: int = 10 * 1024**2  # roll when the index is larger than this (>= 128)
    log_roll_jitter_secs: int = 0  # if set, the roll age is max(rand(0..v), 3600) seconds
    log_roll_secs: int = 604800  # parsed and kept, never used: TANK's roll age is 1 week without jitter
    log_cleanup_policy: str = "delete"  # delete | cleanup
    log_cleaner_min_cleanable_ratio: float = 0.5
    log_cleaner_delete_retention_secs: int = 86400  # a tombstone outlives its first compaction by this long
    flush_messages: int = 0  # fdatasync after this many messages; 0 = never
    flush_secs: int = 0  # fdatasync when this many seconds passed since the last one; 0 = never
    produce_ack: str = "durable"  # durable: ack after the block commit; local: ack after the local append
    remote_retention_secs: int = 0  # remote segments expire after this long; 0 = forever
    remote_retention_bytes: int = 0  # max total remote bytes per partition; 0 = unlimited
    remote_copy: bool = True  # copy sealed segments to the object store

    @classmethod
    def from_layers(cls, *layers: dict[str, str]) -> TopicConfig:
        """Defaults overridden by each layer in turn (later wins). Unknown keys are skipped."""
        merged: dict[str, str] = {}
        for layer in layers:
            for key, value in layer.items():
                merged[key.strip().lower()] = value
        # Each value has its field's type (KEYS pairs every key with its field's parser), which a dict type cannot
        # say key by key: hence Any, for the keyword arguments below.
        settings: dict[str, Any] = {}
        for key, value in merged.items():
            parser = KEYS.get(key)
            if parser is None:
                continue
            try:
                settings[_field(key)] = parser(value.strip())
            except ValueError as exc:
                raise ConfigError(key, value, str(exc)) from None
        return cls(**settings)

    def to_text(self, *, only_changed: bool = True) -> str:
        """The settings as a config file that from_layers reads back to an equal TopicConfig."""
        default = TopicConfig()
        lines = []
        for f in fields(self):
            value = getattr(self, f.name)
            if only_changed and value == getattr(default, f.name):
                continue
            if isinstance(value, bool):
                value = "true" if value else "false"
            lines.append(f"{f.name.replace('_', '.')}={value}\n")
        return "".join(lines)

    def as_dict(self) -> dict[str, int | float | str]:
        return asdict(self)


def _field(key: str) -> str:
    return key.replace(".", "_")


def _min_or_zero(parse: Callable[[str], int], minimum: int) -> Callable[[str], int]:
    def check(text: str) -> int:
        value = parse(text)
        if value and value < minimum:
            raise ValueError(f"must be 0 or at least {minimum}")
        return value

    return check


def _at_least(parse: Callable[[str], int], minimum: int) -> Callable[[str], int]:
    def check(text: str) -> int:
        value = parse(text)
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return check


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(text: str) -> str:
        lowered = text.lower()
        if lowered not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return lowered

    return check


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be between 0 and 1")
    return value


# key -> parser(value) -> typed value (raises ValueError). Limits are TANK's (service.cpp).
KEYS: dict[str, Callable[[str], int | float | str]] = {
    "retention.segments.count": _min_or_zero(_parse_uint, 2),
    "log.retention.bytes": _min_or_zero(parse_size, 128),
    "log.retention.secs": parse_duration,
    "log.segment.bytes": _at_least(parse_size, 64),
    "log.index.interval.bytes": _at_least(parse_size, 128),
    "log.index.size.max.bytes": _at_least(parse_size, 128),
    "log.roll.jitter.secs": parse_duration,
    "log.roll.secs": parse_duration,
    "log.cleanup.policy": _one_of(CLEANUP_POLICIES),
    "log.cleaner.min.cleanable.ratio": _ratio,
    "log.cleaner.delete.retention.secs": parse_duration,
    "flush.messages": _parse_uint,
    "flush.secs": parse_duration,
    "produce.ack": _one_of(PRODUCE_ACKS),
    "remote.retention.secs": parse_duration,
    "remote.retention.bytes": parse_size,
    "remote.copy": _parse_bool,
}

assert {_field(k) for k in KEYS} == {f.name for f in fields(TopicConfig)}
