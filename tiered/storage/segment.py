"""Segments: the appendable ActiveSegment (`<base>_<createdTS>.log`) and immutable SealedSegments
(`<base>-<last>_<freezeTS>.ilog`), each with its `<base>.index` (names.py, index.py, docs/protocol.md §7).

Readers get one shared read-only file object per segment (`reader()`); they must read with explicit positions
(os.pread, os.sendfile) and never close it. It survives the roll (a rename keeps the inode). Retention only drops
the segment's own reference: the file closes itself once the last holder (a ReadRange being streamed) lets go, so
a descriptor is never closed, and its number reused, under a sendfile in flight. PartitionLog.close() closes all.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import random
import shutil

from tiered.storage.index import NEVER_INDEXED, SparseIndex
from tiered.storage.names import PRIVATE, format_ilog_name, format_index_name, format_log_name
from tiered.storage.appender import appender_class
from tiered.storage.topic_config import TopicConfig

log = logging.getLogger("tiered.storage")

MIN_ROLL_AGE_S = 3600
DEFAULT_ROLL_AGE_S = 7 * 86400
_COPY_CALL_BYTES = 64 << 20  # asked of one copy_file_range call (copy_file)
_COPY_BUFFER_BYTES = 1 << 20  # the buffer of copy_file where copy_file_range is refused
# How a kernel or filesystem says it cannot copy_file_range these two files (copy_file).
_NO_COPY_FILE_RANGE = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF)


def roll_age_s(config: TopicConfig, rng: random.Random) -> int:
    """TANK's time-roll age of a new segment: max(rand(0..jitter), 1 h) with jitter, else 1 week.

    `log.roll.secs` is deliberately ignored, as in TANK (`roll()` uses max(1 h, 1 week)).
    """
    if config.log_roll_jitter_secs:
        return max(rng.randint(0, config.log_roll_jitter_secs), MIN_ROLL_AGE_S)
    return max(MIN_ROLL_AGE_S, DEFAULT_ROLL_AGE_S)


class SegmentReader(io.FileIO):
    """The shared read-only file of one segment. Closes itself, silently, when its last reference goes."""

    def __init__(self, path: str):
        super().__init__(path, "rb")

    def __del__(self) -> None:
        if not self.closed:
            self.close()


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Makes a directory's entries (a create, rename or unlink in it) durable; any error is raised."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private(path: str) -> bool:
    """Called before a segment file is written in place (cut back, or reopened for appends). A local object store
    keeps a copied sealed segment as a hard link to its file (tiering/objects/local_store.py), and an object is never
    overwritten: a file with other links is first replaced, under its own name, by a copy of its own, so that the
    write never reaches the other links. The copy is `<name>.private`, fsynced, given the file's times (older names
    take their timestamps from the mtime), then renamed over the name: a crash leaves the old file whole, and at
    most a `.private` file, which recovery deletes. Returns whether a copy was made."""
    st = os.stat(path)
    if st.st_nlink <= 1:
        return False
    temp = f"{path}.{PRIVATE}"
    with open(path, "rb") as src, open(temp, "wb") as dst:
        copy_file(src, dst.fileno())
        dst.flush()
        os.fsync(dst.fileno())
    os.utime(temp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(temp, path)
    fsync_dir(os.path.dirname(path))
    log.warning("%s had other links (a local object store's object): replaced by a private copy before a write",
                path)
    return True


def copy_file(src: io.BufferedReader, dst: int) -> int:
    """Copies all of `src` into the empty file `dst` (both at their start); returns the bytes copied. Used for a
    segment's private copy (make_private) and a local object store's copy of a segment (tiering/objects/local_store.py).
    In the kernel (copy_file_range: no pass through user space, a reflink where the filesystem has them) when it
    can, else through a buffer: a filesystem or kernel without it refuses before any byte is copied, so a refusal
    once `dst` holds bytes is an error, not a reason to start again."""
    copied = 0
    try:
        while n := os.copy_file_range(src.fileno(), dst, _COPY_CALL_BYTES):
            copied += n
        return copied
    except OSError as e:
        if os.fstat(dst).st_size or e.errno not in _NO_COPY_FILE_RANGE:
            raise
    with open(dst, "wb", closefd=False) as out:
        shutil.copyfileobj(src, out, _COPY_BUFFER_BYTES)
        return out.tell()


class SegmentFiles:
    """Where a segment's two files are: `<directory>/<filename>` and its `<base>.index` beside it."""

    directory: str
    filename: str
    base: int

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.filename)

    @property
    def index_path(self) -> str:
        return os.path.join(self.directory, format_index_name(self.base))


class SealedSegment(SegmentFiles):
    """An immutable segment. Its index and reader are loaded on first use (many sealed segments stay cold)."""

    def __init__(
        self,
        directory: str,
        base: int,
        last: int,
        freeze_ts: int,
        size: int,
        *,
        filename: str | None = None,
        index: SparseIndex | None = None,
        reader: SegmentReader | None = None,
        ts_bounds: tuple[int, int] | None = None,
    ):
        self.directory = directory
        self.base = base
        self.last = last
        self.freeze_ts = freeze_ts
        self.size = size
        self.filename = filename or format_ilog_name(base, last, freeze_ts)
        self._index = index
        self._reader = reader
        # (min, max) message timestamp over every bundle in the file, when its appends told them (ActiveSegment.
        # ts_bounds); None when not known (a segment recovered or compacted): the copier then reads the file for them.
        self.ts_bounds = ts_bounds
        self.deleted = False

    def __repr__(self) -> str:
        return f"SealedSegment({self.filename!r}, size={self.size})"

    @property
    def index(self) -> SparseIndex:
        if self._index is None:
            with open(self.index_path, "rb") as f:
                self._index, _ = SparseIndex.from_bytes(f.read())
        return self._index

    def reader(self) -> SegmentReader:
        if self.deleted:
            raise FileNotFoundError(f"segment {self.filename} was deleted")
        if self._reader is None:
            self._reader = SegmentReader(self.path)
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def forget(self) -> None:
        """Marks the segment gone without touching its files (compaction removed or replaced them by name)."""
        self.deleted = True
        self._reader = None

    def delete(self) -> None:
        """Removes the segment and its index. A reader still streaming it keeps its (unlinked) file open."""
        self.forget()
        for path in (self.path, self.index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


class ActiveSegment(SegmentFiles):
    """The one appendable segment of a partition. `last` is None until the first record is written."""

    def __init__(
        self,
        directory: str,
        base: int,
        created_ts: int,
        roll_age_s: int,
        *,
        filename: str,
        log_fd: int,
        index_fd: int,
        size: int,
        last: int | None,
        index: SparseIndex,
        since_last_update: int,
    ):
        self.directory = directory
        self.base = base
        self.created_ts = created_ts
        self.roll_age_s = roll_age_s
        self.filename = filename
        # The append state (size, last, index rule, unwritten index entries, timestamp bounds) is the appender's
        # (tiered.storage.appender): native when built. The interval is passed with each append, so that a reloaded
        # config applies from the next record. The timestamp bounds come from the facts the append path validated
        # each bundle with: the copier needs them for the catalog and would otherwise read the whole file again
        # (2 CPU s/GB at 100 B messages); only a segment created here saw every append.
        self._appender = appender_class()(self.path, self.index_path, log_fd, index_fd, base, size, last, index,
                                  since_last_update, created_ts, roll_age_s)
        # append_record(record, first_seq, last_seq, facts, now_s, config) -> position | None: `append` when this
        # segment holds a record and takes this one (the produce path's one native call); None otherwise, and nothing
        # is written. The appender's own method, bound once: no Python frame per record.
        self.append_record = self._appender.append_record
        # append_next(record, facts, base_seq, last_assigned, now_s, config) -> AppendResult | None: the seqs
        # assigned and append_record, in the same one call (PartitionLog.append's common case).
        self.append_next = self._appender.append_next
        self._reader: SegmentReader | None = SegmentReader(self.path)

    @property
    def size(self) -> int:
        return self._appender.size

    @property
    def last(self) -> int | None:
        return self._appender.last

    @property
    def ts_bounds(self) -> tuple[int, int] | None:
        """(min, max) message timestamp of every record, or None when some are not known (a reopened segment)."""
        return self._appender.ts_bounds

    def __repr__(self) -> str:
        return f"ActiveSegment({self.filename!r}, size={self.size}, last={self.last})"

    @classmethod
    def create(cls, directory: str, base: int, created_ts: int, roll_age_s: int) -> ActiveSegment:
        filename = format_log_name(base, created_ts)
        log_fd = os.open(os.path.join(directory, filename), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            # A leftover index with this base cannot belong to live data (bases only grow): start it afresh.
            index_fd = os.open(
                os.path.join(directory, format_index_name(base)),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC,
                0o644,
            )
        except OSError:
            os.close(log_fd)
            os.unlink(os.path.join(directory, filename))
            raise
        return cls(
            directory,
            base,
            created_ts,
            roll_age_s,
            filename=filename,
            log_fd=log_fd,
            index_fd=index_fd,
            size=0,
            last=None,
            index=SparseIndex(),
            since_last_update=NEVER_INDEXED,
        )

    @classmethod
    def reopen(
        cls,
        directory: str,
        filename: str,
        base: int,
        created_ts: int,
        roll_age_s: int,
        *,
        size: int,
        last: int,
        index: SparseIndex,
        since_last_update: int,
    ) -> ActiveSegment:
        """An existing, recovered segment (recovery.py made its file and index whole and consistent)."""
        log_fd = os.open(os.path.join(directory, filename), os.O_WRONLY | os.O_APPEND)
        try:
            index_fd = os.open(os.path.join(directory, format_index_name(base)), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError:
            os.close(log_fd)
            raise
        return cls(
            directory,
            base,
            created_ts,
            roll_age_s,
            filename=filename,
            log_fd=log_fd,
            index_fd=index_fd,
            size=size,
            last=last,
            index=index,
            since_last_update=since_last_update,
        )

    @property
    def index(self) -> SparseIndex:
        return self._appender.index

    @property
    def index_bytes(self) -> int:
        return self._appender.index.size_bytes

    def reader(self) -> SegmentReader:
        if self._reader is None:  # sealed (the sealed segment took the reader) or closed
            raise ValueError(f"segment {self.filename} is no longer the active one")
        return self._reader

    def takes(self, first_seq: int, last_seq: int, sparse: bool, record_len: int, now_s: float,
              config: TopicConfig) -> bool:
        """Whether the record goes into this segment, or the log rolls first (tiered.storage.appender: TANK's
        should_roll(), a seq jump, the index's u32 columns)."""
        return self._appender.takes(first_seq, last_seq, sparse, record_len, now_s, config.log_segment_bytes,
                                config.log_index_size_max_bytes)

    def append(self, record: bytes | memoryview, first_seq: int, last_seq: int, interval: int,
               ts_bounds: tuple[int, int] | None = None) -> int:
        """Writes one whole record with one write; returns its position. On a failed write the file is cut back.
        `ts_bounds` is the bundle's (min, max) message timestamp; without it the segment's bounds are unknown.
        Index entries reach the index file in batches and before any flush, seal or close; an entry the file lacks
        (a kill -9 with a batch unwritten) is one recovery re-adds, as TANK's recovery does after a crash."""
        if ts_bounds is None:
            return self._appender.append(record, first_seq, last_seq, interval, None)
        return self._appender.append(record, first_seq, last_seq, interval, ts_bounds[0], ts_bounds[1])

    def flush(self) -> None:
        appender = self._appender
        appender.write_entries()
        os.fdatasync(appender.log_fd)
        os.fdatasync(appender.index_fd)

    def seal(self) -> SealedSegment:
        """Renames `X_ts.log` to `X-last_freezeTS.ilog` (freezeTS = the .log's mtime) and hands over the reader."""
        if self.last is None:
            raise ValueError("an empty segment is never sealed")
        self.flush()
        freeze_ts = int(os.fstat(self._appender.log_fd).st_mtime)
        sealed_name = format_ilog_name(self.base, self.last, freeze_ts)
        os.rename(self.path, os.path.join(self.directory, sealed_name))
        self._close_writers()
        sealed = SealedSegment(
            self.directory,
            self.base,
            self.last,
            freeze_ts,
            self.size,
            filename=sealed_name,
            index=self.index,
            reader=self._reader,
            ts_bounds=self.ts_bounds,
        )
        self._reader = None
        return sealed

    def _close_writers(self) -> None:
        self._appender.close()

    def close(self) -> None:
        self._close_writers()
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def delete(self) -> None:
        """Removes an (empty) active segment's files, e.g. after its first write failed."""
        self.close()
        for path in (self.path, self.index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
