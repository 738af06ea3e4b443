"""`tiered verify <files or partition directories>`: check TANK segment files (.log, .ilog) and sparse indexes
(.index), as `tank verify`. A directory stands for the segment and index files in it (`tiered verify data/events/0`).

A log is walked record by record and every bundle is decoded whole: its header, every snappy-compressed message set
decompressed (the claimed length, each element's bounds and copy offsets checked), and every message's flags,
timestamp, key and content framing, with the count the header claims and nothing left over. A bad byte is named
with its file position whenever it breaks any of that. TANK's format carries no checksum, so a byte changed inside
a message's content or timestamp (in a compressed set too: a snappy literal) yields another valid message; only a
copy elsewhere (the bucket's) could tell. An index is checked entry by entry against the log beside it: entries
strictly increase and each one points at the start of the bundle whose first seq it names. Exit status 1 when any
file has a problem. Unlike `tank verify`, message counts are exact (docs/protocol.md §16.8).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tiered.cli.common import Progress, plural
from tiered.protocol.bundle import CODEC_SNAPPY, decode_message_set, maybe_record, message_set, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.storage.index import SparseIndex
from tiered.storage.names import IlogName, IndexName, LogName, parse_name
from tiered.storage.records import iter_records, pread_exact


def register(sub) -> None:
    p = sub.add_parser("verify", help="check segment and index files", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, metavar="PATH",
                   help=".log, .ilog or .index files, or partition directories (every such file in them)")
    p.set_defaults(func=main)


@dataclass
class LogReport:
    bundles: int = 0
    compressed: int = 0  # snappy bundles, each decompressed and decoded
    messages: int = 0
    first_seq: int = 0
    last_seq: int = 0
    problems: list[str] = field(default_factory=list)


def verify_log(path: Path, base: int, expected_last: int | None = None, progress: Progress | None = None) -> LogReport:
    report = LogReport()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        try:
            for info in iter_records(fd, 0, size, base):
                record = pread_exact(fd, info.end - info.position, info.position)
                start, end = maybe_record(record)
                messages = _decode(record[start:end], info.first_seq, info.position + start, report)
                report.bundles += 1
                report.messages += len(messages)
                report.first_seq = report.first_seq or info.first_seq
                report.last_seq = info.last_seq
                if progress is not None:
                    progress.add(info.end - info.position)
        except ProtocolError as exc:
            report.problems.append(f"{exc}")
    finally:
        os.close(fd)
    if report.bundles and report.first_seq < base:
        report.problems.append(f"first seq {report.first_seq} is below the segment base {base}")
    # A compacted segment keeps its name's range while its last messages may be gone (compaction_writer.py).
    if expected_last is not None and report.last_seq > expected_last:
        report.problems.append(f"last seq is {report.last_seq}, the file name says {expected_last}")
    return report


def _decode(bundle: bytes, first_seq: int, position: int, report: LogReport) -> list:
    """Decodes one bundle; a failure names the file position of the bundle (and of the byte, when known)."""
    header = read_bundle_header(bundle)
    try:
        messages = decode_message_set(message_set(bundle, header), header, first_seq)
        report.compressed += header.codec == CODEC_SNAPPY
        return messages
    except ProtocolError as exc:
        where = "its decompressed message set" if header.codec == CODEC_SNAPPY else "its message set"
        raise ProtocolError(f"bundle at file position {position} (seq {first_seq}), {where}: {exc}") from None


def verify_index(path: Path, base: int) -> list[str]:
    problems = []
    data = path.read_bytes()
    try:
        index, partial = SparseIndex.from_bytes(data)
    except ValueError as exc:
        return [str(exc)]
    if partial:
        problems.append(f"{partial} bytes of a partial entry at the end")
    log = _log_beside(path, base)
    if log is None:
        return problems
    starts = {}
    fd = os.open(log, os.O_RDONLY)
    try:
        for info in iter_records(fd, 0, os.fstat(fd).st_size, base):
            starts[info.position] = info.first_seq
    except ProtocolError as exc:
        problems.append(f"{log.name}: {exc}")
    finally:
        os.close(fd)
    for rel_seq, position in index:
        if starts.get(position) != base + rel_seq:
            problems.append(f"entry ({rel_seq}, {position}) does not point at the bundle of seq {base + rel_seq}")
    # A running broker writes the active segment's entries in batches (and all of them at a flush, seal or stop), so
    # the index of a `.log` may lack its last entries, or all of them: recovery re-adds them. A sealed one may not.
    active = isinstance(parse_name(log.name), LogName)
    if len(index) == 0 and starts and not active:
        problems.append("empty index for a non-empty log")
    elif starts and len(index) and next(iter(index))[1] != 0:
        problems.append("the first bundle is not indexed")
    return problems


def _log_beside(index_path: Path, base: int) -> Path | None:
    for candidate in index_path.parent.iterdir():
        name = parse_name(candidate.name)
        if isinstance(name, (LogName, IlogName)) and name.base == base:
            return candidate
    return None


def expand(paths: list[Path]) -> list[Path]:
    """Directories stand for the segment and index files directly in them, in name order."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out += sorted(p for p in path.iterdir() if isinstance(parse_name(p.name), (LogName, IlogName, IndexName)))
        else:
            out.append(path)
    return out


def main(args) -> int:
    failed = 0
    for path in expand(args.files):
        name = parse_name(path.name)
        if not path.is_file():
            print(f"{path}: no such file")
            failed += 1
            continue
        if isinstance(name, (LogName, IlogName)):
            progress = Progress(f"verifying {path.name}", path.stat().st_size, unit="B")
            expected_last = name.last if isinstance(name, IlogName) else None
            report = verify_log(path, name.base, expected_last, progress)
            progress.finish()
            status = "ok" if not report.problems else "BAD"
            print(f"{path}: {status}: {plural(report.bundles, 'bundle')} ({report.compressed} snappy), "
                  f"{plural(report.messages, 'message')}, seqs {report.first_seq}..{report.last_seq}")
            problems = report.problems
        elif isinstance(name, IndexName):
            problems = verify_index(path, name.base)
            entries = path.stat().st_size // 8
            print(f"{path}: {'ok' if not problems else 'BAD'}: {entries} {'entry' if entries == 1 else 'entries'}")
        else:
            print(f"{path}: not a segment or index file name")
            failed += 1
            continue
        for problem in problems:
            print(f"  {problem}")
        failed += bool(problems)
    sys.stdout.flush()
    return 1 if failed else 0
