"""Remote compaction one group at a time, against moto's S3 server and both catalog backends: the extra local disk
and the extra bucket bytes of a pass, measured while it runs (the work directory walked, the bucket listed at every
step); kill -9 of a process at every step of a pass from the bucket; the streamed reader of segment objects on
whole, truncated, oversized and random input."""

from __future__ import annotations

import random
import signal
import textwrap
from pathlib import Path

import pytest

from tests.support.forkserver import ForkServer
from tests.support.compaction import Model, append_workload, log_messages, random_workload, rows
from tests.tiering.test_remote_compaction import (
    assert_bucket_holds_what_the_catalog_names,
    NOW_S,
    RETENTION_S,
    compactor,
    copy_history,
    decode_segment,
    open_log,
    remote_messages,
)
from tiered.catalog.check import check_partition
from tiered.catalog.compaction import readable_segments
from tiered.protocol.errors import ProtocolError
from tiered.storage.compaction import output_allowance, compact_partition
from tiered.tiering.objects import keys
from tiered.tiering.compaction.bucket_compaction import object_records
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.tiering.objects.meter import Attribution

REPO = Path(__file__).resolve().parents[2]


def history(tmp_path, seed: int, bundles: int, distinct_keys: int):
    plog = open_log(tmp_path / "local")
    append_workload(plog, random_workload(random.Random(seed), bundles, distinct_keys))
    plog.seal_active()
    return plog, log_messages(plog)


class SpaceProbe:
    """At every step of a pass: the bytes in its work directory, and the bytes of the partition's segment objects
    in the bucket over what was there when the pass started (the pass deletes nothing: old objects wait for their
    grace period, so this is what the pass wrote and that exists beside what it replaces). Checks the bounds there."""

    def __init__(self, s3_admin, bucket: str, work: Path, old_rows):
        self.s3_admin, self.bucket, self.work = s3_admin, bucket, work
        self.old = {r.base_seq: r.total_bytes for r in old_rows}
        self.baseline = self.bucket_bytes()
        self.group_input = 0  # of the group being written
        self.rewritten = 0  # input bytes of the groups written so far, the current one included
        self.steps: list[str] = []
        self.peak_disk = self.peak_bucket = 0

    def bucket_bytes(self) -> int:
        prefix = "store/" + keys.partition_segments_prefix("t", 0)
        pages = self.s3_admin.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sum(o["Size"] for page in pages for o in page.get("Contents", []))

    def disk_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.work.rglob("*") if f.is_file()) if self.work.exists() else 0

    def __call__(self, name: str) -> None:
        self.steps.append(name)
        disk, extra = self.disk_bytes(), self.bucket_bytes() - self.baseline
        if name.startswith("write "):
            assert disk == 0, (name, disk)  # the group before left nothing behind
            first, last = map(int, name.split()[1].split("-"))
            self.group_input = sum(b for base, b in self.old.items() if first <= base <= last)
            self.rewritten += self.group_input
        elif name.startswith("swap ") and not self.group_input:  # a group from local copies
            first, last = map(int, name.split()[1].split("-"))
            self.rewritten += sum(b for base, b in self.old.items() if first <= base <= last)
        assert disk <= output_allowance(self.group_input), (name, disk, self.group_input)
        assert 0 <= extra <= output_allowance(self.rewritten), (name, extra, self.rewritten)
        self.peak_disk, self.peak_bucket = max(self.peak_disk, disk), max(self.peak_bucket, extra)


@pytest.mark.parametrize("distinct_keys", [12, 5000])  # most of the bytes go; almost nothing goes
async def test_a_pass_from_the_bucket_holds_one_group_on_disk_and_at_most_1_2x_in_the_bucket(
        s3_store, s3_admin, s3_bucket, cat, acat, tmp_path, distinct_keys):
    plog, before = history(tmp_path, seed=11, bundles=100, distinct_keys=distinct_keys)
    epoch = await copy_history(s3_store, cat, "t", plog)
    plog.close()
    old_rows = readable_segments(cat, "t", 0)
    empty = open_log(tmp_path / "new-leader")
    probe = SpaceProbe(s3_admin, s3_bucket, tmp_path / "work" / "t.0", old_rows)
    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, empty, epoch, on_step=probe)
    assert report.groups >= 3 and report.stopped is None
    # One group at a time: the disk never held more than the largest group's output, far below the range.
    range_bytes = sum(r.total_bytes for r in old_rows)
    assert 0 < probe.peak_disk < range_bytes / 2
    # The bucket, after the pass: every object written is there beside the old ones (their grace period).
    after = probe.bucket_bytes() - probe.baseline
    assert after == report.bytes_after <= output_allowance(report.bytes_before)
    assert probe.peak_bucket <= after
    if distinct_keys == 12:
        assert report.bytes_after < report.bytes_before / 3
    expected = Model(RETENTION_S * 1000).compact(before, int(NOW_S * 1000))
    assert rows(await remote_messages(s3_store, cat, "t")) == rows(expected)
    assert check_partition(cat, "t", 0).problems == []
    assert not any((tmp_path / "work").rglob("*.ilog"))
    # Both reads of the range went through range GETs: the scan and the rewrite of the groups that change.
    assert range_bytes - sum(r.index_size_bytes for r in old_rows) < report.downloaded_bytes
    empty.close()


async def test_a_pass_from_local_copies_writes_nothing_locally_and_at_most_1_2x_in_the_bucket(
        s3_store, s3_admin, s3_bucket, cat, acat, tmp_path):
    plog, before = history(tmp_path, seed=12, bundles=100, distinct_keys=40)
    epoch = await copy_history(s3_store, cat, "t", plog)
    compact_partition(plog, NOW_S, force=True)
    probe = SpaceProbe(s3_admin, s3_bucket, tmp_path / "work" / "t.0", readable_segments(cat, "t", 0))
    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, plog, epoch, on_step=probe)
    assert report.groups and report.stopped is None and probe.peak_disk == 0
    assert probe.bucket_bytes() - probe.baseline == report.bytes_after <= output_allowance(report.bytes_before)
    assert rows(await remote_messages(s3_store, cat, "t")) == rows(Model(RETENTION_S * 1000).compact(
        before, int(NOW_S * 1000)))
    assert check_partition(cat, "t", 0).problems == []
    plog.close()


CHILD_IMPORTS = """
    import asyncio, os, signal, sys
    from pathlib import Path
    from tests.tiering.test_remote_compaction import compactor, open_log
    from tests.tiering.test_run_compaction import leader_without_history
    from tiered.catalog import Catalog
    from tiered.tiering.catalog_access import AsyncCatalog
    from tiered.tiering.objects.s3_store import S3ObjectStore
"""
CHILD = textwrap.dedent(CHILD_IMPORTS) + textwrap.dedent("""
    url, endpoint, bucket, root, epoch, kill_at, history = sys.argv[1:8]
    seen = []
    def step(name):
        seen.append(name)
        print(name, flush=True)
        if len(seen) == int(kill_at) + 1:
            os.kill(os.getpid(), signal.SIGKILL)
    async def main():
        cat = Catalog.open(url)
        acat = AsyncCatalog(cat)
        store = S3ObjectStore(bucket, "store", endpoint_url=endpoint, region="us-east-1", path_style=True)
        # A broker whose disk holds none of the history: of remote segments, or of block runs (remote.copy=false)
        leader = open_log(Path(root) / "new-leader") if history == "segments" else leader_without_history(Path(root))
        report = await compactor(store, acat, Path(root)).compact("t", 0, leader, int(epoch), force=True,
                                                                   on_step=step)
        print("done", report.groups, flush=True)
        await store.close()
        acat.shutdown()
        cat.close()
    asyncio.run(main())
""")


async def kill_9_at_every_step(catalog_url: str, s3_endpoint: str, s3_bucket: str, root, epoch: int, history: str,
                               check) -> list[str]:
    """Runs a pass from the bucket in a child process killed at its first step, then its second, and so on, until a
    pass finishes; `check()` after each kill. Returns the steps the kills landed on. The children are forked from
    one process that imported what they run (tests/support/forkserver.py): a real process and a real SIGKILL each,
    without a second of start-up each."""
    steps = []
    with ForkServer(CHILD_IMPORTS, cwd=REPO, env={"PYTHONPATH": str(REPO)}) as children:
        for kill_at in range(200):
            child = children.run(CHILD, [catalog_url, s3_endpoint, s3_bucket, root, epoch, kill_at, history])
            lines = child.stdout.splitlines()
            if child.returncode == 0:
                assert lines[-1].startswith("done"), lines
                return steps
            assert child.returncode == -signal.SIGKILL, child.stderr
            steps.append(lines[-1])
            await check(lines[-1])
    pytest.fail(f"the pass never finished: {steps[-5:]}")


# Every step is crashed in process on both catalogs in test_remote_compaction.py; the kill -9 of a real process, a
# minute a catalog, runs on SQLite here and on PostgreSQL in test_run_compaction.py.
@pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)
async def test_kill_9_at_every_step_of_a_pass_from_the_bucket(s3_store, s3_endpoint, s3_bucket, catalog_url, cat,
                                                              acat, tmp_path):
    plog, before = history(tmp_path, seed=13, bundles=60, distinct_keys=12)
    original = {m.seq: (m.key, m.value) for m in before}
    expected = Model(RETENTION_S * 1000).compact(before, int(NOW_S * 1000))
    kept = {m.seq for m in expected}
    epoch = await copy_history(s3_store, cat, "t", plog)
    plog.close()

    async def check(step: str) -> None:
        # Old or new, group by group, and the catalog check passes.
        assert check_partition(cat, "t", 0).problems == [], step
        for row in readable_segments(cat, "t", 0):
            got = decode_segment(await s3_store.get(row.object_key), row.base_seq)
            span = range(row.base_seq, row.last_seq + 1)
            assert all(original[m.seq] == (m.key, m.value) for m in got)
            assert {m.seq for m in got} in ({s for s in original if s in span}, {s for s in kept if s in span})

    steps = await kill_9_at_every_step(catalog_url, s3_endpoint, s3_bucket, tmp_path, epoch, "segments", check)
    assert {s.split()[0] for s in steps} == {"write", "upload", "swap"}
    assert rows(await remote_messages(s3_store, cat, "t")) == rows(expected)
    assert check_partition(cat, "t", 0).problems == []
    await assert_bucket_holds_what_the_catalog_names(s3_store, acat, cat, "t", 0)

async def test_segment_objects_are_read_as_whole_records_from_any_window(tmp_path):
    plog, _ = history(tmp_path, seed=14, bundles=40, distinct_keys=12)
    store = LocalObjectStore(tmp_path / "objects", fsync=False)
    segment = plog.segments[1]
    data = Path(segment.path).read_bytes()
    await store.put("seg", data)
    expected = list(plog.iter_records(segment.base, segment.last))

    async def read(size: int, window: int, key: str = "seg") -> list:
        return [r async for batch in object_records(store, key, size, segment.base, window=window,
                                                                attribution=Attribution.topic("t")) for r in batch]

    for window in (1, 7, 100, len(data), 1 << 20):
        assert await read(len(data), window) == expected
    # A run inside a block: the same bytes between others, read from its offset (positions relative to it).
    await store.put("block", b"other runs" + data + b"more runs")
    for window in (1, 7, 100, 1 << 20):
        got = [r async for batch in object_records(store, "block", len(data), segment.base, offset=10, window=window,
                                                                   attribution=Attribution.topic("t"))
               for r in batch]
        assert got == expected
    # Oversized: an object longer than its row says is read up to the row's size, at a record boundary.
    await store.put("longer", data + b"\x05abc")
    assert await read(len(data), 64, "longer") == expected
    # Truncated: the object ends before its size, or the size ends inside a record.
    await store.put("short", data[:-3])
    with pytest.raises(ProtocolError):
        await read(len(data), 64, "short")
    with pytest.raises(ProtocolError):
        await read(len(data) - 3, 64)
    # Random bytes: an error, or records that tile the bytes exactly with seqs going up.
    rng = random.Random(5)
    for i in range(200):
        junk = rng.randbytes(rng.randint(1, 300))
        await store.put(f"junk{i}", junk)
        try:
            got = await read(len(junk), rng.choice([1, 16, 4096]), f"junk{i}")
        except ProtocolError:
            continue
        assert sum(len(r.record) for r in got) == len(junk)
        assert all(a.last_seq < b.first_seq for a, b in zip(got, got[1:]))
    await store.close()
    plog.close()
