"""The compaction checkpoint file: its codec on good, truncated, oversized and random bytes, and its passes."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiered.storage.compaction_checkpoint import (
    MAX_PASSES,
    Checkpoint,
    CheckpointError,
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from tiered.storage.names import CHECKPOINT

SAMPLE = Checkpoint(900, ((100, 1_000), (500, 2_000), (900, 3_000)))


def test_layout_byte_for_byte():
    data = encode_checkpoint(Checkpoint(7, ((7, 9),)))
    assert data[:4] == b"TCK1"
    assert data[4:12] == (7).to_bytes(8, "little") and data[12:14] == (1).to_bytes(2, "little")
    assert data[14:30] == (7).to_bytes(8, "little") + (9).to_bytes(8, "little")
    assert len(data) == 34
    assert decode_checkpoint(data) == Checkpoint(7, ((7, 9),))


@given(st.lists(st.tuples(st.integers(1, 2**40), st.integers(1, 2**40)), max_size=30), st.integers(0, 2**64 - 1))
def test_round_trip(pairs, cleaned_upto):
    uptos = sorted({u for u, _ in pairs})
    times = sorted({t for _, t in pairs})[: len(uptos)]
    checkpoint = Checkpoint(cleaned_upto, tuple(zip(uptos, times)))
    assert decode_checkpoint(encode_checkpoint(checkpoint)) == checkpoint


def test_every_truncation_and_extension_is_refused():
    data = encode_checkpoint(SAMPLE)
    for cut in range(len(data)):
        with pytest.raises(CheckpointError):
            decode_checkpoint(data[:cut])
    with pytest.raises(CheckpointError, match="passes make"):
        decode_checkpoint(data + b"\0")


def test_damage_is_refused():
    data = bytearray(encode_checkpoint(SAMPLE))
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x40
        with pytest.raises(CheckpointError):
            decode_checkpoint(bytes(damaged))


def test_random_bytes_are_refused_cleanly():
    rng = random.Random(3)
    for _ in range(500):
        with pytest.raises(CheckpointError):
            decode_checkpoint(rng.randbytes(rng.randrange(0, 80)))


def test_passes_that_do_not_increase_are_refused():
    body = encode_checkpoint(Checkpoint(5, ((5, 10), (6, 9))))
    with pytest.raises(CheckpointError, match="do not increase"):
        decode_checkpoint(body)


def test_unreadable_file_reads_as_empty_and_says_so(tmp_path, caplog):
    assert read_checkpoint(str(tmp_path)) == Checkpoint()
    (tmp_path / CHECKPOINT).write_bytes(b"TCK1 not really")
    with caplog.at_level(logging.WARNING, logger="tiered.storage"):
        assert read_checkpoint(str(tmp_path)) == Checkpoint()
    assert "dirty" in caplog.text
    write_checkpoint(str(tmp_path), SAMPLE)
    assert read_checkpoint(str(tmp_path)) == SAMPLE
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT]


def test_first_compacted_is_the_first_pass_at_or_above_the_seq():
    assert [SAMPLE.first_compacted_ms(s) for s in (1, 100, 101, 500, 900, 901)] == [1000, 1000, 2000, 2000, 3000, None]


def test_after_pass_folds_expired_passes_and_keeps_time_monotonic():
    checkpoint = SAMPLE.after_pass(1200, 10_000, retention_ms=7_500)
    # Passes at 1000 and 2000 are past the retention at 10000: the newer stands for both.
    assert checkpoint == Checkpoint(1200, ((500, 2_000), (900, 3_000), (1200, 10_000)))
    assert checkpoint.first_compacted_ms(50) == 2_000  # later than it was: only ever keeps a tombstone longer
    # A pass over no new seqs adds nothing; a clock that went back is not believed.
    assert checkpoint.after_pass(1000, 10_400, 7_500).passes == checkpoint.passes
    assert checkpoint.after_pass(1300, 5_000, 7_500).passes[-1] == (1300, 10_001)


def test_pass_list_is_bounded():
    checkpoint = Checkpoint()
    for i in range(1, MAX_PASSES + 50):
        checkpoint = checkpoint.after_pass(i * 10, i, retention_ms=10**9)
    assert len(checkpoint.passes) == MAX_PASSES and checkpoint.passes[-1] == ((MAX_PASSES + 49) * 10, MAX_PASSES + 49)
    assert decode_checkpoint(encode_checkpoint(checkpoint)) == checkpoint
