"""File names inside a partition directory (docs/protocol.md §7).

    <base>_<createdTS>.log              the active segment; older form <base>.log still accepted
    <base>-<last>_<freezeTS>.ilog       a sealed segment; older form <base>-<last>.ilog still accepted
    <base>.index                        the sparse index of the segment with that base (active or sealed)
    config                              partition-level config overrides
    .cleanup.checkpoint                 the compaction checkpoint (compaction_checkpoint.py; ours, not TANK's)
    <segment or index name>.cleaned     compaction output being written          } compaction_swap.py: finished
    <segment or index name>.swap        compaction output whose group committed   } or rolled back when the
    <segment or index name>.old         TANK's: an input its own swap renamed     } partition opens
    <segment name>.private              a private copy of a segment file being made (segment.make_private; ours):
                                        deleted when the partition opens

`createdTS` is when the segment was created and `freezeTS` the .log's mtime when it rolled, both in unix
seconds. Anything else found in a partition directory is ignored and reported with a reason, never deleted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PARTITION_CONFIG = "config"
CHECKPOINT = ".cleanup.checkpoint"
CHECKPOINT_TMP = CHECKPOINT + ".tmp"
CLEANED, SWAP, OLD = "cleaned", "swap", "old"
PRIVATE = "private"

_LOG = re.compile(r"(\d+)(?:_(\d+))?\.log")
_ILOG = re.compile(r"(\d+)-(\d+)(?:_(\d+))?\.ilog")
_INDEX = re.compile(r"(\d+)\.index")
_WIDE_INDEX = re.compile(r"\d+_64\.index")
_COMPACTION = re.compile(r"(.+)\.(cleaned|swap|old)")


@dataclass(frozen=True, slots=True)
class LogName:
    base: int
    created_ts: int | None  # None for the older "<base>.log" form

    def __str__(self) -> str:
        return format_log_name(self.base, self.created_ts)


@dataclass(frozen=True, slots=True)
class IlogName:
    base: int
    last: int
    freeze_ts: int | None  # None for the older "<base>-<last>.ilog" form

    def __str__(self) -> str:
        return format_ilog_name(self.base, self.last, self.freeze_ts)


@dataclass(frozen=True, slots=True)
class IndexName:
    base: int

    def __str__(self) -> str:
        return format_index_name(self.base)


@dataclass(frozen=True, slots=True)
class ConfigName:
    pass


@dataclass(frozen=True, slots=True)
class CheckpointName:
    pass


@dataclass(frozen=True, slots=True)
class SwapLeftover:
    """A compaction file not in place yet: `stage` is cleaned, swap or old; `target` is its name without the
    suffix, parsed (a `.cleaned` file may be named anyhow: TANK writes `<base>-0_0.ilog.cleaned` first)."""

    name: str
    stage: str
    target: PartitionFile

    @property
    def final_name(self) -> str:
        return self.name[: -len(self.stage) - 1]


@dataclass(frozen=True, slots=True)
class PrivateCopy:
    """`<segment name>.private`: an unfinished private copy of a segment file (segment.make_private)."""

    name: str


@dataclass(frozen=True, slots=True)
class Ignored:
    name: str
    reason: str


PartitionFile = LogName | IlogName | IndexName | ConfigName | CheckpointName | SwapLeftover | PrivateCopy | Ignored


def format_log_name(base: int, created_ts: int | None) -> str:
    return f"{base}.log" if created_ts is None else f"{base}_{created_ts}.log"


def format_ilog_name(base: int, last: int, freeze_ts: int | None) -> str:
    return f"{base}-{last}.ilog" if freeze_ts is None else f"{base}-{last}_{freeze_ts}.ilog"


def format_index_name(base: int) -> str:
    return f"{base}.index"


def parse_name(name: str) -> PartitionFile:
    """Classifies one directory entry name of a partition directory."""
    if name == PARTITION_CONFIG:
        return ConfigName()
    if name in (CHECKPOINT, CHECKPOINT_TMP):
        return CheckpointName()
    if m := _LOG.fullmatch(name):
        return LogName(int(m[1]), None if m[2] is None else int(m[2]))
    if m := _ILOG.fullmatch(name):
        base, last = int(m[1]), int(m[2])
        if last < base:
            return Ignored(name, f"sealed segment name with last seq {last} below its base {base}")
        return IlogName(base, last, None if m[3] is None else int(m[3]))
    if m := _INDEX.fullmatch(name):
        return IndexName(int(m[1]))
    if _WIDE_INDEX.fullmatch(name):
        return Ignored(name, "wide (64-bit) index: recognised by TANK but never produced, not supported")
    if name.endswith(f".{PRIVATE}") and isinstance(parse_name(name[: -len(PRIVATE) - 1]), (LogName, IlogName)):
        return PrivateCopy(name)
    if m := _COMPACTION.fullmatch(name):
        return SwapLeftover(name, m[2], parse_name(m[1]))
    return Ignored(name, "not a segment, index or config file")
