"""A partition's compaction checkpoint: `<partition>/.cleanup.checkpoint` (ours; TANK has no per-partition file).

TANK keeps one number per partition, `lastCleanupMaxSeq`, in `<base>/.cleanup.log`: the last seq of the newest
segment compacted, so that the segments above it are the dirty ones. We keep that number per partition, beside the
segments it describes, together with the passes that tombstone retention needs: a tombstone is dropped once
`log.cleaner.delete.retention.secs` have passed since the first pass that compacted it, which is the first pass
whose `upto` is at or above its seq. A TANK broker opening this directory ignores the file (it compacts once more,
which changes nothing).

Layout, little endian:

    magic          4 bytes  b"TCK1"
    cleaned_upto   u64      every sealed segment whose last seq is at or below it has been compacted
    pass_count     u16
    passes         pass_count x {upto u64, at_ms u64}   both strictly increasing
    crc32          u32      of everything before it

The file is replaced whole (written to `.cleanup.checkpoint.tmp`, fsynced, renamed). A missing file is an empty
checkpoint; an unreadable one is logged and read as empty: every segment counts as dirty and every tombstone as
never compacted, so the next pass keeps more than it could, never less.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from bisect import bisect_left
from dataclasses import dataclass

from tiered.storage.names import CHECKPOINT, CHECKPOINT_TMP
from tiered.storage.segment import fsync_dir

log = logging.getLogger("tiered.storage")

MAGIC = b"TCK1"
HEAD = struct.Struct("<4sQH")
PASS = struct.Struct("<QQ")
CRC = struct.Struct("<I")
# Passes older than the retention are folded into one, so the list only grows with passes inside the retention;
# past this length the oldest two are folded (which only keeps tombstones longer).
MAX_PASSES = 1024


class CheckpointError(ValueError):
    """The bytes are not a compaction checkpoint."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    cleaned_upto: int = 0
    passes: tuple[tuple[int, int], ...] = ()  # (upto seq, at_ms), both strictly increasing

    def first_compacted_ms(self, seq: int) -> int | None:
        """When the first pass that covered `seq` ran, or None if no pass has covered it yet."""
        i = bisect_left(self.passes, (seq, -1))
        return self.passes[i][1] if i < len(self.passes) else None

    def after_pass(self, upto: int, at_ms: int, retention_ms: int) -> Checkpoint:
        """This checkpoint with one more pass, which compacted everything up to `upto` at `at_ms`."""
        passes = list(self.passes)
        if not passes or upto > passes[-1][0]:
            # A clock that went back must not make seqs look compacted earlier than seqs below them.
            passes.append((upto, max(at_ms, passes[-1][1] + 1) if passes else at_ms))
        # Every tombstone a pass older than the retention covered is droppable, whichever pass it was: the newest of
        # those passes stands for all of them.
        expired = [i for i, (_, at) in enumerate(passes) if at + retention_ms <= at_ms]
        if len(expired) > 1:
            del passes[: expired[-1]]
        while len(passes) > MAX_PASSES:
            del passes[0]  # its seqs now count from the next pass, a later time: they are kept longer
        return Checkpoint(max(self.cleaned_upto, upto), tuple(passes))


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    body = HEAD.pack(MAGIC, checkpoint.cleaned_upto, len(checkpoint.passes))
    body += b"".join(PASS.pack(upto, at_ms) for upto, at_ms in checkpoint.passes)
    return body + CRC.pack(zlib.crc32(body))


def decode_checkpoint(data: bytes) -> Checkpoint:
    if len(data) < HEAD.size + CRC.size:
        raise CheckpointError(f"checkpoint of {len(data)} bytes is shorter than its header")
    magic, cleaned_upto, count = HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise CheckpointError(f"bad checkpoint magic {magic!r}")
    expected = HEAD.size + count * PASS.size + CRC.size
    if len(data) != expected:
        raise CheckpointError(f"checkpoint of {len(data)} bytes, its {count} passes make {expected}")
    (crc,) = CRC.unpack_from(data, len(data) - CRC.size)
    if crc != zlib.crc32(data[: -CRC.size]):
        raise CheckpointError("checkpoint crc mismatch")
    passes = tuple(PASS.iter_unpack(data[HEAD.size : -CRC.size]))
    for (u1, t1), (u2, t2) in zip(passes, passes[1:]):
        if u2 <= u1 or t2 <= t1:
            raise CheckpointError(f"checkpoint passes do not increase: {(u1, t1)} then {(u2, t2)}")
    return Checkpoint(cleaned_upto, passes)


def read_checkpoint(directory: str) -> Checkpoint:
    path = os.path.join(directory, CHECKPOINT)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return Checkpoint()
    try:
        return decode_checkpoint(data)
    except CheckpointError as exc:
        log.warning("%s: %s; every sealed segment counts as dirty until the next pass rewrites it", path, exc)
        return Checkpoint()


def write_checkpoint(directory: str, checkpoint: Checkpoint) -> None:
    tmp = os.path.join(directory, CHECKPOINT_TMP)
    with open(tmp, "wb") as f:
        f.write(encode_checkpoint(checkpoint))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, CHECKPOINT))
    fsync_dir(directory)
