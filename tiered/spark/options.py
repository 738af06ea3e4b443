"""The options of `spark.read.format("tiered")` (and of `tiered replay`), parsed and checked once. Pure.

    catalog             catalog URL, as the broker's (sqlite:///path, postgresql+psycopg://u@h/db) required
    store               object store URL, as the broker's (s3://bucket/prefix, file:///dir)         required
    topic               the topic to read                                                           required
    partitions          comma-separated partition numbers (default: every partition)
    startingSeq         first seq to read, inclusive (default: the first available)
    endingSeq           last seq to read, inclusive (default: the high-water mark when planned)
    startingTimestamp   keep messages with timestamp >= this, inclusive
    endingTimestamp     keep messages with timestamp < this, exclusive
                        timestamps: milliseconds since the epoch, or ISO-8601 (a time without offset is UTC)
    maxSplitBytes       most bytes one task reads (default 128MiB); segments and runs are packed into tasks up to it,
                        bigger segments split at index entries
    s3PathStyle         path-style S3 addressing (MinIO, moto); default TIERED_S3_PATH_STYLE, else virtual-hosted
    filterPushdown      true: accept Spark's pushed filters on partition, seq and timestamp (needs the session conf
                        spark.sql.python.filterPushdown.enabled=true, which is off by default)

S3 endpoint, region and credentials come from the environment of each process, as the AWS SDKs read them
(AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID..., profiles, IRSA).
Option names are matched case-insensitively, as Spark does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from tiered.config import SettingsError, parse_bool, parse_size
from tiered.spark.planning import DEFAULT_MAX_SPLIT_BYTES, MIN_SPLIT_BYTES, U64_MAX, SeqRange, TimeRange

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)
_ONE_US = timedelta(microseconds=1)
KNOWN = (
    "catalog", "store", "topic", "partitions", "startingSeq", "endingSeq", "startingTimestamp", "endingTimestamp",
    "maxSplitBytes", "s3PathStyle", "filterPushdown",
)  # fmt: skip
_KNOWN_LOWER = {name.lower(): name for name in KNOWN}
_INTEGER = re.compile(r"[+-]?\d+")


class OptionError(ValueError):
    """An option that cannot be used, named."""


@dataclass(frozen=True)
class ReadOptions:
    catalog_url: str
    store_url: str
    topic: str
    partitions: frozenset[int] | None = None  # None: every partition
    seqs: SeqRange = SeqRange()
    times: TimeRange = TimeRange()
    max_split_bytes: int = DEFAULT_MAX_SPLIT_BYTES
    s3_path_style: bool | None = None
    filter_pushdown: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        values: dict[str, str] = {}
        for name, value in options.items():
            known = _KNOWN_LOWER.get(name.lower())
            if known is None:
                raise OptionError(f"unknown option {name!r} (known: {', '.join(KNOWN)})")
            if value is not None:
                values[known] = str(value)
        missing = [name for name in ("catalog", "store", "topic") if not values.get(name, "").strip()]
        if missing:
            raise OptionError(f"option{'s' if len(missing) > 1 else ''} {', '.join(missing)} required")
        first = _seq(values, "startingSeq")
        last = _seq(values, "endingSeq")
        seqs = SeqRange(first if first is not None else 1, last if last is not None else U64_MAX)
        start_ms = _timestamp_ms(values, "startingTimestamp")
        end_ms = _timestamp_ms(values, "endingTimestamp")
        times = TimeRange(start_ms * 1000 if start_ms is not None else 0, end_ms * 1000 if end_ms is not None else None)
        max_split = _size(values.get("maxSplitBytes"))
        return cls(
            catalog_url=values["catalog"].strip(),
            store_url=values["store"].strip(),
            topic=values["topic"].strip(),
            partitions=_partitions(values.get("partitions")),
            seqs=seqs,
            times=times,
            max_split_bytes=max_split,
            s3_path_style=_bool(values, "s3PathStyle"),
            filter_pushdown=bool(_bool(values, "filterPushdown")),
        )


def _seq(values: Mapping[str, str], name: str) -> int | None:
    text = values.get(name, "").strip()
    if not text:
        return None
    if not _INTEGER.fullmatch(text) or not 1 <= int(text) <= U64_MAX:
        raise OptionError(f"{name} must be a seq (1..2^64-1), not {text!r}")
    return int(text)


def _partitions(text: str | None) -> frozenset[int] | None:
    if text is None or not text.strip():
        return None
    numbers = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) > 0xFFFF:
            raise OptionError(f"partitions must be comma-separated partition numbers, not {text!r}")
        numbers.add(int(part))
    return frozenset(numbers)


def parse_timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch from an integer, or from ISO-8601 (a time without an offset is UTC)."""
    text = text.strip()
    if _INTEGER.fullmatch(text):
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise OptionError(f"not a timestamp (milliseconds since the epoch, or ISO-8601): {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (moment - EPOCH) // _ONE_MS


def datetime_to_us(moment: datetime) -> int:
    """Microseconds since the epoch of a Spark timestamp value (aware; a naive one is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (moment - EPOCH) // _ONE_US


def _timestamp_ms(values: Mapping[str, str], name: str) -> int | None:
    text = values.get(name, "").strip()
    if not text:
        return None
    try:
        ms = parse_timestamp_ms(text)
    except OptionError as exc:
        raise OptionError(f"{name}: {exc}") from None
    if ms < 0:
        raise OptionError(f"{name} is before the epoch: {text!r}")
    return ms


def _size(text: str | None) -> int:
    if text is None or not text.strip():
        return DEFAULT_MAX_SPLIT_BYTES
    try:
        size = parse_size(text.strip())
    except SettingsError as exc:
        raise OptionError(f"maxSplitBytes: {exc}") from None
    if size < MIN_SPLIT_BYTES:
        raise OptionError(f"maxSplitBytes must be at least {MIN_SPLIT_BYTES} bytes, not {text!r}")
    return size


def _bool(values: Mapping[str, str], name: str) -> bool | None:
    text = values.get(name, "").strip()
    if not text:
        return None
    try:
        return parse_bool(text)
    except SettingsError as exc:
        raise OptionError(f"{name}: {exc}") from None
