"""An object store in a local directory: the embedded single-node default, and the second backend of every store test.

An object key maps to the file `<root>/<object_key>`; `/` in a key makes directories. Writes go to a temporary file
in the destination directory, are fsynced, then renamed over the key (os.replace is atomic on POSIX), and the
directory is fsynced: a reader sees the old object or the new one, never part of one, and a crash leaves at most a
temporary file, which list() never shows. Temporary names start with TEMP_PREFIX, and keys whose components do are
refused, so the two cannot collide.

Unlike S3, a key cannot be both an object and a prefix of other keys followed by `/` ("a" and "a/b"): the second put
fails with StoreError. Keys from tiering/objects/keys.py never do this. Deleting the last object of a directory removes the
directory, so directories do not pile up under the hashed block prefixes.

Large puts (blocks) bypass the page cache: they are copied into a reused page-aligned buffer and written with
O_DIRECT, the last chunk padded with zeros to the alignment and the file cut back to its length with ftruncate (the
object's bytes are the pieces' bytes exactly), then fsynced as every put. A buffered write of an 8 MiB block into a new
file cost the broker three to four times the copy into the buffer (page allocation, dirtying, writeback under the
fsync). A directory whose filesystem refuses O_DIRECT gets buffered writes from then on.

A file put with `immutable_source` (a sealed segment, by the segment copier) is stored as a hard link to the file when
the store's directory is on the file's filesystem: no second copy of its bytes goes through the page cache. The object
is then the segment's inode, which nothing writes in place: the store replaces and deletes objects only by rename and
unlink, and the partition's own code never writes a file that has other links (storage/segment.make_private gives the
partition a private copy first). Such an object's last_modified is when its bytes were last written, shortly before
the put rather than at it; the two readers of that time hold: the reconciler never deletes an object the catalog knows,
and the copier's COPY_STARTED row names the key before the put; the catalog rebuild prefers the newest of two
overlapping segments, and a segment that replaces another was written after it. A link refused (another filesystem,
EXDEV; no hard links) falls back to a copy.

Blocking file I/O runs in worker threads (asyncio.to_thread) so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mmap
import os
import secrets
import stat
from datetime import UTC, datetime
from pathlib import Path

from tiered.storage.segment import copy_file, fsync_dir
from tiered.tiering.objects.store import ObjectInfo, ObjectNotFound, ObjectStore, Piece, StoreError, check_object_key

TEMP_PREFIX = ".tiered-tmp-"
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024)
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none: every write is buffered
DIRECT_MIN_BYTES = 1 << 20  # smaller puts go through the page cache: O_DIRECT saves nothing worth a device wait
DIRECT_ALIGN = 4096  # O_DIRECT wants buffer address, file offset and length aligned to the logical block size (<= 4096)
DIRECT_CHUNK = 8 << 20  # the aligned buffer: one write per 8 MiB (a block is about one chunk)
_SPARE_BUFFERS = 4  # aligned buffers kept for reuse (one per put in flight, up to this many)


class _LinkRefused(Exception):
    """os.link failed for another reason than a missing source (EXDEV, EPERM, EMLINK...): the file is copied."""


class _DirectRefused(Exception):
    """The filesystem refused an O_DIRECT open or write (EINVAL): the put is done again through the page cache."""


class LocalObjectStore(ObjectStore):
    def __init__(self, root: str | Path, *, fsync: bool = True, direct_io: bool = True):
        super().__init__()
        self.root = Path(root).absolute()
        self.fsync = fsync
        self.direct_io = direct_io and _O_DIRECT != 0  # cleared for good when the filesystem refuses O_DIRECT
        self._buffers: list[mmap.mmap] = []  # spare aligned buffers (list.pop/append are atomic across threads)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create store directory {self.root}: {e}") from e

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    # --- ObjectStore ----------------------------------------------------------------------------------------------

    async def _put(self, object_key: str, pieces: list[Piece]) -> None:
        path = self._path(object_key)
        if self.direct_io and sum(len(p) for p in pieces) >= DIRECT_MIN_BYTES:
            try:
                await self._io(None, self._write_atomically, path, lambda fd: self._write_direct(fd, pieces), True)
                return
            except _DirectRefused:
                self.direct_io = False
        await self._io(None, self._write_atomically, path, lambda fd: _write_pieces(fd, pieces))

    async def _put_file(self, object_key: str, path: Path, multipart_threshold_bytes: int, part_bytes: int,
                        immutable_source: bool) -> int:
        target = self._path(object_key)
        if immutable_source:
            try:
                return await self._io(None, self._link_atomically, path, target)
            except _LinkRefused:
                pass  # another filesystem (EXDEV), or one without hard links: copied below

        def copy(fd: int) -> int:
            with open(path, "rb") as src:
                return copy_file(src, fd)

        return await self._io(None, self._write_atomically, target, copy)

    async def _get_range(self, object_key: str, start: int, end: int | None) -> bytes:
        path = self._path(object_key)

        def read() -> bytes:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(end - start)

        return await self._io(object_key, read)

    async def _head(self, object_key: str) -> ObjectInfo:
        path = self._path(object_key)

        def stat_object() -> ObjectInfo:
            st = os.stat(path)
            if not _is_file(st):
                raise FileNotFoundError(errno.ENOENT, "not an object", str(path))
            return _info(object_key, st)

        return await self._io(object_key, stat_object)

    async def _list_page(self, prefix: str, start_after: str | None, max_keys: int) -> tuple[list[ObjectInfo], bool]:
        page = await self._io(None, self._walk, prefix, start_after or "", max_keys + 1)
        return page[:max_keys], len(page) > max_keys

    async def _delete_many(self, object_keys: list[str]) -> None:
        paths = [self._path(k) for k in object_keys]

        def delete() -> None:
            for path in paths:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                except IsADirectoryError:  # a prefix of other keys, not an object
                    continue
                self._prune_dirs(path.parent)

        await self._io(None, delete)

    # --- helpers --------------------------------------------------------------------------------------------------

    def _path(self, object_key: str) -> Path:
        """The file for a key; keys that could escape the root or clash with temporary files are refused."""
        parts = check_object_key(object_key)
        if any(part.startswith(TEMP_PREFIX) for part in parts):
            raise StoreError(f"object key {object_key!r} uses the reserved prefix {TEMP_PREFIX!r}")
        return self.root.joinpath(*parts)

    async def _io(self, object_key: str | None, fn, *args):
        """Runs fn in a thread. A missing file means ObjectNotFound when reading `object_key`; writes pass None."""
        try:
            return await asyncio.to_thread(fn, *args)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            if object_key is None:
                raise StoreError(f"local store {self.root}: {e}") from e
            raise ObjectNotFound(object_key) from e
        except OSError as e:
            raise StoreError(f"local store {self.root}: {e}") from e

    def _write_atomically(self, path: Path, write, direct: bool = False) -> int | None:
        """write(fd) fills a new temporary file, which then replaces `path`; `direct` opens it with O_DIRECT."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | (_O_DIRECT if direct else 0)
        # A concurrent delete may prune the directory between mkdir and open: create it again and retry.
        for attempt in range(3):
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.parent / f"{TEMP_PREFIX}{secrets.token_hex(8)}"
            try:
                fd = os.open(temp, flags, 0o666)
            except FileNotFoundError:
                if attempt == 2:
                    raise
                continue
            except OSError as e:
                if direct and e.errno == errno.EINVAL:
                    raise _DirectRefused() from e
                raise
            try:
                try:
                    result = write(fd)
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.replace(temp, path)
                except IsADirectoryError as e:
                    raise StoreError(f"object key {path.relative_to(self.root)} is a prefix of other objects") from e
            except BaseException:
                _unlink_quietly(temp)
                raise
            if self.fsync:
                fsync_dir(path.parent)
            return result
        raise AssertionError("unreachable")

    def _link_atomically(self, source: Path, path: Path) -> int:
        """Stores the file `source` as the object at `path` by a hard link (the same inode, no copy), under the same
        temporary-name-then-rename protocol as a write; returns its size."""
        for attempt in range(3):
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.parent / f"{TEMP_PREFIX}{secrets.token_hex(8)}"
            try:
                os.link(source, temp)
            except FileNotFoundError:
                if attempt == 2 or not os.path.exists(source):
                    raise
                continue  # the directory was pruned by a concurrent delete
            except OSError as e:
                raise _LinkRefused() from e
            try:
                if self.fsync:  # the data of a sealed segment is synced already; this costs one flush, no writeback
                    fd = os.open(temp, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                size = os.stat(temp).st_size
                try:
                    os.replace(temp, path)
                except IsADirectoryError as e:
                    raise StoreError(f"object key {path.relative_to(self.root)} is a prefix of other objects") from e
                # rename() between two links of one inode (the same segment put again) does nothing, leaving both.
                _unlink_quietly(temp)
            except BaseException:
                _unlink_quietly(temp)
                raise
            if self.fsync:
                fsync_dir(path.parent)
            return size
        raise AssertionError("unreachable")

    def _write_direct(self, fd: int, pieces: list[Piece]) -> None:
        """The pieces in order through a page-aligned buffer, DIRECT_CHUNK at a time; the last chunk is padded to
        DIRECT_ALIGN and the file cut back to the pieces' length."""
        try:
            buffer = self._buffers.pop()
        except IndexError:
            buffer = mmap.mmap(-1, DIRECT_CHUNK)  # anonymous memory is page-aligned
        try:
            chunk = memoryview(buffer)
            filled = total = 0
            for piece in pieces:
                view = memoryview(piece)
                while view:
                    n = min(len(view), DIRECT_CHUNK - filled)
                    chunk[filled:filled + n] = view[:n]
                    filled += n
                    view = view[n:]
                    if filled == DIRECT_CHUNK:
                        _write_aligned(fd, chunk)
                        total += filled
                        filled = 0
            if filled:
                padded = filled + -filled % DIRECT_ALIGN
                chunk[filled:padded] = bytes(padded - filled)
                _write_aligned(fd, chunk[:padded])
                total += filled
                os.ftruncate(fd, total)
            chunk.release()
        finally:
            if len(self._buffers) < _SPARE_BUFFERS:
                self._buffers.append(buffer)
            else:
                buffer.close()

    def _walk(self, prefix: str, start_after: str, max_keys: int) -> list[ObjectInfo]:
        """Up to max_keys objects under `prefix` after `start_after`, in key order, visiting only directories that
        can hold such keys."""
        out: list[ObjectInfo] = []

        def visit(directory: Path, dir_key: str) -> bool:
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                return True
            # Keys under directory d all sort between d + "/" and d + "0" ("0" follows "/"): sorting directories as
            # name + "/" puts them among sibling files exactly where their keys fall in S3's key order.
            entries.sort(key=lambda e: e.name + "/" if e.is_dir(follow_symlinks=False) else e.name)
            for entry in entries:
                if entry.name.startswith(TEMP_PREFIX):
                    continue
                key = dir_key + entry.name
                if entry.is_dir(follow_symlinks=False):
                    sub = key + "/"
                    if not (sub.startswith(prefix) or prefix.startswith(sub)):
                        continue
                    if start_after >= key + "0":
                        continue
                    if not visit(Path(entry.path), sub):
                        return False
                elif entry.is_file(follow_symlinks=False) and key.startswith(prefix) and key > start_after:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:  # deleted while we walked
                        continue
                    out.append(_info(key, st))
                    if len(out) >= max_keys:
                        return False
            return True

        visit(self.root, "")
        return out

    def _prune_dirs(self, directory: Path) -> None:
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:  # not empty (or already gone): stop
                return
            directory = directory.parent


def _write_aligned(fd: int, chunk: memoryview) -> None:
    """One O_DIRECT write of an aligned chunk. A filesystem that refuses it (EINVAL: an alignment above
    DIRECT_ALIGN, or no O_DIRECT at all) raises _DirectRefused; a short write (a full disk) is an error, since the
    rest would no longer be aligned."""
    try:
        written = os.write(fd, chunk)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise _DirectRefused() from e
        raise
    if written != len(chunk):
        raise OSError(errno.EIO, f"short O_DIRECT write: {written} of {len(chunk)} bytes")


def _write_pieces(fd: int, pieces: list[Piece]) -> None:
    """Writes the pieces in order with vectored writes (no joined copy in user space), finishing short writes."""
    index = 0
    while index < len(pieces):
        batch = pieces[index:index + _IOV_MAX]
        written = os.writev(fd, batch)
        for piece in batch:
            if written < len(piece):
                rest = memoryview(piece)[written:]
                while rest:
                    rest = rest[os.write(fd, rest):]
                written = 0
            else:
                written -= len(piece)
        index += len(batch)


def _info(object_key: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(object_key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))


def _is_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
