"""The seam between the broker (tiered.server) and the tier below its local disk (tiered.tiering).

Two narrow interfaces, wired once when the process is assembled (tiered.server.app):
- `Tier`: what the server asks of a tier. The server calls it on produce (admission, and per request the calls of
  its `produce_calls`), on topic creation, when a segment rolls or may be deleted, for reads its local log cannot
  answer, at start-up (the plan that reconciles the local disk with the catalog) and at shutdown. `LocalOnly` is the
  tier of a plain TANK broker.
- `TierSink`: what a tier reports back: records committed (they become visible), a partition fenced by a newer
  leader, a segment copied, the first available seq moved by retention; and, with several brokers, which partitions
  to lead here (plans to carry out), which are led elsewhere and by whom, and which topics the others created.
  Only the server changes its partitions' state, and only in these callbacks or its own request handlers.
The data passed across is plain and immutable. Neither side imports the other: tiered.tiering implements `Tier`
and calls a `TierSink`; tiered.server implements `TierSink` and calls a `Tier`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, Sequence

from tiered.bounds import PartitionBounds
from tiered.storage.partition_log import AppendResult, PartitionLog, StoredRecord
from tiered.storage.segment import SealedSegment
from tiered.storage.topic_config import TopicConfig
from tiered.topic_partition import TopicPartition


class AckOutcome(Enum):
    """How a durable produce ends (what its future resolves to; the server answers each with its own code)."""

    COMMITTED = "committed"  # in the bucket and the catalog: answered OK
    NOT_CONFIRMED = "not confirmed"  # its block still retries past the deadline: it may yet be committed
    REFUSED = "refused"  # it will never be committed (the partition was fenced first): safe to send again


class AckDeadline:
    """Until when this broker may acknowledge a produce: `until`, in seconds of the broker's clock's `monotonic` (the
    one clock the process is built with: tiered.server.app). A request may be acknowledged only if its own clock read
    is below it (`allows`); the produce handler compares with `until` itself, one attribute read per request, no call.

    One owner writes `until` (the cluster coordinator: a renewal moves it forward, a lapsed lease, a broker id taken
    over or the lease ended clears it to -inf, tiered.tiering.cluster.cluster_decision.ack_deadline); everyone else
    reads it. A tier without a lease (LocalOnly) holds +inf; a tier that has not joined the service yet, -inf."""

    __slots__ = ("until",)

    def __init__(self, until: float = float("-inf")):
        self.until = until

    def allows(self, now: float) -> bool:
        return now < self.until


@dataclass(frozen=True, slots=True)
class ProduceCalls:
    """What the produce path asks of the tier per request and per record (tiered.server.produce): the ack deadline
    it compares its clock read with, and the calls, each bound to the object that answers it, so each costs one
    Python call (the same answers as the Tier's methods of those names). The tier owns it: it builds a new one (never
    changes one) when an answering object changes (TieringService: start, join), and the produce handler reads
    `tier.produce_calls` once per request."""

    ack_deadline: AckDeadline  # may_acknowledge() is ack_deadline.allows(clock.monotonic())
    admits_now: Callable[[], bool]
    appended: Callable[[TopicPartition, AppendResult, bool], asyncio.Future[AckOutcome] | None]


@dataclass(frozen=True, slots=True)
class LocalPartition:
    """What the local disk holds of one partition, for the start-up plan."""

    topic: str
    partition: int
    first: int  # first seq on disk, 0: none
    last_held: int  # last seq of the newest record on disk, 0: none
    applied_epoch: int | None  # the last epoch whose plan this disk carried out (tiered.storage.local_state)


@dataclass(frozen=True, slots=True)
class LocalTopic:
    name: str
    config_text: str
    partitions: tuple[LocalPartition, ...]


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """How one partition is served from now on (tiered.tiering.cluster.startup.plan_partition).

    truncate_after  drop local records past this seq first (None: keep them all)
    next_seq        the next plain append gets at least this seq (the catalog's high-water mark + 1)
    reupload_after  upload the local records past this seq before they are visible (None: nothing to upload)
    """

    topic: str
    partition: int
    epoch: int
    committed: int  # the catalog's high-water mark
    first_available: int  # the catalog's first available seq (0: the catalog holds nothing yet)
    highest_copied_seq: int  # the highest seq in a readable remote segment (0: none)
    truncate_after: int | None
    next_seq: int
    reupload_after: int | None
    reason: str  # one line for the log: why this plan


@dataclass(frozen=True, slots=True)
class NewLocalTopic:
    """A topic the catalog has and this disk does not (a new, empty volume): created locally before serving."""

    name: str
    partitions: int
    config_text: str


@dataclass
class OpenPlan:
    create: list[NewLocalTopic] = field(default_factory=list)
    partitions: list[PartitionPlan] = field(default_factory=list)
    not_served: dict[str, str] = field(default_factory=dict)  # topic -> why it is not served here


@dataclass(frozen=True, slots=True)
class Leader:
    """The broker leading a partition elsewhere: where TANK's redirect (0xfc) sends its clients."""

    broker_id: int
    endpoint: str  # "a.b.c.d:port", its advertised TANK endpoint (TLS when TLS is on)
    # "a.b.c.d:port" at which plaintext clients reach it (its --listen-plain listener when TLS is on); "": none
    # known, `endpoint` serves them (tiered.server.leaders.redirect_endpoint)
    plain_endpoint: str = ""


class ChunkStream(Protocol):
    """A chunk whose bytes are still arriving (a streamed range GET): its length is known, its bytes come in order."""

    size: int

    def pieces(self) -> AsyncIterator[memoryview]:
        """The chunk's bytes in order, each piece as soon as it is in; raises if the bytes stop coming."""

    def close(self) -> None:
        """Gives its memory back; called once the chunk is sent, or instead of sending it."""


@dataclass(frozen=True, slots=True)
class RemoteChunk:
    data: bytes | ChunkStream  # whole {varint len, bundle} records
    first_bundle_seq: int
    first_bundle_sparse: bool


@dataclass(frozen=True, slots=True)
class Unreadable:
    """No location could be read for a seq the bounds say is stored: a hole in the catalog or a missing object.
    Answered as a system error (0xfb) and alarmed, never skipped."""

    reason: str


@dataclass(frozen=True, slots=True)
class Expired:
    """Remote retention took the seq while it was being read: the catalog's first available seq moved past it (and
    the objects holding it went) after the partition's bounds here were read, before the broker was told.
    Answered as TANK's boundary fault with `first_available`, as a read below the first available seq is."""

    first_available: int


@dataclass
class RemoteCompactionReport:
    """What one pass of remote compaction did (tiered.tiering.compaction.remote_compaction)."""

    topic: str
    partition: int
    groups: int = 0  # groups swapped in
    segments_before: int = 0
    segments_after: int = 0
    runs_before: int = 0  # block runs replaced (a topic with remote.copy=false)
    bytes_before: int = 0  # object and index bytes of the remote segments replaced, and bytes of the runs
    bytes_after: int = 0
    downloaded_bytes: int = 0  # remote-only history read from the bucket
    stopped: str | None = None  # why the pass ended before its last group
    swapped: list[tuple[list[str], list[str]]] = field(default_factory=list)  # (old object keys, new object keys)


class TierSink(Protocol):
    def committed(self, tp: TopicPartition, first_seq: int, last_seq: int, size_bytes: int) -> None:
        """Records [first_seq, last_seq] of the partition are in the bucket and the catalog."""

    def fenced(self, tp: TopicPartition, reason: str) -> None:
        """A newer leader claimed the partition: this broker stops serving it."""

    def copied(self, tp: TopicPartition, base: int, last: int) -> None:
        """A sealed segment [base, last] is readable in the bucket."""

    def first_available_moved(self, tp: TopicPartition, seq: int) -> None:
        """Remote retention moved the partition's first available seq up to `seq`."""

    def follow(self, tp: TopicPartition, leader: Leader | None, committed: int | None,
               first_available: int | None = None) -> None:
        """The partition is led by another broker (None: by nobody yet, a takeover is under way). `committed` and
        `first_available` are the catalog's bounds (None: unchanged): history up to `committed` is served here, the
        tail is redirected to the leader."""

    async def lead(self, plans: Sequence[PartitionPlan]) -> None:
        """Carry the plans out locally and serve the partitions as their leader (the tier claimed them)."""

    async def topics_known(self, topics: Sequence[NewLocalTopic]) -> None:
        """Every topic of the catalog: the ones the disk lacks are created locally (another broker created them)."""

    def local_partition(self, tp: TopicPartition) -> LocalPartition | None:
        """What the local disk holds of the partition now (for the plan of a claim), None if it is not open."""

    def evicted(self, reason: str) -> None:
        """Another process took this broker's id over: this one must stop serving (and exit)."""


class Tier(Protocol):
    lower_tier: bool  # whether reads below the local disk can be answered
    produce_calls: ProduceCalls  # the ack deadline, admits_now and appended, bound to what answers them now

    async def start(self) -> None: ...

    async def join(self, advertised: str, http: str, advertised_plain: str = "") -> None:
        """Joins the service as the broker reachable at `advertised` (its HTTP endpoint at `http`, "" if off; by
        plaintext clients at `advertised_plain`, "" if none): leads what it should (through the sink's `lead`),
        follows the rest, and keeps doing so until `stop`."""

    def may_acknowledge(self) -> bool:
        """False while this broker cannot be sure it still leads (its lease is not renewed): produce answers 0xfd."""

    def durable_trouble(self) -> str | None:
        """Why blocks are not being committed right now (the latest failed upload or commit, while it is retried),
        or None: what an ack-timeout log line names."""

    async def hand_over(self, deadline: float) -> None:
        """A graceful stop: commits what it holds and hands every partition it leads to another live broker."""

    async def open_partitions(self, local: Sequence[LocalTopic]) -> OpenPlan: ...

    async def resume(self, plan: PartitionPlan, config: TopicConfig, tail: Iterable[StoredRecord]) -> None:
        """Called once a plan is carried out locally: lead the partition, uploading `tail` (the records past
        `plan.reupload_after`) before anything appended later."""

    def reconfigured(self, tp: TopicPartition, config: TopicConfig) -> None: ...

    async def create_topic(self, name: str, partitions: int, config_text: str) -> list[PartitionPlan]: ...

    async def topic_created(self, name: str, partitions: int) -> None:
        """The topic exists locally now: its partitions may be led (through the sink's `lead`)."""

    async def admission(self) -> bool: ...

    def admits_now(self) -> bool:
        """Whether admission() would answer True at once; the produce path awaits admission() only when not."""

    def appended(self, tp: TopicPartition, appended: AppendResult,
                 durable: bool) -> asyncio.Future[AckOutcome] | None:
        """A record was appended locally; returns the future of its durable ack on a durable topic."""

    def sealed(self, tp: TopicPartition, segment: SealedSegment) -> None: ...

    def may_delete_local(self, tp: TopicPartition, segment: SealedSegment) -> bool: ...

    async def read(self, tp: TopicPartition, seq: int, fetch_size: int,
                   bounds: PartitionBounds) -> RemoteChunk | Unreadable | Expired | None: ...

    async def refresh_follower(self, tp: TopicPartition) -> bool:
        """A read on a partition led elsewhere went past the bounds known here: the tier tells the sink the
        catalog's bounds now (through `follow`). True if it did, and the read should look again."""

    async def flush(self, deadline: float) -> None: ...

    async def stop(self, deadline: float) -> None: ...

    async def check_ready(self) -> tuple[bool, str]: ...

    def partition_status(self, tp: TopicPartition) -> dict[str, int]:
        """Counters of the partition's tier for /v1/tier (name -> value)."""

    async def compact_remote(self, tp: TopicPartition, log: PartitionLog,
                             force: bool = False) -> RemoteCompactionReport | None:
        """Brings the tier's copy of a compacted partition led here to what `log`'s compaction keeps (`force`: a
        pass asked for by hand); None when the tier holds no copy of it to compact, or it is not led here."""


class LocalOnly:
    """The tier of a plain TANK broker: nothing below the local disk."""

    lower_tier = False

    def __init__(self) -> None:
        self.produce_calls = ProduceCalls(AckDeadline(float("inf")), self.admits_now, self.appended)  # no lease

    async def start(self) -> None:
        return None

    async def join(self, advertised: str, http: str, advertised_plain: str = "") -> None:
        return None

    def may_acknowledge(self) -> bool:
        return True

    def durable_trouble(self) -> str | None:
        return None

    async def hand_over(self, deadline: float) -> None:
        return None

    async def open_partitions(self, local: Sequence[LocalTopic]) -> OpenPlan:
        return OpenPlan()

    async def resume(self, plan: PartitionPlan, config: TopicConfig, tail: Iterable[StoredRecord]) -> None:
        return None

    def reconfigured(self, tp: TopicPartition, config: TopicConfig) -> None:
        return None

    async def refresh_follower(self, tp: TopicPartition) -> bool:
        return False

    async def create_topic(self, name: str, partitions: int, config_text: str) -> list[PartitionPlan]:
        return []

    async def topic_created(self, name: str, partitions: int) -> None:
        return None

    async def admission(self) -> bool:
        return True

    def admits_now(self) -> bool:
        return True

    def appended(self, tp: TopicPartition, appended: AppendResult,
                 durable: bool) -> asyncio.Future[AckOutcome] | None:
        return None

    def sealed(self, tp: TopicPartition, segment: SealedSegment) -> None:
        return None

    def may_delete_local(self, tp: TopicPartition, segment: SealedSegment) -> bool:
        return True

    async def read(self, tp: TopicPartition, seq: int, fetch_size: int,
                   bounds: PartitionBounds) -> RemoteChunk | Unreadable | Expired | None:
        return None

    async def flush(self, deadline: float) -> None:
        return None

    async def stop(self, deadline: float) -> None:
        return None

    async def check_ready(self) -> tuple[bool, str]:
        return True, ""

    def partition_status(self, tp: TopicPartition) -> dict[str, int]:
        return {}

    async def compact_remote(self, tp: TopicPartition, log: PartitionLog,
                             force: bool = False) -> RemoteCompactionReport | None:
        return None
