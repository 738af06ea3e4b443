"""The block object: one partition's records per run, then a footer that describes the runs
(docs/architecture.md "Objects").

Byte layout (all integers little-endian, as in TANK's files):

    block   := run{run_count} footer trailer
    run     := ({bundle_len:varint, bundle})+      byte for byte as in the partition's segment file, so a range GET
                                                   of one run is a valid consume chunk
    footer  := run_count:u32                       FOOTER_HEADER
               run_count × {
                   topic:str8                      u8 length, then the topic name (TANK's rule: [A-Za-z0-9_-])
                   partition:u16                   RUN_ENTRY ...
                   from_seq:u64                    the first seq the run answers for (version 2; see below)
                   first_seq:u64
                   last_seq:u64
                   position:u64                    byte position of the run in the object
                   length_bytes:u64
                   messages:u32
                   min_ts_ms:u64
                   max_ts_ms:u64
                   leader_epoch:u64                the epoch the uploading broker held (version 2) ... RUN_ENTRY
                   index_count:varint              version 3: the run's bundle index, index_count ×
                   {seq_delta:varint,                the first seq of an indexed bundle minus the previous entry's
                    position_delta:varint}           (the first entry's: minus first_seq), and its position in the
                                                     run minus the previous entry's (the first's: minus 0)
               }
    trailer := footer_bytes:u32                    TRAILER: the footer's length (trailer excluded)
               footer_crc32:u32                    zlib.crc32 of the footer bytes
               version:u8                          FORMAT_VERSION
               magic:8s                            b"TIEREDB1", the object's last 8 bytes

Version 1 (the first release) had no from_seq and no leader_epoch: its runs read as from_seq = first_seq and epoch 0.
Version 2 has no bundle index: a reader of one of its runs reads the whole run.

The bundle index (version 3) lets a reader range-GET part of a run (tiered.tiering.reads.run_reads): an entry names a bundle
boundary of the run, (first seq of the bundle there, its position in the run), one wherever at least
INDEX_EVERY_BYTES have passed since the previous entry (or the run's start, itself the implicit entry
(first_seq, 0)). A GET from the entry at or before a seq then reads at most INDEX_EVERY_BYTES (plus one bundle) before
the bundle holding it, so a 1 MiB answer GETs about 1.07 bytes per byte answered; an 8 MiB block has about 128
entries of 3 to 5 bytes each, under 1 KiB of footer.
A partition may have several runs in one block (its records are split where a local segment rolled, so that each
run lies inside one segment and a remote segment covers its runs exactly); they are in seq order.

Invariants a reader checks, so a damaged or foreign object is refused rather than misread: the magic, the version,
the footer CRC, at least one run, runs laid end to end from position 0 up to the footer in footer order,
from_seq <= first_seq <= last_seq, runs of one partition in increasing seq order without overlap,
1 <= messages <= last_seq - first_seq + 1 (sparse bundles leave gaps), min_ts_ms <= max_ts_ms; index entries in
strictly increasing seq and position order, inside the run (first_seq < seq <= last_seq, 0 < position <
length_bytes). decode_block also checks that each run is whole records and that every index entry is at a record
boundary.

Reading the footer of a stored block (what `tiered catalog rebuild` does) takes the tail of the object only: GET the
last FOOTER_TRAILER_BYTES (or more, as a guess), ask block_tail_bytes() how many tail bytes the footer needs, GET
again if the first read was short, then read_block_footer(tail, object_size).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiered.catalog.blocks import RunMeta, RunRow
from tiered.protocol.bundle import bundle_seq_range, maybe_record, read_bundle_header
from tiered.protocol.codes import UINT64_MAX
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import encode_uvarint, maybe_varint
from tiered.storage.topics import is_valid_topic_name
from tiered.tiering.objects.store import Piece

MAGIC = b"TIEREDB1"
FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)
INDEX_EVERY_BYTES = 64 << 10  # a bundle index entry once this many bytes of a run passed since the last one

FOOTER_HEADER = struct.Struct("<I")  # run_count
TOPIC_LEN = struct.Struct("<B")  # str8 length prefix
# partition, from_seq, first_seq, last_seq, position, length_bytes, messages, min_ts_ms, max_ts_ms, leader_epoch
RUN_ENTRY = struct.Struct("<HQQQQQIQQQ")
# Version 1: partition, first_seq, last_seq, position, length_bytes, messages, min_ts_ms, max_ts_ms
RUN_ENTRY_V1 = struct.Struct("<HQQQQIQQ")
TRAILER = struct.Struct("<II B 8s")  # footer_bytes, footer_crc32, version, magic
FOOTER_TRAILER_BYTES = TRAILER.size

_MAX_U32 = 0xFFFF_FFFF

class RunFacts(Protocol):
    """What the footer records of a run: a RunMeta, or the block builder's PendingRun itself (no copy per run)."""

    topic: str
    partition: int
    from_seq: int
    first_seq: int
    last_seq: int
    messages: int
    min_ts_ms: int
    max_ts_ms: int
    leader_epoch: int


IndexEntries = Sequence[tuple[int, int]]  # (first seq of a bundle, its position in the run), position > 0


@dataclass(frozen=True, slots=True)
class RunIndex:
    """A run's bundle index as a reader uses it: entry 0 is the run's start (first_seq, 0), then the footer's
    entries; `seqs` and `positions` strictly increase, positions are relative to the run's start."""

    seqs: tuple[int, ...]
    positions: tuple[int, ...]
    length_bytes: int  # of the run


def run_index_of(records, first_seq: int, every: int = INDEX_EVERY_BYTES) -> list[tuple[int, int]]:
    """The bundle index entries of a run's records (whole records whose first bundle starts at `first_seq`), by the
    rule of the format: an entry at each bundle boundary at least `every` bytes past the previous entry. Reads
    every bundle header; the block builder keeps the same entries as records arrive (PendingRun.index)."""
    view = memoryview(records)
    entries: list[tuple[int, int]] = []
    position, last_entry, next_seq = 0, 0, first_seq
    while position < len(view):
        got = maybe_record(view, position)
        if got is None:
            raise ProtocolError("truncated record", position)
        first, last = bundle_seq_range(read_bundle_header(view[got[0] : got[1]]), next_seq)
        if position - last_entry >= every:
            entries.append((first, position))
            last_entry = position
        position, next_seq = got[1], last + 1
    return entries


def encode_block(runs: Sequence[tuple[RunMeta, bytes]],
                 indexes: Sequence[IndexEntries] | None = None) -> tuple[bytes, list[RunRow]]:
    """The block object holding `runs` in the given order, and each run as the footer lists it (with its position).

    Each run's bytes must be whole `{varint len, bundle}` records (ProtocolError otherwise); bad metadata is a
    ValueError. A block has at least one run; runs of one partition come in increasing seq order. `indexes`: each
    run's bundle index entries as the builder kept them; without it they are read from the runs' bundles
    (run_index_of). Entries must increase inside the run (ValueError) and be at record boundaries (ProtocolError).
    """
    pieces, rows = encode_block_pieces([(meta, [records]) for meta, records in runs], indexes)
    return b"".join(pieces), rows


def encode_block_pieces(runs: Sequence[tuple[RunFacts, Sequence[Piece]]],
                        indexes: Sequence[IndexEntries] | None = None) -> tuple[list[Piece], list[RunRow]]:
    """encode_block for runs given as lists of records, returned as the pieces whose concatenation is the object
    (the records themselves, then footer and trailer): the upload writes them out without joining them."""
    if not runs:
        raise ValueError("a block needs at least one run")
    if indexes is not None and len(indexes) != len(runs):
        raise ValueError(f"{len(indexes)} bundle indexes for {len(runs)} runs")
    rows: list[RunRow] = []
    pieces: list[Piece] = []
    footer = bytearray(FOOTER_HEADER.pack(len(runs)))
    last_of: dict[tuple[str, int], int] = {}
    # One pass over the runs, a block of thousands of partitions as one of a few: per distinct topic its name is
    # checked and encoded once (the str8 that opens each of its footer entries), and a run without index entries
    # (the common case: under INDEX_EVERY_BYTES) skips the entry loop.
    topic_str8: dict[str, bytes] = {}
    pack_entry, append_row, extend_pieces = RUN_ENTRY.pack, rows.append, pieces.extend
    position = 0
    for i, (meta, records) in enumerate(runs):
        topic, partition = meta.topic, meta.partition
        str8 = topic_str8.get(topic)
        if str8 is None:
            str8 = topic_str8[topic] = _topic_str8(topic)
        _check_meta_numbers(meta)
        key = (topic, partition)
        before = last_of.get(key)
        if before is not None and meta.from_seq <= before:
            raise ValueError(f"runs of {topic}/{partition} overlap or are out of order in one block")
        last_of[key] = meta.last_seq
        length = sum(map(len, records))
        if indexes is None:
            # Runs under one index interval need no entry, so their bundles need no reading.
            entries = run_index_of(b"".join(records), meta.first_seq) if length > INDEX_EVERY_BYTES else []
        else:
            entries = indexes[i]
        what = f"run {topic}/{partition}"
        if entries:
            _check_index(entries, meta.first_seq, meta.last_seq, length, what, ValueError)
        _check_record_pieces(records, what, [entry_position for _, entry_position in entries])
        row = RunRow(topic, partition, meta.from_seq, meta.first_seq, meta.last_seq, meta.messages, meta.min_ts_ms,
                     meta.max_ts_ms, meta.leader_epoch, position, length)
        footer += str8
        footer += pack_entry(
            partition, row.from_seq, row.first_seq, row.last_seq, position, length, row.messages, row.min_ts_ms,
            row.max_ts_ms, row.leader_epoch,
        )  # fmt: skip
        if entries:
            footer += encode_uvarint(len(entries))
            seq, position_before = meta.first_seq, 0
            for entry_seq, entry_position in entries:
                footer += encode_uvarint(entry_seq - seq) + encode_uvarint(entry_position - position_before)
                seq, position_before = entry_seq, entry_position
        else:
            footer.append(0)  # index_count 0
        append_row(row)
        extend_pieces(records)
        position += length
    if len(footer) > _MAX_U32:
        raise ValueError("block footer exceeds 4 GiB")
    pieces.append(bytes(footer))
    pieces.append(TRAILER.pack(len(footer), zlib.crc32(footer), FORMAT_VERSION, MAGIC))
    return pieces, rows


def block_tail_bytes(tail) -> int:
    """How many bytes at the end of the object hold the footer and trailer, from a tail of at least the trailer."""
    footer_bytes, _, _ = _read_trailer(tail)
    return footer_bytes + FOOTER_TRAILER_BYTES


def read_block_footer(tail, object_size: int) -> list[RunRow]:
    """The runs of a block of `object_size` bytes, from its last bytes (`tail`: at least block_tail_bytes(tail))."""
    return [row for row, _ in read_block_indexes(tail, object_size)]


def read_block_indexes(tail, object_size: int) -> list[tuple[RunRow, RunIndex | None]]:
    """read_block_footer's runs, each with its bundle index (None in a block of version 1 or 2)."""
    tail = memoryview(tail)
    if len(tail) > object_size:
        raise ProtocolError(f"block tail of {len(tail)} bytes is longer than the object ({object_size} bytes)")
    tail_start = object_size - len(tail)  # object position of tail[0]; positions in errors are object positions
    footer_bytes, crc, version = _read_trailer(tail, tail_start)
    footer_start = object_size - FOOTER_TRAILER_BYTES - footer_bytes
    if footer_start < 0:
        raise ProtocolError(f"block footer length {footer_bytes} exceeds the object", object_size - len(tail))
    if footer_start < tail_start:
        needed = footer_bytes + FOOTER_TRAILER_BYTES
        raise ProtocolError(f"block tail too short: the footer needs the last {needed} bytes", tail_start)
    footer = tail[footer_start - tail_start : len(tail) - FOOTER_TRAILER_BYTES]
    if zlib.crc32(footer) != crc:
        raise ProtocolError("block footer CRC mismatch", footer_start)
    return _read_footer(footer, footer_start, version)


def decode_block(data) -> list[tuple[RunRow, memoryview]]:
    """Every run of a whole block object with its bytes (views into `data`), each checked to be whole records."""
    data = memoryview(data)
    out = []
    for info, index in read_block_indexes(data, len(data)):
        boundaries = [info.position + p for p in index.positions[1:]] if index is not None else []
        _check_records(data, info.position, f"run {info.topic}/{info.partition}", info.position + info.length_bytes,
                       boundaries)
        out.append((info, data[info.position : info.position + info.length_bytes]))
    return out


def _read_trailer(tail, tail_start: int = 0) -> tuple[int, int, int]:
    if len(tail) < FOOTER_TRAILER_BYTES:
        raise ProtocolError(f"block shorter than its {FOOTER_TRAILER_BYTES}-byte trailer", tail_start)
    trailer_start = len(tail) - FOOTER_TRAILER_BYTES
    footer_bytes, crc, version, magic = TRAILER.unpack_from(tail, trailer_start)
    if magic != MAGIC:
        raise ProtocolError(f"bad block magic {magic!r}", tail_start + len(tail) - len(MAGIC))
    if version not in READ_VERSIONS:
        raise ProtocolError(f"unknown block format version {version}", tail_start + trailer_start + 8)
    if footer_bytes < FOOTER_HEADER.size:
        raise ProtocolError(f"block footer length {footer_bytes} is too small", tail_start + trailer_start)
    return footer_bytes, crc, version


def _read_entry(footer: memoryview, at: int, topic: str, version: int) -> RunRow:
    if version == 1:
        partition, first, last, position, length, messages, low, high = RUN_ENTRY_V1.unpack_from(footer, at)
        return RunRow(topic, partition, first, first, last, messages, low, high, 0, position, length)
    partition, from_seq, first, last, position, length, messages, low, high, epoch = RUN_ENTRY.unpack_from(footer, at)
    return RunRow(topic, partition, from_seq, first, last, messages, low, high, epoch, position, length)


def _read_footer(footer: memoryview, footer_start: int, version: int) -> list[tuple[RunRow, RunIndex | None]]:
    entry = RUN_ENTRY_V1 if version == 1 else RUN_ENTRY
    indexed = version >= 3
    (run_count,) = FOOTER_HEADER.unpack_from(footer, 0)
    if run_count == 0:
        raise ProtocolError("block footer lists no runs", footer_start)
    # Each entry takes at least 2 + RUN_ENTRY bytes (+ 1 for an empty index): refuse a count the footer cannot hold
    # before looping on it.
    if run_count * (TOPIC_LEN.size + 1 + entry.size + indexed) > len(footer) - FOOTER_HEADER.size:
        raise ProtocolError(f"block footer too short for {run_count} runs", footer_start)
    runs: list[tuple[RunRow, RunIndex | None]] = []
    last_of: dict[tuple[str, int], int] = {}
    at = FOOTER_HEADER.size
    expected_position = 0
    for i in range(run_count):
        entry_at = footer_start + at
        if at + TOPIC_LEN.size > len(footer):
            raise ProtocolError(f"truncated topic of run {i}", entry_at)
        (topic_len,) = TOPIC_LEN.unpack_from(footer, at)
        at += TOPIC_LEN.size
        if at + topic_len + entry.size > len(footer):
            raise ProtocolError(f"truncated entry of run {i}", entry_at)
        raw_topic = bytes(footer[at : at + topic_len])
        topic = raw_topic.decode("latin-1")
        if not raw_topic.isascii() or not is_valid_topic_name(topic):
            raise ProtocolError(f"invalid topic name {raw_topic!r} in run {i}", entry_at)
        at += topic_len
        info = _read_entry(footer, at, topic, version)
        at += entry.size
        where = f"run {i} ({info.topic}/{info.partition})"
        before = last_of.get((info.topic, info.partition))
        if before is not None and info.from_seq <= before:
            raise ProtocolError(f"{where}: overlaps or precedes the partition's earlier run", entry_at)
        last_of[(info.topic, info.partition)] = info.last_seq
        if info.position != expected_position:
            raise ProtocolError(f"{where}: position {info.position}, expected {expected_position}", entry_at)
        if info.length_bytes == 0:
            raise ProtocolError(f"{where}: empty run", entry_at)
        if not info.from_seq <= info.first_seq <= info.last_seq:
            span = f"{info.from_seq}/{info.first_seq}/{info.last_seq}"
            raise ProtocolError(f"{where}: from/first/last seqs {span} out of order", entry_at)
        if not 1 <= info.messages <= info.last_seq - info.first_seq + 1:
            span = f"{info.first_seq}-{info.last_seq}"
            raise ProtocolError(f"{where}: {info.messages} messages in seq range {span}", entry_at)
        if info.min_ts_ms > info.max_ts_ms:
            raise ProtocolError(f"{where}: min timestamp {info.min_ts_ms} > max {info.max_ts_ms}", entry_at)
        expected_position += info.length_bytes
        index = None
        if indexed:
            index, at = _read_index(footer, at, footer_start, info, where)
        runs.append((info, index))
    if at != len(footer):
        raise ProtocolError(f"{len(footer) - at} stray bytes after the last run entry", footer_start + at)
    if expected_position != footer_start:
        raise ProtocolError(f"runs end at {expected_position} but the footer starts at {footer_start}", footer_start)
    return runs


def _read_index(footer: memoryview, at: int, footer_start: int, info: RunRow,
                where: str) -> tuple[RunIndex, int]:
    """The bundle index of run `info` at footer position `at`, and the footer position after it."""
    count, at = _read_uvarint(footer, at, footer_start, f"{where}: index length")
    # Each entry takes at least 2 bytes: refuse a count the footer cannot hold before looping on it.
    if count > (len(footer) - at) // 2:
        raise ProtocolError(f"{where}: {count} index entries do not fit the footer", footer_start + at)
    seqs, positions = [info.first_seq], [0]
    for _ in range(count):
        seq_delta, at = _read_uvarint(footer, at, footer_start, f"{where}: index entry")
        position_delta, at = _read_uvarint(footer, at, footer_start, f"{where}: index entry")
        seqs.append(seqs[-1] + seq_delta)
        positions.append(positions[-1] + position_delta)
    entries = list(zip(seqs[1:], positions[1:]))
    _check_index(entries, info.first_seq, info.last_seq, info.length_bytes, where,
                 lambda message: ProtocolError(message, footer_start + at))
    return RunIndex(tuple(seqs), tuple(positions), info.length_bytes), at


def _check_index(entries: IndexEntries, first_seq: int, last_seq: int, length: int, what: str,
                 error: Callable[[str], Exception]) -> None:
    """Entries strictly increase in seq and position, inside the run: first_seq < seq <= last_seq and
    0 < position < length (the run's start is the implicit entry, so it is never listed)."""
    seq, position = first_seq, 0
    for entry_seq, entry_position in entries:
        if not seq < entry_seq <= last_seq or not position < entry_position < length:
            raise error(f"{what}: index entry ({entry_seq}, {entry_position}) does not follow ({seq}, {position}) "
                        f"inside seqs {first_seq}-{last_seq} and {length} bytes")
        seq, position = entry_seq, entry_position


def _read_uvarint(buf: memoryview, at: int, base: int, what: str) -> tuple[int, int]:
    value, shift = 0, 0
    for i in range(at, min(at + 10, len(buf))):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value > UINT64_MAX:
                raise ProtocolError(f"{what}: varint exceeds 64 bits", base + at)
            return value, i + 1
        shift += 7
    raise ProtocolError(f"{what}: truncated or overlong varint", base + at)


def _check_record_pieces(records: Sequence[Piece], what: str, boundaries: Sequence[int]) -> None:
    """_check_records over the concatenation of `records` (at least one piece, each whole records), without joining
    them. A piece that is exactly one record with a one- or two-byte length (what the append path hands over) is
    checked inline, and may hold a boundary only at its start; any other goes through _check_records."""
    if not records:
        raise ProtocolError(f"{what}: no records", 0)
    pending = list(boundaries)
    at, offset = 0, 0
    for record in records:
        size = len(record)
        end = offset + size
        inside = []
        while at < len(pending) and pending[at] < end:
            inside.append(pending[at] - offset)
            at += 1
        single = size >= 2 and (
            record[0] == size - 1 < 0x80
            or (size > 2 and record[0] >= 0x80 and record[1] < 0x80
                and (record[0] & 0x7F) | record[1] << 7 == size - 2)
        )  # fmt: skip
        if not single:
            _check_records(memoryview(record), 0, what, boundaries=inside)
        elif inside and inside != [0]:
            bad = next(b for b in inside if b != 0) + offset
            raise ProtocolError(f"{what}: index entry at {bad} is inside a record", bad)
        offset = end
    if at < len(pending):
        raise ProtocolError(f"{what}: index entry at {pending[at]} is past the last record", pending[at])


def _check_records(buf: memoryview, start: int, what: str, end: int | None = None,
                   boundaries: Sequence[int] = ()) -> None:
    """`buf[start:end]` is a non-empty sequence of whole `{varint len, bundle}` records, and every position of
    `boundaries` (increasing, inside the range) is where one of them starts.

    Runs every block through, so the common one- and two-byte lengths are read inline (several times faster than calling
    maybe_record per record on an 8 MiB block); longer varints go through the shared reader.
    """
    end = len(buf) if end is None else end
    view = buf[:end]
    if start >= end:
        raise ProtocolError(f"{what}: no records", start)
    position = start
    pending = iter(boundaries)
    boundary = next(pending, None)
    while position < end:
        if boundary is not None and boundary <= position:
            if boundary < position:
                raise ProtocolError(f"{what}: index entry at {boundary} is inside a record", boundary)
            boundary = next(pending, None)
        size = view[position]
        if size < 0x80:
            bundle_start = position + 1
        elif position + 1 < end and view[position + 1] < 0x80:
            size = (size & 0x7F) | view[position + 1] << 7
            bundle_start = position + 2
        else:
            got = maybe_varint(view, position)
            if got is None:
                raise ProtocolError(f"{what}: truncated record", position)
            size, bundle_start = got
        if size == 0:
            raise ProtocolError(f"{what}: zero-length bundle", position)
        if bundle_start + size > end:
            raise ProtocolError(f"{what}: truncated record", position)
        position = bundle_start + size
    if boundary is not None:
        raise ProtocolError(f"{what}: index entry at {boundary} is past the last record", boundary)


def _topic_str8(topic: str) -> bytes:
    """A valid topic name as the footer writes it (u8 length, then its ASCII bytes); ValueError otherwise."""
    if not topic.isascii() or not is_valid_topic_name(topic):
        raise ValueError(f"invalid topic name: {topic!r}")
    name = topic.encode("ascii")
    return TOPIC_LEN.pack(len(name)) + name


def _check_meta_numbers(meta: RunFacts) -> None:
    """A run's partition, seqs, epoch, messages and timestamps are in range (its topic: _topic_str8)."""
    if not 0 <= meta.partition <= 0xFFFF:
        raise ValueError(f"partition out of range: {meta.partition}")
    if not 0 <= meta.from_seq <= meta.first_seq <= meta.last_seq <= UINT64_MAX:
        raise ValueError(f"bad seq range {meta.from_seq}/{meta.first_seq}-{meta.last_seq}")
    if not 0 <= meta.leader_epoch <= UINT64_MAX:
        raise ValueError(f"bad leader epoch {meta.leader_epoch}")
    if not 1 <= meta.messages <= min(meta.last_seq - meta.first_seq + 1, _MAX_U32):
        raise ValueError(f"{meta.messages} messages do not fit seq range {meta.first_seq}-{meta.last_seq}")
    if not 0 <= meta.min_ts_ms <= meta.max_ts_ms <= UINT64_MAX:
        raise ValueError(f"bad timestamp range {meta.min_ts_ms}-{meta.max_ts_ms}")
