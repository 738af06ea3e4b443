"""The timestamp bounds a sealed segment gets from its appends (ActiveSegment.ts_bounds) are the ones the copier would
read from its file (segment_timestamp_bounds), so the copier records the same catalog row without reading it."""

from __future__ import annotations

import random

from tiered.protocol.bundle import CODEC_SNAPPY, Message, encode_bundle
from tiered.storage import PartitionLog
from tiered.tiering.blocks.block_builder import MAX_RECORDED_TS_MS, recorded_ts_bounds
from tiered.tiering.segments.segment_copier import segment_timestamp_bounds

from tests.support.storage_helpers import sparse_bundle, storage_config

CONFIG = storage_config(log_segment_bytes=2000, log_index_interval_bytes=128)


def random_bundle(rng: random.Random) -> bytes:
    # Timestamps anywhere, including 0, past what the catalog records, and out of order within a bundle.
    ts = [rng.choice([0, 1, rng.randrange(1 << 40), rng.randrange(1 << 63), MAX_RECORDED_TS_MS + 1])
          for _ in range(rng.randint(1, 6))]
    return encode_bundle([Message(rng.randbytes(rng.randint(0, 80)), None, t) for t in ts],
                         codec=CODEC_SNAPPY if rng.random() < 0.3 else None)


def test_bounds_told_by_the_appends_are_the_bounds_read_from_the_file(tmp_path):
    rng = random.Random(7)
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG, rng=rng)
    for _ in range(200):
        log.append(random_bundle(rng))
    log.append(sparse_bundle(10_000, 10_005, ts_ms=5))
    log.seal_active()
    assert len(log.segments) >= 5
    for segment in log.segments:
        assert segment.ts_bounds is not None
        assert recorded_ts_bounds(*segment.ts_bounds) == segment_timestamp_bounds(segment.path, segment.base,
                                                                                  segment.size)
    log.close()


def test_a_segment_that_did_not_see_every_append_leaves_the_bounds_to_the_file(tmp_path):
    """A reopened active segment holds records appended before the restart: its seal knows no bounds, nor does a
    segment recovered from the directory."""
    rng = random.Random(3)
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG, rng=rng)
    log.append(random_bundle(rng))
    log.close()
    log = PartitionLog.open(str(tmp_path / "p"), CONFIG, rng=rng)
    log.append(random_bundle(rng))
    sealed = log.seal_active()
    assert sealed is not None and sealed.ts_bounds is None
    log.append(random_bundle(rng))
    assert log.seal_active().ts_bounds is not None  # a new segment sees all its appends
    log.close()
    reopened = PartitionLog.open(str(tmp_path / "p"), CONFIG, rng=rng)
    assert [s.ts_bounds for s in reopened.segments] == [None, None]
    reopened.close()
