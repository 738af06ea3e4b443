"""The cost meter: every request the object store sends, and its bytes, counted per topic and operation.

Pure bookkeeping, no I/O. The store (store.py) is its only writer: each public call takes an `Attribution` (which
topics the request is for, and in what shares) and every request the backend sends on that call's behalf, retries
included, is counted against it here (`Meter.request`). A request shared by several topics (a block PUT) is split in
proportion to each topic's bytes, so a topic's count is a float and the shares of one request add up to 1.
Catalog-wide work (listings, the reconciler, the catalog rebuild, readiness probes, block deletions: a swept block
no longer knows its runs) is its own row, `CATALOG_WIDE`, which no topic name can be (topic_rules).

Two readers: the metrics families (the running totals, `requests` and `bytes`) and the flush to the catalog's usage
table (`take_pending`: what was counted since the last flush; `restore` puts it back when the flush failed).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tiered.catalog.usage import BYTES_INGESTED, BYTES_READ, BYTES_WRITTEN
from tiered.catalog.usage import CATALOG_WIDE  # the topic label of catalog-wide work; in no topic name
UNATTRIBUTED = "(unattributed)"  # a request sent with no attribution: a bug (tests/tiering/test_meter.py)


class Op(enum.StrEnum):
    """What a request is, as S3 bills it (put-class, get-class or free)."""

    PUT = "put"
    GET = "get"
    HEAD = "head"
    LIST = "list"
    DELETE = "delete"
    COPY = "copy"
    PART = "part"  # one part of a multipart upload
    MULTIPART = "multipart"  # starting, completing or aborting a multipart upload


class Direction(enum.StrEnum):
    WRITTEN = "written"  # through the store: blocks, and the same records again in segment copies
    READ = "read"
    INGESTED = "ingested"  # records committed in blocks: each produced byte once (not a store transfer)


# S3's operation names (botocore's) as the meter's operations.
S3_OPERATIONS: Mapping[str, Op] = {
    "PutObject": Op.PUT,
    "GetObject": Op.GET,
    "HeadObject": Op.HEAD,
    "ListObjectsV2": Op.LIST,
    "ListObjects": Op.LIST,
    "DeleteObject": Op.DELETE,
    "DeleteObjects": Op.DELETE,
    "CopyObject": Op.COPY,
    "UploadPart": Op.PART,
    "UploadPartCopy": Op.PART,
    "CreateMultipartUpload": Op.MULTIPART,
    "CompleteMultipartUpload": Op.MULTIPART,
    "AbortMultipartUpload": Op.MULTIPART,
}


def s3_op(operation: str) -> Op:
    """The meter's operation for a botocore operation name. One we never send falls in S3's price classes: PUT, COPY,
    POST and LIST are billed as PUTs, "GET and all other requests" as GETs."""
    if (op := S3_OPERATIONS.get(operation)) is not None:
        return op
    return Op.PUT if operation.startswith(("Put", "Copy", "Post", "List", "Create", "Complete", "Upload")) else Op.GET


@dataclass(frozen=True, slots=True)
class Attribution:
    """Whom a store call is for: (topic, weight) pairs, weights positive, each topic once. A request counts as
    weight / total weight for each topic, and so do its bytes."""

    shares: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if not self.shares:
            raise ValueError("an attribution names at least one topic")
        if any(weight <= 0 for _, weight in self.shares):
            raise ValueError(f"attribution weights must be positive: {self.shares!r}")
        if len({topic for topic, _ in self.shares}) != len(self.shares):
            raise ValueError(f"a topic twice in an attribution: {self.shares!r}")

    @classmethod
    def topic(cls, topic: str) -> Attribution:
        return cls(((topic, 1.0),))

    @classmethod
    def by_bytes(cls, bytes_per_topic: Mapping[str, int] | Iterable[tuple[str, int]]) -> Attribution:
        """Shares in proportion to bytes (a block's runs); topics with no bytes are left out, and a block of
        nothing but empty runs is its first topic's."""
        items = bytes_per_topic.items() if isinstance(bytes_per_topic, Mapping) else bytes_per_topic
        summed: dict[str, float] = defaultdict(float)
        for topic, size in items:
            summed[topic] += size
        shares = tuple((t, w) for t, w in summed.items() if w > 0)
        if not shares and summed:
            shares = ((next(iter(summed)), 1.0),)
        return cls(shares)

    def split(self, amount: float) -> Iterable[tuple[str, float]]:
        """`amount` shared out: (topic, part), the parts adding up to `amount`."""
        if len(self.shares) == 1:
            yield self.shares[0][0], amount
            return
        total = sum(weight for _, weight in self.shares)
        for topic, weight in self.shares:
            yield topic, amount * weight / total


CATALOG = Attribution.topic(CATALOG_WIDE)
_UNATTRIBUTED = Attribution.topic(UNATTRIBUTED)


@dataclass(frozen=True, slots=True)
class Usage:
    """What was counted over some time: requests per (topic, op), bytes per (topic, direction)."""

    requests: Mapping[tuple[str, str], float]
    bytes: Mapping[tuple[str, str], float]

    def empty(self) -> bool:
        return not self.requests and not self.bytes

    def measures(self) -> dict[tuple[str, str], float]:
        """As the catalog's usage rows measure it (tiered.catalog.usage): (topic, op) request counts and
        (topic, bytes_written | bytes_read) byte counts."""
        out = {(topic, str(op)): n for (topic, op), n in self.requests.items()}
        names = {Direction.WRITTEN: BYTES_WRITTEN, Direction.READ: BYTES_READ, Direction.INGESTED: BYTES_INGESTED}
        for (topic, direction), n in self.bytes.items():
            out[topic, names[Direction(direction)]] = n
        return out


class Meter:
    """Running totals since the process started, and what the next flush should add to the catalog."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], float] = defaultdict(float)
        self.bytes: dict[tuple[str, str], float] = defaultdict(float)
        self._pending_requests: dict[tuple[str, str], float] = defaultdict(float)
        self._pending_bytes: dict[tuple[str, str], float] = defaultdict(float)

    def request(self, attribution: Attribution | None, op: Op, count: float = 1.0) -> None:
        for topic, part in (attribution or _UNATTRIBUTED).split(count):
            self.requests[topic, op] += part
            self._pending_requests[topic, op] += part

    def transferred(self, attribution: Attribution | None, direction: Direction, size_bytes: int) -> None:
        if size_bytes <= 0:
            return
        for topic, part in (attribution or _UNATTRIBUTED).split(float(size_bytes)):
            self.bytes[topic, direction] += part
            self._pending_bytes[topic, direction] += part

    def take_pending(self) -> Usage:
        usage = Usage(dict(self._pending_requests), dict(self._pending_bytes))
        self._pending_requests.clear()
        self._pending_bytes.clear()
        return usage

    def restore(self, usage: Usage) -> None:
        """Puts back what a failed flush took, to go with the next one."""
        for key, value in usage.requests.items():
            self._pending_requests[key] += value
        for key, value in usage.bytes.items():
            self._pending_bytes[key] += value

    def topics(self) -> set[str]:
        return {topic for topic, _ in self.requests} | {topic for topic, _ in self.bytes}
