"""The ObjectStore contract, run once per backend (local directory, S3 through moto), as litestream tests replicas."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from tiered.tiering.objects import store as store_module
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.tiering.objects.s3_store import S3ObjectStore
from tiered.tiering.objects.store import ObjectInfo, ObjectNotFound, StoreCounters, StoreError

KiB = 1024


@pytest_asyncio.fixture(params=["local", "s3"])
async def store(request, tmp_path):
    if request.param == "local":
        backend = LocalObjectStore(tmp_path / "store")
    else:
        backend = S3ObjectStore(
            request.getfixturevalue("s3_bucket"),
            "some/prefix",
            endpoint_url=request.getfixturevalue("s3_endpoint"),
            path_style=True,
            max_attempts=2,
            read_timeout_s=5,
        )
    try:
        yield backend
    finally:
        await backend.close()


async def keys_of(store, prefix="", **kwargs) -> list[str]:
    return [info.object_key async for info in store.list(prefix, **kwargs)]


async def test_put_then_get_and_head(store):
    before = datetime.now(UTC) - timedelta(seconds=5)
    await store.put("blocks/ab12/1/x.blk", b"hello world")
    assert await store.get("blocks/ab12/1/x.blk") == b"hello world"
    info = await store.head("blocks/ab12/1/x.blk")
    assert info.object_key == "blocks/ab12/1/x.blk"
    assert info.size_bytes == 11
    assert info.last_modified.tzinfo is not None and info.last_modified.utcoffset() == timedelta(0)
    assert before <= info.last_modified <= datetime.now(UTC) + timedelta(seconds=5)


async def test_put_replaces_an_object(store):
    await store.put("k", b"first version")
    await store.put("k", b"second")
    assert await store.get("k") == b"second"
    assert (await store.head("k")).size_bytes == 6


async def test_empty_object(store):
    await store.put("empty", b"")
    assert await store.get("empty") == b""
    assert await store.get_range("empty", 0, 10) == b""
    assert (await store.head("empty")).size_bytes == 0


async def test_get_range_is_end_exclusive_and_stops_at_the_end(store):
    data = bytes(range(256)) * 4
    await store.put("r", data)
    assert await store.get_range("r", 0, 1) == data[:1]
    assert await store.get_range("r", 10, 20) == data[10:20]
    assert await store.get_range("r", 1000, 1024) == data[1000:]
    assert await store.get_range("r", 1000, 5000) == data[1000:]  # past the end: what exists, like an S3 Range
    assert await store.get_range("r", 1024, 2000) == b""
    assert await store.get_range("r", 5000, 6000) == b""
    for start, end in [(-1, 3), (5, 5), (6, 5)]:
        with pytest.raises(ValueError):
            await store.get_range("r", start, end)


async def test_missing_objects_raise_object_not_found(store):
    await store.put("dir/present", b"x")
    for call in (
        lambda k: store.get(k),
        lambda k: store.get_range(k, 0, 10),
        lambda k: store.head(k),
    ):
        for key in ("absent", "dir/absent", "dir", "dir/present/below"):
            with pytest.raises(ObjectNotFound) as caught:
                await call(key)
            assert caught.value.object_key == key
            assert not isinstance(caught.value, StoreError)  # "retry later" must not catch "not there"
    assert store.counters.errors == 0


async def test_list_is_in_key_order_like_s3(store):
    # "-" < "/" < "0": a directory walk sorted by name alone would put "a/b" before "a-c".
    keys = ["a/b", "a-c", "a0", "ab", "b/x/y", "b/x0", "b/x-1/z", "c", "blocks/ffff/2/Z.blk", "blocks/0000/1/A.blk"]
    for key in keys:
        await store.put(key, key.encode())
    assert await keys_of(store) == sorted(keys)
    assert await keys_of(store, "a") == ["a-c", "a/b", "a0", "ab"]
    assert await keys_of(store, "a/") == ["a/b"]
    assert await keys_of(store, "b/x") == ["b/x-1/z", "b/x/y", "b/x0"]
    assert await keys_of(store, "blocks/") == ["blocks/0000/1/A.blk", "blocks/ffff/2/Z.blk"]
    assert await keys_of(store, "nothing/") == []
    infos = [info async for info in store.list("b/x/")]
    assert [(i.object_key, i.size_bytes) for i in infos] == [("b/x/y", 5)]
    assert all(isinstance(i, ObjectInfo) and i.last_modified.tzinfo is not None for i in infos)


async def test_list_start_after_and_limit(store):
    keys = [f"seg/{i:03d}" for i in range(12)]
    for key in keys:
        await store.put(key, b"")
    assert await keys_of(store, "seg/", start_after="seg/004") == keys[5:]
    assert await keys_of(store, "seg/", start_after="seg/0045") == keys[5:]  # need not be an existing key
    assert await keys_of(store, "seg/", start_after="seg/011") == []
    assert await keys_of(store, "seg/", start_after="a") == keys
    before = store.counters.lists
    assert await keys_of(store, "seg/", limit=3) == keys[:3]
    assert store.counters.lists == before + 1  # a limit bounds the page asked for, not just what is yielded
    assert await keys_of(store, "seg/", start_after="seg/009", limit=5) == keys[10:]
    assert await keys_of(store, "seg/", limit=0) == []


@pytest.mark.parametrize("count, expected_pages", [(17, 3), (21, 3), (1, 1), (0, 1)])
async def test_list_pages_through_everything(store, monkeypatch, count, expected_pages):
    monkeypatch.setattr(store_module, "DEFAULT_LIST_PAGE", 7)
    keys = sorted(f"p/{i}" for i in range(count))
    for key in keys:
        await store.put(key, b"1")
    before = store.counters.lists
    assert await keys_of(store, "p/") == keys
    assert store.counters.lists - before == expected_pages
    assert await keys_of(store, "p/", start_after=keys[3] if count > 3 else None, limit=9) == (
        keys[4:13] if count > 3 else keys
    )


async def test_delete_many(store):
    for key in ["d/1", "d/2", "d/3", "keep"]:
        await store.put(key, b"x")
    await store.delete_many(["d/1", "d/3", "d/missing", "d/1"])  # missing keys and duplicates are fine
    assert await keys_of(store) == ["d/2", "keep"]
    await store.delete_many(k for k in ["d/2"])  # any iterable
    await store.delete_many([])
    assert await keys_of(store) == ["keep"]
    with pytest.raises(ObjectNotFound):
        await store.get("d/2")
    await store.put("d/1", b"again")  # a deleted key can be written again
    assert await store.get("d/1") == b"again"
    assert store.counters.deletes == 4


async def test_put_file_small_and_multipart(store, tmp_path, monkeypatch):
    import moto.s3.models

    # moto, like S3, refuses parts under 5 MiB except the last; lower its floor so the test moves little data.
    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 64 * KiB)
    big = tmp_path / "big.ilog"
    big_data = os.urandom(600 * KiB + 123)
    big.write_bytes(big_data)
    small = tmp_path / "small.index"
    small.write_bytes(b"\0" * 16)

    await store.put_file("segments/t/0/big.ilog", big, multipart_threshold_bytes=256 * KiB, part_bytes=128 * KiB)
    await store.put_file("segments/t/0/small.index", str(small), multipart_threshold_bytes=256 * KiB)
    assert await store.get("segments/t/0/big.ilog") == big_data
    assert (
        await store.get_range("segments/t/0/big.ilog", 128 * KiB - 3, 128 * KiB + 3)
        == big_data[128 * KiB - 3 : 128 * KiB + 3]
    )
    assert await store.get("segments/t/0/small.index") == b"\0" * 16
    assert store.counters.puts == 2
    assert store.counters.put_bytes == len(big_data) + 16
    with pytest.raises(StoreError):
        await store.put_file("segments/t/0/none", tmp_path / "does-not-exist")
    with pytest.raises(ValueError):
        await store.put_file("x", big, part_bytes=0)


async def test_counters_count_requests_and_bytes(store):
    await store.put("c/1", b"12345")
    await store.put("c/2", b"678")
    await store.get("c/1")
    await store.get_range("c/2", 1, 3)
    await keys_of(store, "c/")
    await store.delete_many(["c/1", "c/2"])
    with pytest.raises(ObjectNotFound):
        await store.get("c/1")
    assert store.counters == StoreCounters(puts=2, put_bytes=8, gets=2, get_bytes=7, lists=1, deletes=2, errors=0)
    assert store.counters.as_dict()["put_bytes"] == 8


@pytest.mark.parametrize("bad", ["", "/abs", "../up", "a/../../up", "a//b", "a/./b", "trailing/", "nul\0"])
async def test_keys_that_could_escape_are_refused(store, bad):
    with pytest.raises(StoreError):
        await store.put(bad, b"x")
    with pytest.raises(StoreError):
        await store.get(bad)
    with pytest.raises(StoreError):
        await store.delete_many(["fine", bad])
    assert store.counters.errors == 3
    assert await keys_of(store) == []


async def test_put_of_pieces_stores_their_concatenation(store):
    """A block is put as its records, unjoined: more pieces than one vectored write takes, and empty ones."""
    pieces = [bytes([i % 251]) * (i % 7) for i in range(2500)] + [b"tail"]
    await store.put("blocks/p/1.blk", pieces)
    assert await store.get("blocks/p/1.blk") == b"".join(pieces)
    assert store.counters.puts == 1 and store.counters.put_bytes == len(b"".join(pieces))
    await store.put("blocks/p/2.blk", [b"one piece"])
    assert await store.get("blocks/p/2.blk") == b"one piece"


async def test_pieces_may_be_read_only_views_of_received_bytes(store):
    """The records of a block may be read-only views of produce payloads (AppendResult.record), bytearray-backed:
    stored byte for byte, alone or among bytes pieces, small (buffered writes) and past DIRECT_MIN_BYTES."""
    payload = bytearray(os.urandom(3 << 20))
    view = memoryview(payload).toreadonly()
    pieces = [view[10:1000], b"footer", view[1000 : (3 << 20) - 5], b"", view[-5:]]
    await store.put("blocks/p/3.blk", pieces)
    assert await store.get("blocks/p/3.blk") == b"".join(pieces)
    await store.put("blocks/p/4.blk", [view[7:300]])
    assert await store.get("blocks/p/4.blk") == bytes(payload[7:300])
