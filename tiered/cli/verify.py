"""`tiered verify <files>`: check TANK segment files (.log, .ilog) and sparse indexes (.index), as `tank verify`.

A log is walked record by record; every bundle is decoded whole (snappy included), so a bad byte anywhere is found
and named with its position. An index is checked entry by entry against the log beside it: entries strictly
increase and each one points at the start of the bundle whose first seq it names. Exit status 1 when any file has
a problem. Unlike `tank verify`, message counts are exact (PROTOCOL.md §16.8).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tiered.cli.common import Progress
from tiered.protocol.bundle import decode_bundle, maybe_record
from tiered.protocol.errors import ProtocolError
from tiered.storage.index import SparseIndex
from tiered.storage.names import IlogName, IndexName, LogName, parse_name
from tiered.storage.records import iter_records, pread_exact


def register(sub) -> None:
    p = sub.add_parser("verify", help="check segment and index files")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help=".log, .ilog or .index files")
    p.set_defaults(func=main)


@dataclass
class LogReport:
    bundles: int = 0
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
                messages = decode_bundle(record[start:end], info.first_seq)
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
    if len(index) == 0 and starts:
        problems.append("empty index for a non-empty log")
    elif starts and next(iter(index))[1] != 0:
        problems.append("the first bundle is not indexed")
    return problems


def _log_beside(index_path: Path, base: int) -> Path | None:
    for candidate in index_path.parent.iterdir():
        name = parse_name(candidate.name)
        if isinstance(name, (LogName, IlogName)) and name.base == base:
            return candidate
    return None


def main(args) -> int:
    failed = 0
    for path in args.files:
        name = parse_name(path.name)
        if not path.is_file():
            print(f"{path}: no such file")
            failed += 1
            continue
        if isinstance(name, (LogName, IlogName)):
            progress = Progress(f"verifying {path.name} (bytes)", path.stat().st_size)
            expected_last = name.last if isinstance(name, IlogName) else None
            report = verify_log(path, name.base, expected_last, progress)
            progress.finish()
            status = "ok" if not report.problems else "BAD"
            print(f"{path}: {status}: {report.bundles} bundles, {report.messages} messages, "
                  f"seqs {report.first_seq}..{report.last_seq}")
            problems = report.problems
        elif isinstance(name, IndexName):
            problems = verify_index(path, name.base)
            entries = path.stat().st_size // 8
            print(f"{path}: {'ok' if not problems else 'BAD'}: {entries} entries")
        else:
            print(f"{path}: not a segment or index file name")
            failed += 1
            continue
        for problem in problems:
            print(f"  {problem}")
        failed += bool(problems)
    sys.stdout.flush()
    return 1 if failed else 0
