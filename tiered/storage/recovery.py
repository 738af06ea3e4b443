"""Opening a partition directory after a clean stop or a crash (docs/protocol.md §7 "Startup recovery").

What is checked and repaired, in order:
0. A compaction swap that a crash interrupted is rolled back or forward (compaction_swap.py), so that the
   directory holds either a group's input segments or its output, never both and never neither.
1. Every entry is classified by name (names.py); anything unknown is reported and left alone.
2. A zero-size `.log` (or `.ilog`) holds nothing: it is deleted with its index, as in TANK.
3. Sealed segments are validated cheaply: a name with base <= last, a non-empty file that begins with a whole,
   decodable bundle within its name's seqs (a sealed segment was whole when it was sealed: bytes overwritten at its
   head are damage no cut can repair, RecoveryError, nothing is touched), and an index whose size is
   whole entries and whose last entry points inside the file. A missing or insane index is rebuilt by walking the
   file (which also finds and cuts a damaged tail, renaming the segment if the cut changed its last seq, or if
   it holds seqs above its name). A compacted segment may end below its name's last seq: that is not a damage.
4. The active segment (the `.log` with the highest base; older `.log` files are recovered the same way and then
   sealed) is walked from its last index entry to EOF. That recovers its last seq (and so last_assigned), re-adds
   index entries a crash left out, and finds the last whole bundle. A torn tail (a truncated varint, a truncated
   bundle, an undecodable header) is cut back to the last whole bundle. If the walk cannot even read the record
   the last index entry points at, the index is rebuilt from position 0.
Unlike TANK (which needs TANK_FORCE_SALVAGE_CURSEGMENT=1), the tail is always salvaged, and every cut is reported
in the RecoveryReport and logged as a warning with the bytes cut. A whole bundle is never removed.
Segments whose seq ranges overlap cannot be told apart safely: RecoveryError, nothing is touched.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field

from tiered.storage.index import ENTRY, ENTRY_BYTES, IndexBuilder, SparseIndex
from tiered.storage.compaction_swap import SwapError, resolve_interrupted_swap
from tiered.storage.names import (
    CheckpointName,
    ConfigName,
    Ignored,
    IlogName,
    IndexName,
    LogName,
    PrivateCopy,
    SwapLeftover,
    format_ilog_name,
    parse_name,
)
from tiered.storage.records import ReadAhead, TornRecord, iter_records, read_record_info
from tiered.storage.segment import ActiveSegment, SealedSegment, fsync_dir, make_private, roll_age_s
from tiered.storage.topic_config import TopicConfig

log = logging.getLogger("tiered.storage")


class RecoveryError(Exception):
    """The partition directory cannot be opened without risking data: an operator must look at it."""


@dataclass(frozen=True, slots=True)
class CutTail:
    filename: str
    position: int  # the file now ends here
    bytes_cut: int
    reason: str


@dataclass
class RecoveryReport:
    directory: str
    cut: list[CutTail] = field(default_factory=list)
    rebuilt_indexes: list[str] = field(default_factory=list)
    repaired_indexes: list[str] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)  # (filename, why)
    ignored: list[Ignored] = field(default_factory=list)
    sealed_at_open: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    compaction: list[tuple[str, str]] = field(default_factory=list)  # (what was done, filename): see step 0

    @property
    def bytes_cut(self) -> int:
        return sum(c.bytes_cut for c in self.cut)

    @property
    def clean(self) -> bool:
        repairs = (self.cut, self.rebuilt_indexes, self.repaired_indexes, self.deleted, self.sealed_at_open)
        return not (any(repairs) or self.compaction)


@dataclass
class RecoveredLog:
    sealed: list[SealedSegment]  # oldest first
    active: ActiveSegment | None
    last_assigned: int
    report: RecoveryReport


@dataclass(frozen=True, slots=True)
class _LiveLog:
    """A `.log` made whole."""

    size: int
    last: int
    index: SparseIndex
    since_last_update: int


@dataclass
class _Scan:
    index: SparseIndex
    since_last_update: int
    last_seq: int | None  # of the last whole record, None if there is none
    whole_end: int  # position after the last whole record
    torn: TornRecord | None
    rebuilt: bool


def _walk(fd: int, size: int, base: int, builder: IndexBuilder, start: int, next_seq: int) -> _Scan:
    last_seq = None
    whole_end = start
    torn = None
    try:
        for record in iter_records(fd, start, size, next_seq):
            # Starting at the last index entry, since_last_update is 0, so that record is not indexed twice.
            builder.add(record.first_seq - base, record.position, record.length)
            last_seq = record.last_seq
            whole_end = record.end
    except TornRecord as exc:
        torn = exc
    return _Scan(builder.index, builder.since_last_update, last_seq, whole_end, torn, False)


def scan_segment(fd: int, size: int, base: int, interval: int, index: SparseIndex | None) -> _Scan:
    """Walks a segment from its last index entry (or from 0) to `size`, re-adding index entries on the way."""
    if index is not None and (entry := index.last()) is not None:
        rel_seq, position = entry
        scan = _walk(fd, size, base, IndexBuilder(interval, index, 0), position, base + rel_seq)
        if scan.last_seq is not None:
            return scan
        # The entry does not point at a whole record: either the index is wrong or the tail is torn exactly there.
        # A walk from 0 tells the two apart, and rebuilds the index either way.
    scan = _walk(fd, size, base, IndexBuilder(interval), 0, base)
    scan.rebuilt = True
    return scan


def _load_index(path: str, size: int) -> tuple[SparseIndex | None, bool]:
    """(index or None if missing/empty/insane, whether the file needs rewriting)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, True
    try:
        index, partial = SparseIndex.from_bytes(data)
    except ValueError:
        return None, True
    if not len(index):
        return None, True
    if index.positions[-1] >= size:
        kept = SparseIndex((r, p) for r, p in index if p < size)
        return (kept if len(kept) else None), True
    return index, bool(partial)


def _write_index(path: str, index: SparseIndex) -> None:
    with open(path, "wb") as f:
        f.write(index.to_bytes())
        f.flush()
        os.fsync(f.fileno())


def _cut(path: str, filename: str, size: int, scan: _Scan, report: RecoveryReport) -> int:
    if scan.torn is None:
        return size
    position = scan.whole_end
    make_private(path)  # a local object store's link to this file keeps its bytes
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, position)
        os.fsync(fd)
    finally:
        os.close(fd)
    cut = CutTail(filename, position, size - position, scan.torn.reason)
    report.cut.append(cut)
    log.warning(
        "SALVAGED %s: cut %d bytes after the last whole bundle at position %d (%s); every whole bundle kept",
        os.path.join(report.directory, filename),
        cut.bytes_cut,
        position,
        cut.reason,
    )
    return position


def _unlink_segment(directory: str, filename: str, base: int, why: str, report: RecoveryReport) -> None:
    for name in (filename, f"{base}.index"):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        report.deleted.append((name, why))
        log.warning("deleted %s: %s", os.path.join(directory, name), why)


def _recover_log_file(directory: str, name: LogName, filename: str, interval: int,
                      report: RecoveryReport) -> _LiveLog | None:
    """Makes one `.log` whole; None if nothing is left of it."""
    path = os.path.join(directory, filename)
    make_private(path)  # the active segment is appended to (a sealed one renamed back by truncate.py may be linked)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        index_path = os.path.join(directory, f"{name.base}.index")
        index, dirty = _load_index(index_path, size)
        entries_before = len(index) if index is not None else 0
        scan = scan_segment(fd, size, name.base, interval, index)
    finally:
        os.close(fd)
    size = _cut(path, filename, size, scan, report)
    if scan.last_seq is None:
        _unlink_segment(directory, filename, name.base, "no whole bundle left after the torn tail was cut", report)
        return None
    if scan.rebuilt:
        report.rebuilt_indexes.append(f"{name.base}.index")
        log.warning("rebuilt index %s from its segment", index_path)
    if dirty or scan.rebuilt or len(scan.index) != entries_before:
        if not scan.rebuilt:
            report.repaired_indexes.append(f"{name.base}.index")
        _write_index(index_path, scan.index)
    return _LiveLog(size, scan.last_seq, scan.index, scan.since_last_update)


def _recover_sealed(directory: str, name: IlogName, filename: str, interval: int,
                    report: RecoveryReport) -> SealedSegment | None:
    path = os.path.join(directory, filename)
    st = os.stat(path)
    _check_sealed_head(path, st.st_size, name)
    freeze_ts = name.freeze_ts if name.freeze_ts is not None else int(st.st_mtime)
    index_path = os.path.join(directory, f"{name.base}.index")
    if _sealed_index_is_sane(index_path, st.st_size, name):
        return SealedSegment(directory, name.base, name.last, freeze_ts, st.st_size, filename=filename)
    fd = os.open(path, os.O_RDONLY)
    try:
        scan = scan_segment(fd, st.st_size, name.base, interval, None)
    finally:
        os.close(fd)
    size = _cut(path, filename, st.st_size, scan, report)
    if scan.last_seq is None:
        _unlink_segment(directory, filename, name.base, "sealed segment without a whole bundle", report)
        return None
    _write_index(index_path, scan.index)
    report.rebuilt_indexes.append(f"{name.base}.index")
    log.warning("rebuilt index %s of sealed segment %s", index_path, filename)
    last = name.last
    if scan.last_seq > name.last or (scan.torn is not None and scan.last_seq != name.last):
        last = scan.last_seq
        new_name = format_ilog_name(name.base, last, freeze_ts)
        os.rename(path, os.path.join(directory, new_name))
        report.renamed.append((filename, new_name))
        log.warning("sealed segment %s actually ends at seq %d: renamed to %s", filename, last, new_name)
        filename = new_name
    return SealedSegment(directory, name.base, last, freeze_ts, size, filename=filename, index=scan.index)


class _HeadRead(ReadAhead):
    """ReadAhead's interface reading only what is asked (a record's head), not a window: one small pread per sealed
    segment at open."""

    def get(self, position: int, length: int) -> bytes:
        return os.pread(self.fd, min(length, self.end - position), position)


def _check_sealed_head(path: str, size: int, name: IlogName) -> None:
    """A sealed segment begins with a whole, decodable bundle whose first seq is within its name's (one read)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        first = read_record_info(_HeadRead(fd, size), 0, name.base)
    except TornRecord as exc:
        raise RecoveryError(f"{path}: sealed segment does not begin with a whole bundle ({exc.reason}); "
                            "refusing to open") from None
    finally:
        os.close(fd)
    if first.first_seq > name.last:
        raise RecoveryError(f"{path}: sealed segment begins with seq {first.first_seq}, past its name's last "
                            f"({name.last}); refusing to open")


def _sealed_index_is_sane(index_path: str, size: int, name: IlogName) -> bool:
    try:
        with open(index_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            index_size = f.tell()
            if index_size == 0 or index_size % ENTRY_BYTES:
                return False
            f.seek(index_size - ENTRY_BYTES)
            rel_seq: int
            position: int
            rel_seq, position = ENTRY.unpack(f.read(ENTRY_BYTES))
    except FileNotFoundError:
        return False
    return position < size and name.base + rel_seq <= name.last


def _seal_recovered(directory: str, filename: str, base: int, last: int, size: int,
                    report: RecoveryReport) -> SealedSegment:
    path = os.path.join(directory, filename)
    freeze_ts = int(os.stat(path).st_mtime)
    sealed_name = format_ilog_name(base, last, freeze_ts)
    os.rename(path, os.path.join(directory, sealed_name))
    report.sealed_at_open.append(sealed_name)
    log.warning("%s was not the newest .log: sealed it as %s", os.path.join(directory, filename), sealed_name)
    return SealedSegment(directory, base, last, freeze_ts, size, filename=sealed_name)


def recover_partition(directory: str, config: TopicConfig, rng: random.Random) -> RecoveredLog:
    report = RecoveryReport(directory)
    try:
        report.compaction = resolve_interrupted_swap(directory)
    except SwapError as exc:
        raise RecoveryError(str(exc)) from None
    for action, filename in report.compaction:
        log.warning("compaction swap interrupted in %s: %s %s", directory, filename, action)
    logs: list[tuple[LogName, str]] = []
    ilogs: list[tuple[IlogName, str]] = []
    for filename in sorted(os.listdir(directory)):
        kind = parse_name(filename)
        if isinstance(kind, (LogName, IlogName)) and not os.path.isfile(os.path.join(directory, filename)):
            kind = Ignored(filename, "segment name on something that is not a regular file")
        if isinstance(kind, LogName):
            logs.append((kind, filename))
        elif isinstance(kind, IlogName):
            ilogs.append((kind, filename))
        elif isinstance(kind, Ignored):
            report.ignored.append(kind)
            log.warning("ignoring %s: %s", os.path.join(directory, filename), kind.reason)
        elif isinstance(kind, PrivateCopy):  # a crash during make_private: the segment itself is whole
            os.unlink(os.path.join(directory, filename))
            report.deleted.append((filename, "unfinished private copy of a segment"))
        else:
            assert isinstance(kind, (IndexName, ConfigName, CheckpointName, SwapLeftover))

    _check_no_overlap(directory, [(n.base, n.last, f) for n, f in ilogs], [(n.base, f) for n, f in logs])

    interval = config.log_index_interval_bytes
    sealed: list[SealedSegment] = []
    for ilog, filename in sorted(ilogs, key=lambda item: item[0].base):
        if os.path.getsize(os.path.join(directory, filename)) == 0:
            _unlink_segment(directory, filename, ilog.base, "zero-size sealed segment", report)
            continue
        segment = _recover_sealed(directory, ilog, filename, interval, report)
        if segment is not None:
            sealed.append(segment)

    live_logs: list[tuple[LogName, str, _LiveLog]] = []
    for name, filename in sorted(logs, key=lambda item: item[0].base):
        if os.path.getsize(os.path.join(directory, filename)) == 0:
            _unlink_segment(directory, filename, name.base, "zero-size segment", report)
            continue
        recovered = _recover_log_file(directory, name, filename, interval, report)
        if recovered is not None:
            live_logs.append((name, filename, recovered))

    # Only the newest .log is active; any other one (a crash between TANK's rename and create, or files copied in
    # by hand) is sealed now, so that segments stay in seq order with the active one last.
    newest_sealed_base = max((s.base for s in sealed), default=0)
    active_state: tuple[LogName, str, _LiveLog] | None = None
    for i, (name, filename, state) in enumerate(live_logs):
        if i < len(live_logs) - 1 or name.base < newest_sealed_base:
            sealed.append(_seal_recovered(directory, filename, name.base, state.last, state.size, report))
        else:
            active_state = (name, filename, state)
    sealed.sort(key=lambda s: s.base)
    spans = [(s.base, s.last, s.filename) for s in sealed]
    if active_state is not None:
        name, filename, state = active_state
        spans.append((name.base, state.last, filename))
    _check_no_overlap(directory, spans, [])
    if not report.clean:
        fsync_dir(directory)

    active = None
    if active_state is not None:
        created_ts = name.created_ts
        if created_ts is None:
            created_ts = int(os.stat(os.path.join(directory, filename)).st_mtime)
        active = ActiveSegment.reopen(
            directory,
            filename,
            name.base,
            created_ts,
            roll_age_s(config, rng),
            size=state.size,
            last=state.last,
            index=state.index,
            since_last_update=state.since_last_update,
        )
        last_assigned = state.last
    elif sealed:
        last_assigned = sealed[-1].last
    else:
        last_assigned = 0
    return RecoveredLog(sealed, active, last_assigned, report)


def _check_no_overlap(directory: str, ilogs: list[tuple[int, int, str]], logs: list[tuple[int, str]]) -> None:
    """Segments must cover disjoint, increasing seq ranges. A .log's last seq is unknown yet: only its base counts."""
    spans = sorted([(base, last, f) for base, last, f in ilogs] + [(base, base, f) for base, f in logs])
    for (base_a, last_a, file_a), (base_b, _, file_b) in zip(spans, spans[1:]):
        if base_b <= last_a:
            raise RecoveryError(f"{directory}: {file_a} and {file_b} overlap (seq {base_b}); refusing to open")
