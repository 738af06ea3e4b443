"""tiered.storage: local partition logs kept exactly as TANK keeps them (docs/protocol.md §7, §10, §12).

Synchronous file I/O only; no network, no asyncio. The server owns one PartitionLog per local partition.
"""

from tiered.storage.partition_log import AppendResult, InvalidSeqnums, LogStats, PartitionLog, StoredRecord
from tiered.storage.reads import ReadRange
from tiered.storage.recovery import RecoveryError, RecoveryReport
from tiered.storage.segment import ActiveSegment, SealedSegment
from tiered.storage.topic_config import ConfigError, TopicConfig, parse_config_text, parse_duration, parse_size

__all__ = [
    "ActiveSegment",
    "AppendResult",
    "ConfigError",
    "InvalidSeqnums",
    "LogStats",
    "PartitionLog",
    "ReadRange",
    "RecoveryError",
    "RecoveryReport",
    "SealedSegment",
    "StoredRecord",
    "TopicConfig",
    "parse_config_text",
    "parse_duration",
    "parse_size",
]
