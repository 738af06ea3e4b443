"""Writing one group's compacted output: sealed segments with TANK's names, records and index (docs/protocol.md §4, §7).

Output segments tile the group's seq range: the first is based at the group's base, each next one right after the
last seq of the one before, and the last one ends at the group's last seq. A name may therefore cover seqs that no
message holds any more (TANK's compaction names a segment after the seqs it kept; it considered this form and
reads it the same way). Keeping the range keeps the partition's first available seq and, when there is no active
segment, its last assigned seq, and it leaves no gap between segments inside a compacted range.

Records, in seq order:
- an input bundle that loses no message is copied byte for byte, if a reader can still tell its seqs: it is
  sparse, or it starts right after the previous record of the output (at the segment base for the first record);
- otherwise its kept messages are re-encoded, those of consecutive bundles together up to BUNDLE_BYTES, as a
  sparse bundle, or as a plain one when they are consecutive seqs starting right after the previous record.
  The encoder never sets SEQ_PREV_PLUS_ONE on a first or last message. As TANK's compaction does, a message set
  over 1 KiB is snappy-compressed when that makes it smaller; so is one whose messages came from a compressed
  bundle (kept messages of a compressed bundle must not take more room than the bundle did).
An output is cut, as TANK rolls a segment, before a record when it is already larger than `log.segment.bytes` or
its index larger than `log.index.size.max.bytes`, or when the record would not fit its u32 positions. The index
follows TANK's rule (index.py) from an empty segment.

Files are written as `<base>.ilog.cleaned` and `<base>.index.cleaned` (compaction_swap.py renames them). The
writer counts every byte it writes and raises OutputTooLarge past `max_bytes`, so that a pass never needs more
extra disk than it allowed itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import BinaryIO

import snappy

from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, BundleHeader, Message, encode_bundle, read_bundle_header
from tiered.protocol.varint import encode_varint
from tiered.storage.index import IndexBuilder, SparseIndex
from tiered.storage.names import CLEANED, format_ilog_name, format_index_name
from tiered.storage.appender import MAX_POSITION, MAX_REL_SEQ
from tiered.storage.topic_config import TopicConfig

BUNDLE_BYTES = 64 * 1024  # key and value bytes of re-encoded messages gathered into one bundle
COMPRESS_ABOVE = 1024  # TANK's compaction tries snappy on message sets larger than this
WRITE_BUFFER = 1024 * 1024


class OutputTooLarge(Exception):
    """The group's output would take more disk than the pass allowed."""


@dataclass
class OutputSegment:
    """One output segment: its name fields, size and index; files under `<base>.{ilog,index}.cleaned`."""

    directory: str
    base: int
    last: int
    freeze_ts: int
    size: int = 0
    index: SparseIndex = field(default_factory=SparseIndex)

    @property
    def filename(self) -> str:
        return format_ilog_name(self.base, self.last, self.freeze_ts)

    @property
    def index_filename(self) -> str:
        return format_index_name(self.base)

    @property
    def cleaned_path(self) -> str:
        return os.path.join(self.directory, f"{self.base}.ilog.{CLEANED}")

    @property
    def cleaned_index_path(self) -> str:
        return os.path.join(self.directory, f"{self.index_filename}.{CLEANED}")


def _encode(messages: list[Message], sparse: bool, was_compressed: bool) -> bytes:
    plain = encode_bundle(messages, codec=CODEC_NONE, sparse=sparse)
    header_len = read_bundle_header(plain).header_len
    if len(plain) - header_len <= COMPRESS_ABOVE and not was_compressed:
        return plain
    packed: bytes = snappy.compress(plain[header_len:])  # python-snappy has no type information
    if len(packed) >= len(plain) - header_len:
        return plain
    return bytes([plain[0] | CODEC_SNAPPY]) + plain[1:header_len] + packed


def _consecutive(messages: list[Message], first: int) -> bool:
    return messages[0].seq == first and messages[-1].seq - first == len(messages) - 1


class GroupWriter:
    """Writes the output of one group covering [base, last]; `finish()` returns its segments, fsynced."""

    def __init__(self, directory: str, base: int, last: int, freeze_ts: int, config: TopicConfig, max_bytes: int):
        self.directory = directory
        self.group_last = last
        self.freeze_ts = freeze_ts
        self.config = config
        self.max_bytes = max_bytes
        self.written_bytes = 0
        self.outputs: list[OutputSegment] = []
        self._file: BinaryIO  # the current output's, from _open (closed, not replaced, when the output ends)
        self._builder: IndexBuilder  # the current output's index, from _open
        self._next_seq = base  # the seq a plain bundle written now would start at
        self._last_written = base - 1
        self._pending: list[Message] = []
        self._pending_bytes = 0
        self._pending_compressed = False
        self._open(base)

    # ---------------------------------------------------------------------------------------- input side

    def add_whole(self, record: bytes, header: BundleHeader, messages: list[Message]) -> None:
        """An input record (`{varint length, bundle}`) none of whose messages was removed."""
        expected = self._pending[-1].seq + 1 if self._pending else self._next_seq
        if not header.sparse and messages[0].seq != expected:
            self.add_kept(header, messages)  # its seqs would be misread: re-encoded with its neighbours
            return
        self._flush_pending()
        self._maybe_cut()  # a new output starts right after the last seq written, which is `expected`
        self._write(record, messages[0].seq, messages[-1].seq)

    def add_kept(self, header: BundleHeader, messages: list[Message]) -> None:
        """The kept messages of an input bundle that lost some (possibly none kept)."""
        if messages and header.codec == CODEC_SNAPPY:
            self._pending_compressed = True
        for message in messages:
            self._pending.append(message)
            self._pending_bytes += len(message.value) + len(message.key or b"") + 10
            if self._pending_bytes >= BUNDLE_BYTES:
                self._flush_pending()

    def finish(self) -> list[OutputSegment]:
        self._flush_pending()
        if not self._builder.index:
            raise ValueError("a compaction group must keep at least one message")
        self._close_current(self.group_last)
        return self.outputs

    def abort(self) -> None:
        """Removes every file written so far (the group is not swapped in)."""
        self._file.close()  # a no-op when already closed
        for output in self.outputs:
            for path in (output.cleaned_path, output.cleaned_index_path):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    # --------------------------------------------------------------------------------------- output side

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        messages, self._pending, self._pending_bytes = self._pending, [], 0
        compressed, self._pending_compressed = self._pending_compressed, False
        self._maybe_cut()
        bundle = _encode(messages, not _consecutive(messages, self._next_seq), compressed)
        self._write(encode_varint(len(bundle)) + bundle, messages[0].seq, messages[-1].seq)

    def _write(self, record: bytes, first: int, last: int) -> None:
        output = self.outputs[-1]
        if output.size and output.size + len(record) > MAX_POSITION:
            self._cut()
            output = self.outputs[-1]
        if last - output.base > MAX_REL_SEQ:
            raise OutputTooLarge(f"seq {last} is too far above segment base {output.base} for u32 index entries")
        entry = self._builder.add(first - output.base, output.size, len(record))
        self._count(len(record) + (8 if entry is not None else 0))
        self._file.write(record)
        output.size += len(record)
        self._next_seq = last + 1
        self._last_written = last

    def _count(self, nbytes: int) -> None:
        self.written_bytes += nbytes
        if self.written_bytes > self.max_bytes:
            raise OutputTooLarge(f"output passed {self.max_bytes} bytes")

    def _maybe_cut(self) -> None:
        output = self.outputs[-1]
        if not output.size:
            return
        too_big = output.size > self.config.log_segment_bytes
        index_too_big = output.index.size_bytes > self.config.log_index_size_max_bytes
        if too_big or index_too_big:
            self._cut()

    def _cut(self) -> None:
        self._close_current(self._last_written)
        self._open(self._last_written + 1)

    def _open(self, base: int) -> None:
        output = OutputSegment(self.directory, base, base, self.freeze_ts)
        self._builder = IndexBuilder(self.config.log_index_interval_bytes, output.index)
        self._file = open(output.cleaned_path, "wb", buffering=WRITE_BUFFER)
        self.outputs.append(output)
        self._next_seq = base

    def _close_current(self, last: int) -> None:
        output = self.outputs[-1]
        output.last = last
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        with open(output.cleaned_index_path, "wb") as f:
            f.write(output.index.to_bytes())
            f.flush()
            os.fsync(f.fileno())
