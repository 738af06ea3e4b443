"""Sealed segments stored by the local-directory store as hard links to the partition's files (local_store.py,
storage/segment.make_private). The promise is that an object is never overwritten, so each test links segments,
then does to the local files everything the partition's code does to them (truncation into a linked segment and
appends to it, recovery cutting a torn tail, key compaction, retention, a crash during a private copy), and reads
every object back byte for byte against what was put."""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path

import pytest

from tiered.catalog import Catalog
from tiered.catalog import segments as catalog_segments
from tiered.catalog.check import check_catalog
from tiered.catalog.states import SegmentState
from tiered.client import Client
from tiered.protocol.bundle import Message, encode_bundle
from tiered.server.app import App, tiering_service
from tiered.storage import PartitionLog
from tiered.storage.compaction import compact_partition
from tiered.storage.names import PRIVATE, Ignored, parse_name
from tiered.storage.segment import make_private
from tiered.storage.truncate import truncate_partition_dir
from tiered.tiering.objects import local_store
from tiered.tiering.objects.local_store import TEMP_PREFIX, LocalObjectStore

from tests.support.broker import local_settings
from tests.support.polling import eventually
from tests.support.storage_helpers import plain_bundle, storage_config

CONFIG = storage_config(log_segment_bytes=300, log_index_interval_bytes=128)


@pytest.fixture
async def store(tmp_path):
    backend = LocalObjectStore(tmp_path / "objects")
    yield backend
    await backend.close()


def open_log(directory: Path, config=CONFIG) -> PartitionLog:
    return PartitionLog.open(str(directory), config, rng=random.Random(1))


def build(directory: Path, records: int = 40, config=CONFIG) -> PartitionLog:
    log = open_log(directory, config)
    for i in range(records):
        log.append(plain_bundle(b"v%03d-" % i + random.Random(i).randbytes(40)))
    assert len(log.segments) >= 4
    return log


async def link_sealed(store: LocalObjectStore, log: PartitionLog) -> dict[str, bytes]:
    """Puts every sealed segment as the copier does; returns each object's key and the bytes it was put with."""
    put: dict[str, bytes] = {}
    for segment in log.segments:
        key = f"segments/{segment.filename}"
        await store.put_file(key, segment.path, immutable_source=True)
        assert os.stat(store.root / key).st_ino == os.stat(segment.path).st_ino  # a link, not a copy
        put[key] = Path(segment.path).read_bytes()
    return put


async def assert_objects_kept(store: LocalObjectStore, put: dict[str, bytes]) -> None:
    for key, data in put.items():
        assert await store.get(key) == data, key
    assert not [p for p in store.root.rglob(f"{TEMP_PREFIX}*")]


async def test_a_cut_into_a_linked_segment_and_appends_to_it_leave_the_object_whole(store, tmp_path):
    """truncate.py reopens the cut sealed segment as the active one, and appends go on in it: both reach a private
    copy, never the object."""
    log = build(tmp_path / "p")
    put = await link_sealed(store, log)
    first = log.segments[0]
    keep = (first.base + first.last) // 2
    assert first.base <= keep < first.last
    log.truncate_after(keep)
    log.append(plain_bundle(b"after the cut" * 30))
    log.append(plain_bundle(b"and more" * 30))
    log.close()
    reopened = open_log(tmp_path / "p")
    assert reopened.last_assigned > keep
    reopened.close()
    await assert_objects_kept(store, put)


async def test_recovery_cutting_a_torn_tail_of_a_linked_segment_leaves_the_object_whole(store, tmp_path):
    """A sealed segment whose index is gone and whose tail is torn is cut by recovery: the object keeps the bytes it
    was put with (torn tail included), the partition keeps its whole records."""
    log = build(tmp_path / "p")
    segment = log.segments[1]
    log.close()
    whole = Path(segment.path).read_bytes()
    with open(segment.path, "ab") as f:  # before the put: the file the store is given ends torn
        f.write(b"\x00\x07torn")
    os.unlink(segment.index_path)
    await store.put_file("segments/torn", segment.path, immutable_source=True)
    put = {"segments/torn": whole + b"\x00\x07torn"}
    reopened = open_log(tmp_path / "p")
    assert [c.filename for c in reopened.recovery.cut] == [segment.filename]
    assert Path(reopened.segments[1].path).read_bytes() == whole
    reopened.close()
    await assert_objects_kept(store, put)


async def test_key_compaction_and_retention_of_linked_segments_leave_the_objects_whole(store, tmp_path):
    config = storage_config(log_segment_bytes=300, log_index_interval_bytes=128, log_cleanup_policy="cleanup",
                            log_cleaner_delete_retention_secs=100)
    log = open_log(tmp_path / "p", config)
    for i in range(40):
        log.append(encode_bundle([Message(b"v%03d" % i * 10, b"k%d" % (i % 3), 1)]))
    log.seal_active()
    put = await link_sealed(store, log)
    report = compact_partition(log, 1_800_000_000.0, force=True)
    assert report.groups and report.messages_after < report.messages_before  # files replaced by compacted ones
    log.close()
    await assert_objects_kept(store, put)
    for segment in list(open_log(tmp_path / "p", config).segments):
        segment.delete()  # what retention does once a segment is in the bucket
    await assert_objects_kept(store, put)


async def test_a_crash_during_a_private_copy_leaves_the_segment_and_recovery_removes_the_copy(store, tmp_path):
    log = build(tmp_path / "p")
    segment = log.segments[0]
    log.close()
    await store.put_file("segments/s", segment.path, immutable_source=True)
    data = Path(segment.path).read_bytes()
    leftover = Path(f"{segment.path}.{PRIVATE}")
    leftover.write_bytes(data[:50])  # the copy was being written when the process died
    reopened = open_log(tmp_path / "p")
    assert not leftover.exists()
    assert (f"{segment.filename}.{PRIVATE}", "unfinished private copy of a segment") in reopened.recovery.deleted
    assert Path(reopened.segments[0].path).read_bytes() == data
    reopened.close()
    assert make_private(segment.path)  # linked still: a copy is made, with the same bytes and times
    assert os.stat(segment.path).st_nlink == 1 and Path(segment.path).read_bytes() == data
    assert not make_private(segment.path)  # private already: nothing to do
    assert isinstance(parse_name("7.index.private"), Ignored)  # only a segment's name makes a private copy's
    await assert_objects_kept(store, {"segments/s": data})


@pytest.mark.parametrize("refusal", [None, errno.EXDEV, errno.EOPNOTSUPP])
async def test_a_private_copy_is_made_in_the_kernel_or_through_a_buffer(store, tmp_path, monkeypatch, refusal):
    """make_private copies with copy_file_range, or through a buffer where the kernel or filesystem refuses it
    (segment.copy_file, shared with the local store): the same bytes and times either way, the object kept."""
    log = build(tmp_path / "p")
    segment = log.segments[0]
    log.close()
    await store.put_file("segments/s", segment.path, immutable_source=True)
    data = Path(segment.path).read_bytes()
    before = os.stat(segment.path)
    if refusal is not None:
        def refuse(*args):
            raise OSError(refusal, os.strerror(refusal))
        monkeypatch.setattr(os, "copy_file_range", refuse)
    assert make_private(segment.path)
    after = os.stat(segment.path)
    assert after.st_nlink == 1 and after.st_ino != before.st_ino and after.st_mtime_ns == before.st_mtime_ns
    assert Path(segment.path).read_bytes() == data
    assert not Path(f"{segment.path}.{PRIVATE}").exists()
    await assert_objects_kept(store, {"segments/s": data})


async def test_the_same_segment_put_twice_stays_one_linked_object(store, tmp_path):
    """The copier puts a segment again after a crash between its put and COPY_FINISHED: rename() between two links
    of one inode does nothing, so the temporary link is removed by hand."""
    log = build(tmp_path / "p")
    segment = log.segments[0]
    log.close()
    for _ in range(2):
        await store.put_file("segments/s", segment.path, immutable_source=True)
    assert os.stat(segment.path).st_nlink == 2
    assert sorted(p.name for p in (store.root / "segments").iterdir()) == ["s"]
    assert store.counters.put_bytes == 2 * segment.size


@pytest.mark.parametrize("refusal", [errno.EXDEV, errno.EPERM, errno.EMLINK])
async def test_a_refused_link_falls_back_to_a_copy(store, tmp_path, monkeypatch, refusal):
    """Another filesystem (EXDEV), one without hard links (EPERM), too many links (EMLINK): the file is copied."""
    log = build(tmp_path / "p")
    segment = log.segments[0]
    log.close()

    def refuse(*args, **kwargs):
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(local_store.os, "link", refuse)
    await store.put_file("segments/s", segment.path, immutable_source=True)
    assert os.stat(store.root / "segments" / "s").st_ino != os.stat(segment.path).st_ino
    await assert_objects_kept(store, {"segments/s": Path(segment.path).read_bytes()})


async def test_files_put_without_the_promise_are_copied(store, tmp_path):
    """An index (rewritten in place by recovery) or any other file: a copy of its own."""
    source = tmp_path / "0.index"
    source.write_bytes(b"\x00" * 64)
    await store.put_file("segments/0.index", source)
    assert os.stat(source).st_nlink == 1
    source.write_bytes(b"\x01" * 64)
    assert await store.get("segments/0.index") == b"\x00" * 64


def _copied(catalog_url: str) -> list:
    with Catalog.open(catalog_url) as cat:
        return catalog_segments.list_segments(cat, "hist", 0, states=(SegmentState.COPY_FINISHED,))


async def test_a_broker_links_its_copies_and_serves_every_ack_after_a_cut_and_a_wiped_disk(tmp_path):
    """Embedded defaults (a local-directory store on the data's filesystem, SQLite): the copier links sealed segments.
    Then the partition directory is cut back into the first copied segment and wiped: every object still holds the
    bytes it was put with, every acknowledged message is served at its seq from the store, and the catalog check
    passes."""
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    store_dir = tmp_path / "objects"  # outside the data directory, so that wiping it keeps the store
    settings = local_settings(tmp_path / "data", catalog_url=catalog_url, store_url=f"file://{store_dir}",
                              shutdown_timeout_s=3.0, block_max_age_ms=50,
                              block_linger_ms=5, block_max_puts_per_s=1000.0)  # each durable ack waits 5 ms, not 50
    app = App(settings, tier=tiering_service())
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("hist", 1, {"log.segment.bytes": "4k", "log.index.interval.bytes": "128"})
            values = [b"v%05d-" % i + random.Random(i).randbytes(80) for i in range(300)]
            for i in range(0, 300, 5):
                await c.produce("hist", 0, values[i:i + 5])  # durable acks: each is in a committed block
        log = app.broker.registry.get("hist", 0).log
        sealed = {s.base: s for s in log.segments}
        directory = log.directory
        await eventually(lambda: len(_copied(catalog_url)) >= len(sealed), what="segments copied")
        rows = _copied(catalog_url)
        for row in rows:
            assert os.stat(store_dir / row.object_key).st_ino == os.stat(sealed[row.base_seq].path).st_ino
        put = {row.object_key: (store_dir / row.object_key).read_bytes() for row in rows}
    finally:
        await app.stop()

    truncate_partition_dir(directory, (rows[0].base_seq + rows[0].last_seq) // 2)
    store = LocalObjectStore(store_dir)
    await assert_objects_kept(store, put)
    shutil.rmtree(tmp_path / "data")

    app = App(settings, tier=tiering_service())
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            got = [m async for m in c.drain("hist", 0, 0, fetch_bytes=3000)]
    finally:
        await app.stop()
    assert [(m.seq, m.value) for m in got] == list(enumerate(values, start=1))
    await assert_objects_kept(store, put)
    with Catalog.open(catalog_url) as cat:
        report = check_catalog(cat, "hist")
    assert report.ok, report.problems
