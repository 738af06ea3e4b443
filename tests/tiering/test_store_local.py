"""Local directory backend beyond the shared contract: atomic writes, temp files, key refusal, directories, URLs."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
from pathlib import Path

import pytest

from tiered.tiering.objects import local_store
from tiered.tiering.objects.local_store import TEMP_PREFIX, LocalObjectStore
from tiered.tiering.objects.store import ObjectNotFound, StoreError, open_store


@pytest.fixture
async def store(tmp_path):
    backend = LocalObjectStore(tmp_path / "root")
    yield backend
    await backend.close()


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_objects_are_files_under_the_root(store):
    await store.put("blocks/ab12/3/X.blk", b"data")
    assert (store.root / "blocks" / "ab12" / "3" / "X.blk").read_bytes() == b"data"
    assert files_under(store.root) == ["blocks", "blocks/ab12", "blocks/ab12/3", "blocks/ab12/3/X.blk"]


async def test_temp_files_of_an_interrupted_write_are_never_listed(store):
    await store.put("d/a", b"1")
    (store.root / "d" / f"{TEMP_PREFIX}0123456789abcdef").write_bytes(b"partial")  # a crash mid-put leaves this
    (store.root / f"{TEMP_PREFIX}feed").write_bytes(b"partial")
    assert [i.object_key async for i in store.list("")] == ["d/a"]
    with pytest.raises(StoreError):
        await store.get(f"d/{TEMP_PREFIX}0123456789abcdef")  # reserved: no key can name a temp file
    with pytest.raises(StoreError):
        await store.put(f"{TEMP_PREFIX}x/y", b"")


async def test_a_failed_write_leaves_the_old_object_and_no_temp_file(store, monkeypatch):
    await store.put("k", b"old")

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(local_store.os, "fsync", failing_fsync)
    with pytest.raises(StoreError) as caught:
        await store.put("k", b"new bytes")
    assert isinstance(caught.value.__cause__, OSError)
    assert store.counters.errors == 1
    monkeypatch.undo()
    assert await store.get("k") == b"old"
    assert files_under(store.root) == ["k"]


async def test_readers_never_see_a_partial_object(store):
    versions = [bytes([i]) * (256 * 1024) for i in range(1, 6)]
    await store.put("hot", versions[0])
    seen = set()
    stop = asyncio.Event()

    async def read_until_stopped():
        while not stop.is_set():
            data = await store.get("hot")
            assert data in versions
            seen.add(data[0])

    reader = asyncio.create_task(read_until_stopped())
    for _ in range(4):
        for version in versions:
            await store.put("hot", version)
    stop.set()
    await reader
    assert seen  # the reader ran while writes were happening
    assert [i.object_key async for i in store.list("")] == ["hot"]


async def test_delete_removes_emptied_directories_only(store):
    await store.put("blocks/aaaa/1/A.blk", b"")
    await store.put("blocks/aaaa/2/B.blk", b"")
    await store.delete_many(["blocks/aaaa/1/A.blk"])
    assert files_under(store.root) == ["blocks", "blocks/aaaa", "blocks/aaaa/2", "blocks/aaaa/2/B.blk"]
    await store.delete_many(["blocks/aaaa/2/B.blk"])
    assert files_under(store.root) == []
    assert store.root.is_dir()  # the root stays
    await store.put("blocks/aaaa/2/B.blk", b"back")
    assert await store.get("blocks/aaaa/2/B.blk") == b"back"


async def test_a_key_cannot_be_an_object_and_a_directory(store):
    await store.put("a/b", b"1")
    with pytest.raises(StoreError):
        await store.put("a", b"2")
    await store.put("f", b"1")
    with pytest.raises(StoreError):
        await store.put("f/g", b"2")
    await store.delete_many(["a"])  # a directory is not an object: nothing to delete
    assert [i.object_key async for i in store.list("")] == ["a/b", "f"]
    with pytest.raises(ObjectNotFound):
        await store.head("a")


async def test_symlinks_out_of_the_root_are_not_listed(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    os.symlink(outside, store.root / "link")
    os.symlink(outside / "secret", store.root / "file-link")
    assert [i async for i in store.list("")] == []


def test_file_urls(tmp_path, monkeypatch):
    absolute = open_store(f"file://{tmp_path}/abs")
    assert isinstance(absolute, LocalObjectStore) and absolute.root == tmp_path / "abs"
    assert absolute.root.is_dir()
    monkeypatch.chdir(tmp_path)
    assert open_store("file://rel/dir").root == tmp_path / "rel" / "dir"
    assert open_store("file:rel2").root == tmp_path / "rel2"
    assert open_store("file:///" + str(tmp_path / "with%20space").lstrip("/")).root == tmp_path / "with space"
    assert open_store(f"file://{tmp_path}/nofsync", fsync=False).fsync is False
    for bad in ["file://", "file:///x?y=1", "ftp://host/x"]:
        with pytest.raises(ValueError):
            open_store(bad)


def test_an_unusable_root_is_a_store_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StoreError):
        LocalObjectStore(tmp_path / "file" / "store")


async def test_short_vectored_writes_are_finished(store, monkeypatch):
    """writev may write less than asked (a signal, a full disk that clears): every byte still lands, in order."""
    real_writev, real_write = os.writev, os.write
    calls = {"writev": 0}

    def short_writev(fd, buffers):
        calls["writev"] += 1
        joined = b"".join(buffers)
        return real_writev(fd, [joined[: max(1, len(joined) // 3)]])

    def short_write(fd, data):
        return real_write(fd, bytes(data)[: max(1, len(data) // 2)])

    monkeypatch.setattr(local_store.os, "writev", short_writev)
    monkeypatch.setattr(local_store.os, "write", short_write)
    pieces = [b"alpha", b"", b"beta" * 100, b"gamma" * 7, b"delta"]
    await store.put("k/short", pieces)
    assert (store.root / "k" / "short").read_bytes() == b"".join(pieces)
    assert calls["writev"] == 1


@pytest.mark.parametrize("refusal", [None, errno.EXDEV, errno.ENOSYS])
async def test_put_file_copies_in_the_kernel_or_through_a_buffer(store, tmp_path, monkeypatch, refusal):
    """A sealed segment is copied with copy_file_range; a kernel or filesystem without it falls back to a buffer."""
    source = tmp_path / "segment.ilog"
    data = os.urandom(3 * 1024 * 1024 + 17)
    source.write_bytes(data)
    if refusal is not None:
        def refuse(*args):
            raise OSError(refusal, os.strerror(refusal))
        monkeypatch.setattr(local_store.os, "copy_file_range", refuse)
    await store.put_file("segments/t/0/1-9.ilog", source)
    assert (store.root / "segments" / "t" / "0" / "1-9.ilog").read_bytes() == data
    assert store.counters.put_bytes == len(data)


async def test_a_copy_refused_after_its_first_bytes_fails_the_put(store, tmp_path, monkeypatch):
    """copy_file_range refuses before copying anything; a refusal once bytes were copied is an error (the buffered
    copy would start over a file that is not empty), so the put fails and leaves neither object nor temporary."""
    source = tmp_path / "segment.ilog"
    source.write_bytes(os.urandom(3 * 1024 * 1024))
    real = os.copy_file_range
    calls = []

    def copy_then_refuse(src, dst, count, *args):
        calls.append(count)
        if len(calls) == 1:
            return real(src, dst, 1024 * 1024)
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(local_store.os, "copy_file_range", copy_then_refuse)
    with pytest.raises(StoreError, match=rf"\[Errno {errno.EXDEV}\]"):
        await store.put_file("segments/t/0/1-9.ilog", source)
    assert len(calls) == 2
    assert [p.name for p in store.root.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("sizes", [
    [local_store.DIRECT_MIN_BYTES],  # the smallest put written with O_DIRECT, one aligned chunk
    [102_400] * 82 + [5_000, 12],  # a block: its records, footer and trailer; an unaligned tail
    [local_store.DIRECT_CHUNK],  # exactly one chunk: no tail
    [local_store.DIRECT_CHUNK + 1, 0, 4095],  # a second chunk of 4096 bytes
    [3 * local_store.DIRECT_CHUNK - 7],  # a piece spanning three chunks
])
async def test_large_puts_bypass_the_page_cache_with_the_same_bytes(store, sizes):
    """Blocks are written with O_DIRECT through an aligned buffer, padded, then cut back: the object is exactly the
    concatenation of the pieces, whatever their lengths, and the buffer is reused by the next put."""
    for attempt in range(2):
        pieces = [os.urandom(n) for n in sizes]
        await store.put("blocks/x", pieces)
        path = store.root / "blocks" / "x"
        assert path.stat().st_size == sum(sizes)
        assert path.read_bytes() == b"".join(pieces)
        assert store.direct_io  # ext4, xfs and tmpfs take O_DIRECT: it was used, not refused
        assert len(store._buffers) == 1  # taken back, and reused by the second attempt
    assert files_under(store.root) == ["blocks", "blocks/x"]


@pytest.mark.parametrize("refused_at", ["open", "write"])
async def test_a_filesystem_that_refuses_o_direct_gets_buffered_writes(store, monkeypatch, refused_at):
    """EINVAL on the O_DIRECT open, or on its first write (an alignment above 4096): the put is written through the
    page cache instead, no temporary file stays, and later puts no longer try O_DIRECT."""
    real_open, real_write = os.open, os.write
    refused = []

    def open_refusing(path, flags, mode=0o777):
        if flags & local_store._O_DIRECT and refused_at == "open":
            refused.append(path)
            raise OSError(errno.EINVAL, "O_DIRECT not supported")
        return real_open(path, flags, mode)

    def write_refusing(fd, data):
        if refused_at == "write" and fcntl.fcntl(fd, fcntl.F_GETFL) & local_store._O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "misaligned")
        return real_write(fd, data)

    monkeypatch.setattr(local_store.os, "open", open_refusing)
    monkeypatch.setattr(local_store.os, "write", write_refusing)
    pieces = [os.urandom(local_store.DIRECT_MIN_BYTES), os.urandom(100)]
    await store.put("b/1", pieces)
    assert refused and not store.direct_io
    assert (store.root / "b" / "1").read_bytes() == b"".join(pieces)
    assert files_under(store.root) == ["b", "b/1"]
    refused.clear()
    await store.put("b/2", pieces)
    assert not refused
    assert (store.root / "b" / "2").read_bytes() == b"".join(pieces)


async def test_a_short_o_direct_write_fails_the_put_and_keeps_the_old_object(store, monkeypatch):
    """A short O_DIRECT write (a full disk) cannot be continued aligned: the put fails (the caller retries it), the
    old object stays whole and no temporary file is left."""
    old = [os.urandom(local_store.DIRECT_MIN_BYTES)]
    await store.put("b/k", old)
    real_write = os.write
    monkeypatch.setattr(local_store.os, "write", lambda fd, data: real_write(fd, data[:4096]))  # aligned, short
    with pytest.raises(StoreError):
        await store.put("b/k", [os.urandom(local_store.DIRECT_MIN_BYTES + 1)])
    monkeypatch.undo()
    assert store.direct_io  # a failure, not a refusal: the next put tries O_DIRECT again
    assert (store.root / "b" / "k").read_bytes() == old[0]
    assert files_under(store.root) == ["b", "b/k"]
