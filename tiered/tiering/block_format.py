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
               }
    trailer := footer_bytes:u32                    TRAILER: the footer's length (trailer excluded)
               footer_crc32:u32                    zlib.crc32 of the footer bytes
               version:u8                          FORMAT_VERSION
               magic:8s                            b"TIEREDB1", the object's last 8 bytes

Version 1 (the first release) had no from_seq and no leader_epoch: its runs read as from_seq = first_seq and epoch 0.
A partition may have several runs in one block (its records are split where a local segment rolled, so that each
run lies inside one segment and a remote segment covers its runs exactly); they are in seq order.

Invariants a reader checks, so a damaged or foreign object is refused rather than misread: the magic, the version,
the footer CRC, at least one run, runs laid end to end from position 0 up to the footer in footer order,
from_seq <= first_seq <= last_seq, runs of one partition in increasing seq order without overlap,
1 <= messages <= last_seq - first_seq + 1 (sparse bundles leave gaps), min_ts_ms <= max_ts_ms. decode_block also
checks that each run is whole records.

Reading the footer of a stored block (what `tiered catalog rebuild` does) takes the tail of the object only: GET the
last FOOTER_TRAILER_BYTES (or more, as a guess), ask block_tail_bytes() how many tail bytes the footer needs, GET
again if the first read was short, then read_block_footer(tail, object_size).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from tiered.catalog.blocks import RunMeta, RunRow
from tiered.protocol.codes import UINT64_MAX
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import maybe_varint
from tiered.storage.topics import is_valid_topic_name

MAGIC = b"TIEREDB1"
FORMAT_VERSION = 2

FOOTER_HEADER = struct.Struct("<I")  # run_count
TOPIC_LEN = struct.Struct("<B")  # str8 length prefix
# partition, from_seq, first_seq, last_seq, position, length_bytes, messages, min_ts_ms, max_ts_ms, leader_epoch
RUN_ENTRY = struct.Struct("<HQQQQQIQQQ")
# Version 1: partition, first_seq, last_seq, position, length_bytes, messages, min_ts_ms, max_ts_ms
RUN_ENTRY_V1 = struct.Struct("<HQQQQIQQ")
TRAILER = struct.Struct("<II B 8s")  # footer_bytes, footer_crc32, version, magic
FOOTER_TRAILER_BYTES = TRAILER.size

_MAX_U32 = 0xFFFF_FFFF


def encode_block(runs: Sequence[tuple[RunMeta, bytes]]) -> tuple[bytes, list[RunRow]]:
    """The block object holding `runs` in the given order, and each run as the footer lists it (with its position).

    Each run's bytes must be whole `{varint len, bundle}` records (ProtocolError otherwise); bad metadata is a
    ValueError. A block has at least one run; runs of one partition come in increasing seq order.
    """
    pieces, rows = encode_block_pieces([(meta, [records]) for meta, records in runs])
    return b"".join(pieces), rows


def encode_block_pieces(runs: Sequence[tuple[RunMeta, Sequence[bytes]]]) -> tuple[list[bytes], list[RunRow]]:
    """encode_block for runs given as lists of records, returned as the pieces whose concatenation is the object
    (the records themselves, then footer and trailer): the upload writes them out without joining them."""
    if not runs:
        raise ValueError("a block needs at least one run")
    rows: list[RunRow] = []
    pieces: list[bytes] = []
    footer = bytearray(FOOTER_HEADER.pack(len(runs)))
    last_of: dict[tuple[str, int], int] = {}
    position = 0
    for meta, records in runs:
        _check_meta(meta)
        before = last_of.get((meta.topic, meta.partition))
        if before is not None and meta.from_seq <= before:
            raise ValueError(f"runs of {meta.topic}/{meta.partition} overlap or are out of order in one block")
        last_of[(meta.topic, meta.partition)] = meta.last_seq
        length = _check_record_pieces(records, f"run {meta.topic}/{meta.partition}")
        row = RunRow(**{f: getattr(meta, f) for f in RunMeta.__dataclass_fields__}, position=position,
                     length_bytes=length)
        topic = meta.topic.encode("ascii")
        footer += TOPIC_LEN.pack(len(topic)) + topic
        footer += RUN_ENTRY.pack(
            row.partition, row.from_seq, row.first_seq, row.last_seq, row.position, row.length_bytes,
            row.messages, row.min_ts_ms, row.max_ts_ms, row.leader_epoch,
        )  # fmt: skip
        rows.append(row)
        pieces.extend(records)
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
    runs = read_block_footer(data, len(data))
    out = []
    for info in runs:
        _check_records(data, info.position, f"run {info.topic}/{info.partition}", info.position + info.length_bytes)
        out.append((info, data[info.position : info.position + info.length_bytes]))
    return out


def _read_trailer(tail, tail_start: int = 0) -> tuple[int, int, int]:
    if len(tail) < FOOTER_TRAILER_BYTES:
        raise ProtocolError(f"block shorter than its {FOOTER_TRAILER_BYTES}-byte trailer", tail_start)
    trailer_start = len(tail) - FOOTER_TRAILER_BYTES
    footer_bytes, crc, version, magic = TRAILER.unpack_from(tail, trailer_start)
    if magic != MAGIC:
        raise ProtocolError(f"bad block magic {magic!r}", tail_start + len(tail) - len(MAGIC))
    if version not in (1, FORMAT_VERSION):
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


def _read_footer(footer: memoryview, footer_start: int, version: int) -> list[RunRow]:
    entry = RUN_ENTRY if version == FORMAT_VERSION else RUN_ENTRY_V1
    (run_count,) = FOOTER_HEADER.unpack_from(footer, 0)
    if run_count == 0:
        raise ProtocolError("block footer lists no runs", footer_start)
    # Each entry takes at least 2 + RUN_ENTRY bytes: refuse a count the footer cannot hold before looping on it.
    if run_count * (TOPIC_LEN.size + 1 + entry.size) > len(footer) - FOOTER_HEADER.size:
        raise ProtocolError(f"block footer too short for {run_count} runs", footer_start)
    runs: list[RunRow] = []
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
        runs.append(info)
    if at != len(footer):
        raise ProtocolError(f"{len(footer) - at} stray bytes after the last run entry", footer_start + at)
    if expected_position != footer_start:
        raise ProtocolError(f"runs end at {expected_position} but the footer starts at {footer_start}", footer_start)
    return runs


def _check_record_pieces(records: Sequence[bytes], what: str) -> int:
    """Each piece is whole `{varint len, bundle}` records (at least one piece); returns their total length.

    A piece that is exactly one record with a one- or two-byte length (what the append path hands over) is checked
    inline; any other goes through _check_records.
    """
    if not records:
        raise ProtocolError(f"{what}: no records", 0)
    total = 0
    for record in records:
        size = len(record)
        if size < 2 or not (
            record[0] == size - 1 < 0x80
            or (size > 2 and record[0] >= 0x80 and record[1] < 0x80
                and (record[0] & 0x7F) | record[1] << 7 == size - 2)
        ):  # fmt: skip
            _check_records(memoryview(record), 0, what)
        total += size
    return total


def _check_records(buf: memoryview, start: int, what: str, end: int | None = None) -> None:
    """`buf[start:end]` is a non-empty sequence of whole `{varint len, bundle}` records.

    Runs every block through, so the common one- and two-byte lengths are read inline (several times faster than calling
    maybe_record per record on an 8 MiB block); longer varints go through the shared reader.
    """
    end = len(buf) if end is None else end
    view = buf[:end]
    if start >= end:
        raise ProtocolError(f"{what}: no records", start)
    position = start
    while position < end:
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


def _check_meta(meta: RunMeta) -> None:
    if not meta.topic.isascii() or not is_valid_topic_name(meta.topic):
        raise ValueError(f"invalid topic name: {meta.topic!r}")
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
