"""Fixtures and builders for tiered.storage tests: a fake clock, configs, bundles of exact sizes, an open log."""

from __future__ import annotations

import os
import random

import pytest

from tiered.protocol.bundle import Message, encode_bundle
from tiered.storage.partition_log import PartitionLog
from tiered.storage.topic_config import TopicConfig

# The creation time in docs/protocol.md §7's observed file name `events/0/1_1795352546.log`.
OBSERVED_TS = 1795352546


class FakeClock:
    """now_s() for PartitionLog; tests move it with advance()."""

    def __init__(self, now: float = OBSERVED_TS):
        self.now = float(now)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def storage_config(**settings) -> TopicConfig:
    """A TopicConfig from keyword settings named like the fields (log_segment_bytes=1024)."""
    return TopicConfig(**settings)


def bundle_for_record(record_len: int, *, ts_ms: int = 1, fill: bytes = b"x") -> bytes:
    """A one-message, uncompressed bundle whose segment record ({varint len, bundle}) is `record_len` bytes.

    One-byte length prefix and content length (record_len <= 128): record = 1 + (flags, msg flags, ts u64,
    content len, content) = 12 + content.
    """
    if not 13 <= record_len <= 128:
        raise ValueError("record_len must be 13..128")
    bundle = encode_bundle([Message(fill * (record_len - 12), ts_ms=ts_ms)], codec=0)
    assert len(bundle) + 1 == record_len
    return bundle


def plain_bundle(*values: bytes, ts_ms: int = 1) -> bytes:
    return encode_bundle([Message(v, ts_ms=ts_ms) for v in values], codec=0)


def sparse_bundle(*seqs: int, ts_ms: int = 1) -> bytes:
    return encode_bundle([Message(b"m%d" % s, ts_ms=ts_ms, seq=s) for s in seqs], codec=0, sparse=True)


def segment_files(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith((".log", ".ilog", ".index")))


@pytest.fixture
def storage_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_storage_log(tmp_path, storage_clock):
    """open_storage_log(config=None, **kwargs) -> PartitionLog in tmp_path/p, closed at teardown."""
    opened: list[PartitionLog] = []

    def opener(config: TopicConfig | None = None, **kwargs) -> PartitionLog:
        kwargs.setdefault("now_s", storage_clock)
        kwargs.setdefault("rng", random.Random(7))
        log = PartitionLog.open(str(tmp_path / "p"), config or TopicConfig(), **kwargs)
        opened.append(log)
        return log

    yield opener
    for log in opened:
        log.close()


def locate(log: PartitionLog, seq: int, fetch_size: int, hwmark: int | None = None):
    """What a local-only broker answers for `seq`: tiered.bounds.locate over the log's own bounds (the hwmark is
    the last assigned seq unless given), carried out by PartitionLog.read. A ReadRange, Boundary or Eof."""
    from tiered.bounds import Local, PartitionBounds, local_miss
    from tiered.bounds import locate as decide

    hw = log.last_assigned if hwmark is None else hwmark
    bounds = PartitionBounds(log.first_available, hw, log.first_available, log.last_held, False)
    where = decide(seq, bounds)
    if isinstance(where, Local):
        got = log.read(where.seq, fetch_size, hw)
        return got if got is not None else local_miss(where.seq, bounds)
    return where
