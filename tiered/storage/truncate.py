"""Cutting a partition directory back to a seq: the records past it are another leader's history's to replace.

When a broker reopens a disk whose partition another volume has led since, its records past the last seq its own
epochs committed were never committed (they were answered with an error, or not at all) and the catalog holds
other messages at those seqs. They are removed before the partition is served (tiered.tiering.cluster.startup).

Crash-safety: each step leaves a directory that recovery (recovery.py) opens, and running the whole cut again
finishes it:
1. Segments whose base is past `keep` are deleted, newest first (their index, then their log file), so that what
   remains is always a prefix of the partition.
2. The segment holding `keep` (now the newest) loses its records past `keep`: a sealed `.ilog` is first renamed to
   an active `.log` (recovery treats the newest `.log` as the active segment and walks it), its index is deleted
   (recovery rebuilds a missing index), and the file is truncated at the end of the last record with last seq <=
   `keep`. A record is never split: `keep` is a committed seq, and commits hold whole records. A file with other
   hard links (a local object store's object) is first replaced by a private copy (segment.make_private).
The caller reopens the directory through recovery afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tiered.storage.names import IlogName, LogName, format_index_name, format_log_name, parse_name
from tiered.storage.records import TornRecord, iter_records
from tiered.storage.segment import fsync_dir, make_private


@dataclass
class TruncateReport:
    directory: str
    keep: int
    records: int = 0  # whole records removed (counted in the cut segment only; deleted segments count as files)
    bytes: int = 0
    deleted_files: int = 0


def truncate_partition_dir(directory: str, keep: int) -> TruncateReport:
    report = TruncateReport(directory, keep)
    segments: list[tuple[int, str, LogName | IlogName]] = []
    for filename in os.listdir(directory):
        name = parse_name(filename)
        if isinstance(name, (LogName, IlogName)):
            segments.append((name.base, filename, name))
    segments.sort(key=lambda s: s[0], reverse=True)
    for base, filename, _ in segments:
        if base <= keep:
            break
        report.bytes += os.path.getsize(os.path.join(directory, filename))
        for doomed in (format_index_name(base), filename):
            try:
                os.unlink(os.path.join(directory, doomed))
                report.deleted_files += 1
            except FileNotFoundError:
                pass
    remaining = [s for s in segments if s[0] <= keep]
    if remaining:
        _cut_segment(directory, *remaining[0], keep, report)
    fsync_dir(directory)
    return report


def _cut_segment(directory: str, base: int, filename: str, name: LogName | IlogName, keep: int,
                 report: TruncateReport) -> None:
    path = os.path.join(directory, filename)
    size = os.path.getsize(path)
    end = 0
    removed = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            for record in iter_records(fd, 0, size, base):
                if record.last_seq <= keep:
                    end = record.end
                else:
                    removed += 1
        except TornRecord:
            pass  # a torn tail is past every whole record: recovery cuts it; `end` already stops before it
    finally:
        os.close(fd)
    if end >= size:
        return  # nothing past `keep` in it
    make_private(path)  # a local object store's link to this file keeps its bytes (segment.make_private)
    if isinstance(name, IlogName):
        active = format_log_name(base, name.freeze_ts)
        os.rename(path, os.path.join(directory, active))
        fsync_dir(directory)
        path = os.path.join(directory, active)
    try:
        os.unlink(os.path.join(directory, format_index_name(base)))
    except FileNotFoundError:
        pass
    os.truncate(path, end)
    report.records += removed
    report.bytes += size - end
