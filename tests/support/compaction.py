"""Compaction tests' helpers: workloads, an independent reference model, and TANK-format checks of segment files.

The model is written from docs/protocol.md §10 and the issue, not from tiered.storage.compaction_plan: over the
compacted range (every sealed segment), keyless messages (no key or an empty one) stay; of a key's messages only
the one with the highest seq stays; a latest message with an empty value (a tombstone) stays until
`retention_ms` after the first pass that saw it; if nothing at all would stay, the range's last message does.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import snappy

from tiered.protocol.bundle import CODEC_SNAPPY, Message, decode_bundle, encode_bundle, maybe_record
from tiered.protocol.varint import read_varint
from tiered.storage.index import IndexBuilder
from tiered.storage.names import IlogName, LogName, parse_name
from tiered.storage.partition_log import PartitionLog

Row = tuple[int, bytes | None, bytes, int]  # (seq, key, value, ts_ms)


def rows(messages) -> list[Row]:
    return [(m.seq, m.key, m.value, m.ts_ms) for m in messages]


def log_messages(log: PartitionLog, first: int = 1, last: int | None = None) -> list[Message]:
    """Every message the log holds from `first` to `last` (default: the last assigned seq), with its seq."""
    last = log.last_assigned if last is None else last
    out = []
    for record in log.iter_records(first, last):
        start, end = maybe_record(record.record)
        out.extend(m for m in decode_bundle(record.record[start:end], record.first_seq) if first <= m.seq <= last)
    return out


class Model:
    """The reference: what a pass keeps of the sealed range, with the first-pass time of every seq it saw."""

    def __init__(self, retention_ms: int):
        self.retention_ms = retention_ms
        self.first_seen_ms: dict[int, int] = {}

    def compact(self, messages: list[Message], now_ms: int) -> list[Message]:
        latest: dict[bytes, int] = {}
        for m in messages:
            if m.key:
                latest[m.key] = m.seq
        kept = []
        for m in messages:
            self.first_seen_ms.setdefault(m.seq, now_ms)
            if not m.key:
                kept.append(m)
            elif latest[m.key] != m.seq:
                continue
            elif m.value:
                kept.append(m)
            elif self.first_seen_ms[m.seq] + self.retention_ms > now_ms:
                kept.append(m)
        if messages and not kept:
            kept = [messages[-1]]
        return kept


def latest_per_key(messages: list[Message]) -> list[Message]:
    """The snapshot of messages in seq order (docs/compaction.md): every keyless message, and the latest message of
    each key unless its value is empty (a tombstone: the key is gone)."""
    latest: dict[bytes, Message] = {}
    for m in messages:
        if m.key:
            latest[m.key] = m
    return [m for m in messages if not m.key or (latest[m.key] is m and m.value)]


# ------------------------------------------------------------------------------------------------ workloads


@dataclass(frozen=True)
class Bundle:
    messages: tuple[tuple[bytes | None, bytes], ...]  # (key, value)
    codec: int  # 0 or 1
    gap: int  # > 0: a sparse bundle whose messages are this far apart, starting this far past the last seq
    seal_after: bool


def append_workload(log: PartitionLog, bundles: list[Bundle], ts_ms: int = 1_700_000_000_000) -> None:
    for i, b in enumerate(bundles):
        if b.gap:
            first = log.last_assigned + b.gap
            msgs = [Message(v, k, ts_ms + i, first + j * b.gap) for j, (k, v) in enumerate(b.messages)]
            log.append(encode_bundle(msgs, codec=b.codec, sparse=True))
        else:
            log.append(encode_bundle([Message(v, k, ts_ms + i) for k, v in b.messages], codec=b.codec))
        if b.seal_after:
            log.seal_active()


def random_workload(rng: random.Random, bundles: int, keys: int, *, tombstone_share: float = 0.1,
                    keyless_share: float = 0.1, value_bytes: int = 20) -> list[Bundle]:
    out = []
    for _ in range(bundles):
        msgs = []
        for _ in range(rng.randint(1, 20)):
            roll = rng.random()
            if roll < keyless_share:
                key = rng.choice([None, b""])
            else:
                key = b"key-%d" % rng.randrange(keys)
            value = b"" if key and rng.random() < tombstone_share else rng.randbytes(rng.randint(0, value_bytes))
            msgs.append((key, value))
        out.append(Bundle(tuple(msgs), CODEC_SNAPPY if rng.random() < 0.3 else 0,
                          rng.choice([0, 0, 0, 1, 3]), rng.random() < 0.1))
    return out


# ---------------------------------------------------------------------------------------- TANK format checks


def _message_flags(message_set: bytes, count: int, sparse: bool) -> list[int]:
    """The flags byte of every message, walking the message set as TANK's broker does (first/last before flag 4)."""
    flags_seen = []
    position = 0
    for i in range(count):
        flags = message_set[position]
        position += 1
        flags_seen.append(flags)
        if sparse and 0 < i < count - 1 and not flags & 4:
            _, position = read_varint(message_set, position)
        if not flags & 2:
            position += 8
        if flags & 1:
            position += 1 + message_set[position]
        size, position = read_varint(message_set, position)
        position += size
    assert position == len(message_set), "message set does not end with its last message"
    return flags_seen


def check_segment_file(path: str, base: int, name_last: int | None, interval: int, index_bytes: bytes) -> list[int]:
    """Byte-level checks of one segment and its index against docs/protocol.md §4 and §7; returns its message seqs."""
    with open(path, "rb") as f:
        data = f.read()
    builder = IndexBuilder(interval)
    position = 0
    next_seq = base
    seqs: list[int] = []
    while position < len(data):
        length, start = read_varint(data, position)
        bundle = data[start : start + length]
        assert len(bundle) == length, f"{path}: truncated bundle at {position}"
        flags = bundle[0]
        assert flags & 0x80 == 0 and flags & 0x03 in (0, 1), f"{path}: bad bundle flags {flags:#x}"
        count_bits = (flags >> 2) & 0x0F
        p = 1
        if count_bits:
            count = count_bits
        else:
            count, p = read_varint(bundle, p)
            assert count >= 16, f"{path}: a count below 16 belongs in the flag bits"
        sparse = bool(flags & 0x40)
        if sparse:
            first = int.from_bytes(bundle[p : p + 8], "little")
            p += 8
            if count != 1:
                gap, p = read_varint(bundle, p)
                last = first + gap + 1
            else:
                last = first
            assert first >= next_seq, f"{path}: sparse bundle at {position} goes back to {first}"
        else:
            first, last = next_seq, next_seq + count - 1
        body = bundle[p:]
        message_set = snappy.uncompress(body) if flags & 0x03 == CODEC_SNAPPY else body
        for i, message_flags in enumerate(_message_flags(message_set, count, sparse)):
            if not sparse or i in (0, count - 1):
                assert not message_flags & 4, f"{path}: SeqNumPrevPlusOne on message {i} of the bundle at {position}"
        messages = decode_bundle(bundle, first)
        assert (messages[0].seq, messages[-1].seq) == (first, last)
        seqs.extend(m.seq for m in messages)
        builder.add(first - base, position, start + length - position)
        next_seq = last + 1
        position = start + length
    assert seqs, f"{path}: empty segment"
    assert seqs == sorted(set(seqs)), f"{path}: seqs do not strictly increase"
    assert seqs[0] >= base and (name_last is None or seqs[-1] <= name_last), f"{path}: seqs outside its name"
    assert builder.index.to_bytes() == index_bytes, f"{path}: the index is not TANK's for these records"
    return seqs


def check_partition_files(directory: str, interval: int) -> list[tuple[int, int]]:
    """Checks every segment of a partition directory; returns the (base, last) name ranges of the sealed ones."""
    spans = []
    for name in sorted(os.listdir(directory), key=lambda n: getattr(parse_name(n), "base", -1)):
        kind = parse_name(name)
        if not isinstance(kind, (IlogName, LogName)):
            continue
        with open(os.path.join(directory, f"{kind.base}.index"), "rb") as f:
            index_bytes = f.read()
        last = kind.last if isinstance(kind, IlogName) else None
        check_segment_file(os.path.join(directory, name), kind.base, last, interval, index_bytes)
        if isinstance(kind, IlogName):
            spans.append((kind.base, kind.last))
    for (_, last_a), (base_b, _) in zip(spans, spans[1:]):
        assert base_b > last_a, f"sealed segments overlap: {spans}"
    return spans


def segment_bytes(directory: str) -> dict[str, bytes]:
    """Every segment and index file of a directory, by name (to compare directory states)."""
    out = {}
    for name in os.listdir(directory):
        if isinstance(parse_name(name), (IlogName, LogName)) or name.endswith(".index"):
            with open(os.path.join(directory, name), "rb") as f:
                out[name] = f.read()
    return out
