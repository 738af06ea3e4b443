"""What this broker's tier knows of each partition, in one place (issue 27): its role (led here, followed, or fenced),
the epoch its uploads carry while led, its config, its committed seq (the catalog's high-water mark as this broker
knows it) and its highest copied seq (the last seq of the remote segments known COPY_FINISHED), and a locations
version bumped whenever its locations in the bucket were replaced (a remote compaction's swap).

`TierState` is the only owner: the block builder, the segment copier, the reader, retention and compaction read it,
and it changes only through its write methods (`lead`, `lose`, `fence`, `committed`, `copied`, `locations_changed`,
`reconfigured`). Before, five dictionaries held copies of these facts and could disagree: a partition fenced by a
refused commit had its builder released while the service still believed it led, and a reader chose between segment
and run from a highest copied seq a remote compaction had made stale.

It is sans-IO: no catalog, no store, no clock; the callers do the I/O and tell it what they learned.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from enum import Enum

from tiered.storage.topic_config import TopicConfig
from tiered.topic_partition import TopicPartition


class Role(Enum):
    LED = "led"  # uploads and commits here, under `epoch`
    FOLLOWING = "following"  # led by another broker (or by nobody yet): served here from the bucket below the tail
    FENCED = "fenced"  # a newer epoch refused this broker's write: nothing more is uploaded for it here


@dataclass(frozen=True, slots=True)
class PartitionTier:
    """One partition's tier state at one moment (a value: a write replaces it)."""

    role: Role
    epoch: int | None  # the epoch claimed here (kept once fenced or lost, for the logs; uploads look at `role`)
    config: TopicConfig | None
    committed_seq: int
    highest_copied_seq: int
    locations_version: int


_NOT_LED = PartitionTier(Role.FOLLOWING, None, None, 0, 0, 0)
_LED = Role.LED  # read per produced record (epoch_of): an Enum member read goes through 3.11's EnumType.__getattr__


class TierState:
    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, PartitionTier] = {}
        # The partitions whose role is LED, with the epoch each is led under, kept by the three writes that change
        # a role (lead, lose, fence): `led()` costs what is led, not every partition this broker ever knew, and
        # `led_epochs()` is one copy in C (a look asks it each time: a new leader with 50,000 partitions looks every
        # 0.01-0.05 s during a handover).
        self._led: dict[TopicPartition, int] = {}
        # How many partitions led here keep each remote retention, by (topic, seconds, bytes), kept by the writes
        # that change a role or a config: remote retention's pass asks the catalog about these topics, and costs
        # what expires, not how many partitions are led.
        self._retained: dict[tuple[str, int, int], int] = {}

    # -- reads ------------------------------------------------------------------------------------------------------

    def of(self, tp: TopicPartition) -> PartitionTier:
        return self._partitions.get(tp, _NOT_LED)

    def leads(self, tp: TopicPartition) -> bool:
        return self.of(tp).role is Role.LED

    def epoch_of(self, tp: TopicPartition) -> int | None:
        """The epoch of a partition led here; None when it is not (followed, lost or fenced)."""
        state = self._partitions.get(tp, _NOT_LED)  # self.of(tp), inline: read once per produced record
        return state.epoch if state.role is _LED else None

    def config_of(self, tp: TopicPartition) -> TopicConfig | None:
        """The config of a partition led here; None when it is not."""
        state = self.of(tp)
        return state.config if state.role is Role.LED else None

    def committed_seq(self, tp: TopicPartition) -> int:
        return self.of(tp).committed_seq

    def highest_copied_seq(self, tp: TopicPartition) -> int:
        return self.of(tp).highest_copied_seq

    def led(self) -> Iterator[tuple[TopicPartition, PartitionTier]]:
        """The partitions led here, with their state."""
        return ((tp, self._partitions[tp]) for tp in list(self._led))

    def remote_retention_topics(self) -> list[tuple[str, int, int]]:
        """The topics with a partition led here that keeps a remote retention: (topic, seconds, bytes), a limit of
        0 unset, sorted."""
        return sorted(self._retained)

    def led_epochs(self) -> dict[TopicPartition, int]:
        """The partitions led here, with the epoch each is led under (a copy)."""
        return dict(self._led)

    def led_epochs_held(self) -> Mapping[TopicPartition, int]:
        """What `led_epochs` copies, itself: the one dict the state keeps (never rebound, changed only by its writes
        below), so that a reader holding it sees every change. `epoch_of(tp)` is its `get(tp)`; the block builder's
        native `add` reads it so, once per produced record, without a Python call."""
        return self._led

    # -- writes -----------------------------------------------------------------------------------------------------

    def lead(self, tp: TopicPartition, epoch: int, config: TopicConfig, committed_seq: int,
             highest_copied_seq: int = 0) -> None:
        """The partition is led here under `epoch` from now on, continuing the catalog's committed seq."""
        old = self.of(tp)
        new = PartitionTier(Role.LED, epoch, config, committed_seq, max(highest_copied_seq, old.highest_copied_seq),
                            old.locations_version)
        self._replace(tp, old, new)
        self._led[tp] = epoch

    def lose(self, tp: TopicPartition) -> None:
        """No longer led here (handed over, or claimed by another broker)."""
        old = self._partitions.get(tp)
        if old is not None:
            self._replace(tp, old, replace(old, role=Role.FOLLOWING))
            self._led.pop(tp, None)

    def fence(self, tp: TopicPartition, epoch: int | None = None) -> bool:
        """A write under `epoch` (None: the current one) was refused for a newer epoch. Returns whether this changed
        anything (the partition was led here under that epoch), so that a fence is reported once."""
        old = self._partitions.get(tp)
        if old is None or old.role is not Role.LED or (epoch is not None and epoch != old.epoch):
            return False
        self._replace(tp, old, replace(old, role=Role.FENCED))
        self._led.pop(tp, None)
        return True

    def committed(self, tp: TopicPartition, seq: int) -> None:
        """Seqs up to `seq` are committed (the committed seq never goes back)."""
        old = self.of(tp)
        if seq > old.committed_seq:  # once per partition of every block: built directly, not by replace()
            self._partitions[tp] = PartitionTier(old.role, old.epoch, old.config, seq, old.highest_copied_seq,
                                                 old.locations_version)

    def copied(self, tp: TopicPartition, last_seq: int) -> None:
        """A remote segment ending at `last_seq` is COPY_FINISHED (the highest copied seq never goes back)."""
        old = self.of(tp)
        if last_seq > old.highest_copied_seq:
            self._partitions[tp] = replace(old, highest_copied_seq=last_seq)

    def locations_changed(self, tp: TopicPartition) -> int:
        """The partition's locations in the bucket were replaced; returns the new locations version."""
        old = self.of(tp)
        self._partitions[tp] = replace(old, locations_version=old.locations_version + 1)
        return old.locations_version + 1

    def reconfigured(self, tp: TopicPartition, config: TopicConfig) -> None:
        old = self._partitions.get(tp)
        if old is not None:
            self._replace(tp, old, replace(old, config=config))

    def _replace(self, tp: TopicPartition, old: PartitionTier, new: PartitionTier) -> None:
        """A write that may change the role or the config: the retention counts follow."""
        self._partitions[tp] = new
        for state, step in ((old, -1), (new, 1)):
            key = _retention_key(tp, state)
            if key is not None:
                left = self._retained.get(key, 0) + step
                if left:
                    self._retained[key] = left
                else:
                    del self._retained[key]


def _retention_key(tp: TopicPartition, state: PartitionTier) -> tuple[str, int, int] | None:
    """The remote retention a partition in `state` counts for (None: not led, or no remote retention)."""
    config = state.config
    if state.role is not Role.LED or config is None:
        return None
    if not (config.remote_retention_secs or config.remote_retention_bytes):
        return None
    return tp.topic, config.remote_retention_secs, config.remote_retention_bytes

