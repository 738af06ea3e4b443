"""Every object key format, and only here (docs/architecture.md "Objects").

Keys are relative to the object store's own prefix (`s3://bucket/<prefix>/`, or the local store's directory): the
store adds it, so nothing outside `tiering/` ever sees or builds a full key.

    blocks/<hash4>/<broker_id>/<block_id>.blk
        hash4     4 lowercase hex digits: the first 2 bytes of sha256("<broker_id>/<block_id>"). S3 partitions its
                  request rate by key prefix; blocks are written every 250 ms by every broker, so their keys start
                  with hashed entropy instead of a time or a broker id.
        broker_id decimal, no leading zeros.
        block_id  a ULID: 26 Crockford base32 characters, 48 bits of milliseconds since the epoch then 80 random
                  bits. Lexicographic order is creation order (per process, strictly: see new_block_id).

    segments/<topic>/<partition>/<base:020d>-<last:020d>_<freeze_ts>.ilog
    segments/<topic>/<partition>/<base:020d>-<last:020d>_<freeze_ts>.index
        A remote segment and its index side by side. `topic` follows TANK's rule (1..64 of [A-Za-z0-9_-], not
        starting or ending with - or _), `partition` is decimal, `base` and `last` are zero-padded to 20 digits
        (u64 max has 20) so that a listing of one partition comes back in seq order, and `freeze_ts` is TANK's
        freeze time in seconds, as in its `.ilog` file name. A partition's objects are listable under
        partition_segments_prefix(); TANK's tools can read the objects as they are.

    starts/<topic>/<partition>
        The partition's first available seq, as decimal text, written by remote retention each time it moves it
        (before anything below it is deleted). A catalog rebuilt from the bucket starts each partition there, so
        history that retention expired does not come back from block objects still waiting for their sweep.

    topics/<topic>.json
        What the catalog records of a topic (partition count, config text, creation time), written when the topic
        is created or its config changes (tiered.tiering.objects.topic_objects), so that a catalog rebuild restores
        topics whole, not only what their data implies.

Parsers are strict (they accept exactly what the builders produce) and return None for any other key: the orphan
reconciler lists the whole bucket, which may hold objects that are not ours.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass

from tiered.protocol.codes import UINT64_MAX
from tiered.topic_rules import TOPIC_NAME_PATTERN, is_valid_topic_name
from tiered.topic_partition import TopicPartition

BLOCKS_PREFIX = "blocks/"
SEGMENTS_PREFIX = "segments/"
STARTS_PREFIX = "starts/"
BLOCK_SUFFIX = ".blk"
SEGMENT_SUFFIX = ".ilog"
SEGMENT_INDEX_SUFFIX = ".index"
TOPICS_PREFIX = "topics/"
TOPIC_SUFFIX = ".json"

MAX_PARTITION = 0xFFFF
_MAX_ULID_MS = (1 << 48) - 1
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CROCKFORD_VALUE = {c: i for i, c in enumerate(_CROCKFORD)}

_TOPIC = TOPIC_NAME_PATTERN
_DECIMAL = r"0|[1-9][0-9]*"
_ULID_RE = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_START_KEY_RE = re.compile(rf"starts/(?P<topic>{_TOPIC})/(?P<partition>{_DECIMAL})")
_TOPIC_KEY_RE = re.compile(rf"topics/(?P<topic>{_TOPIC})\.json")
_BLOCK_KEY_RE = re.compile(rf"blocks/(?P<hash>[0-9a-f]{{4}})/(?P<broker>{_DECIMAL})/(?P<id>[0-9A-Z]{{26}})\.blk")
_SEGMENT_KEY_RE = re.compile(
    rf"segments/(?P<topic>{_TOPIC})/(?P<partition>{_DECIMAL})/"
    rf"(?P<base>[0-9]{{20}})-(?P<last>[0-9]{{20}})_(?P<freeze>{_DECIMAL})(?P<suffix>\.ilog|\.index)"
)


@dataclass(frozen=True, slots=True)
class BlockKey:
    broker_id: int
    block_id: str

    @property
    def created_ms(self) -> int:
        return block_id_time_ms(self.block_id)


@dataclass(frozen=True, slots=True)
class SegmentKey:
    topic: str
    partition: int
    base: int
    last: int
    freeze_ts: int  # seconds, as in TANK's `.ilog` name

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


# --- blocks -------------------------------------------------------------------------------------------------------


def blocks_prefix() -> str:
    return BLOCKS_PREFIX


def block_key(broker_id: int, block_id: str) -> str:
    _check_broker_id(broker_id)
    if not _ULID_RE.fullmatch(block_id):
        raise ValueError(f"not a block id (ULID): {block_id!r}")
    return f"{BLOCKS_PREFIX}{_block_hash(broker_id, block_id)}/{broker_id}/{block_id}{BLOCK_SUFFIX}"


def parse_block_key(object_key: str) -> BlockKey | None:
    m = _BLOCK_KEY_RE.fullmatch(object_key)
    if m is None or not _ULID_RE.fullmatch(m["id"]):
        return None
    broker_id = int(m["broker"])
    if m["hash"] != _block_hash(broker_id, m["id"]):
        return None
    return BlockKey(broker_id, m["id"])


def _block_hash(broker_id: int, block_id: str) -> str:
    return hashlib.sha256(f"{broker_id}/{block_id}".encode()).hexdigest()[:4]


class BlockIdClock:
    """ULID generation, monotonic within the process.

    Two ids minted in the same millisecond (or after the wall clock stepped back) keep the last time and increment
    the random part, as the ULID spec's monotonic mode does, so ids from one broker sort in creation order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_random = 0

    def next(self, now_ms: int) -> str:
        if not 0 <= now_ms <= _MAX_ULID_MS:
            raise ValueError(f"block id time out of range: {now_ms}")
        with self._lock:
            if now_ms > self._last_ms:
                self._last_ms = now_ms
                # Top bit clear: leaves 2**79 increments before the random part could overflow.
                self._last_random = int.from_bytes(os.urandom(10), "big") >> 1
            else:
                self._last_random += 1
                if self._last_random >= 1 << 80:
                    raise ValueError("block id random part exhausted in one millisecond")
            value = (self._last_ms << 80) | self._last_random
        return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


_block_id_clock = BlockIdClock()


def new_block_id(now_ms: int) -> str:
    """A new ULID: unique, and strictly increasing across calls in this process."""
    return _block_id_clock.next(now_ms)


def block_id_time_ms(block_id: str) -> int:
    if not _ULID_RE.fullmatch(block_id):
        raise ValueError(f"not a block id (ULID): {block_id!r}")
    value = 0
    for c in block_id[:10]:
        value = value << 5 | _CROCKFORD_VALUE[c]
    return value


# --- remote segments ----------------------------------------------------------------------------------------------


def segments_prefix() -> str:
    return SEGMENTS_PREFIX


def topic_segments_prefix(topic: str) -> str:
    _check_topic(topic)
    return f"{SEGMENTS_PREFIX}{topic}/"


def partition_segments_prefix(topic: str, partition: int) -> str:
    _check_partition(partition)
    return f"{topic_segments_prefix(topic)}{partition}/"


def segment_key(topic: str, partition: int, base: int, last: int, freeze_ts: int) -> str:
    return _segment_stem(topic, partition, base, last, freeze_ts) + SEGMENT_SUFFIX


def segment_index_key(topic: str, partition: int, base: int, last: int, freeze_ts: int) -> str:
    return _segment_stem(topic, partition, base, last, freeze_ts) + SEGMENT_INDEX_SUFFIX


def parse_segment_key(object_key: str) -> SegmentKey | None:
    """The remote segment named by an `.ilog` key, or None."""
    return _parse_segment(object_key, SEGMENT_SUFFIX)


def parse_segment_index_key(object_key: str) -> SegmentKey | None:
    """The remote segment whose index an `.index` key names, or None."""
    return _parse_segment(object_key, SEGMENT_INDEX_SUFFIX)


def _segment_stem(topic: str, partition: int, base: int, last: int, freeze_ts: int) -> str:
    if not 0 <= base <= last <= UINT64_MAX:
        raise ValueError(f"bad segment seq range {base}-{last}")
    if freeze_ts < 0:
        raise ValueError(f"negative freeze time: {freeze_ts}")
    return f"{partition_segments_prefix(topic, partition)}{base:020d}-{last:020d}_{freeze_ts}"


def _parse_segment(object_key: str, suffix: str) -> SegmentKey | None:
    m = _SEGMENT_KEY_RE.fullmatch(object_key)
    if m is None or m["suffix"] != suffix:
        return None
    partition, base, last = int(m["partition"]), int(m["base"]), int(m["last"])
    if partition > MAX_PARTITION or not base <= last <= UINT64_MAX:
        return None
    return SegmentKey(m["topic"], partition, base, last, int(m["freeze"]))


def partition_start_key(topic: str, partition: int) -> str:
    _check_topic(topic)
    _check_partition(partition)
    return f"{STARTS_PREFIX}{topic}/{partition}"


def starts_prefix() -> str:
    return STARTS_PREFIX


def parse_partition_start_key(object_key: str) -> TopicPartition | None:
    """The partition of a `starts/` key, or None."""
    m = _START_KEY_RE.fullmatch(object_key)
    if m is None or int(m["partition"]) > MAX_PARTITION:
        return None
    return TopicPartition(m["topic"], int(m["partition"]))


# --- topics ---------------------------------------------------------------------------------------------------------


def topics_prefix() -> str:
    return TOPICS_PREFIX


def topic_key(topic: str) -> str:
    _check_topic(topic)
    return f"{TOPICS_PREFIX}{topic}{TOPIC_SUFFIX}"


def parse_topic_key(object_key: str) -> str | None:
    """The topic a topic object's key names, or None."""
    m = _TOPIC_KEY_RE.fullmatch(object_key)
    return m["topic"] if m else None


def _check_topic(topic: str) -> None:
    if not isinstance(topic, str) or not is_valid_topic_name(topic):
        raise ValueError(f"invalid topic name: {topic!r}")


def _check_partition(partition: int) -> None:
    if not 0 <= partition <= MAX_PARTITION:
        raise ValueError(f"partition out of range: {partition}")


def _check_broker_id(broker_id: int) -> None:
    if isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id < 0:
        raise ValueError(f"invalid broker id: {broker_id!r}")
