"""A partition whose files are damaged darkens only itself, never its topic (tiered.server.registry).

Each test writes a topic of three partitions, stops the broker, damages partition 1's files on disk the way a crash,
a full disk or an operator's mistake leaves them, and starts a broker on the same directory again:
- what recovery can repair (a torn tail, a truncated index) is repaired, and every partition serves as before;
- what it cannot (segments whose seqs overlap; garbage over a sealed segment's head; a file where the partition's directory should be) leaves that one
  partition out: without a catalog it is not served (answered "no leader", its files left as they are), with one it is
  moved aside and opened again empty, its acknowledged history read from the bucket. The topic and its other
  partitions serve throughout, and /readyz and /metrics name what happened.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.ops.helpers import ahttp_get, scrape
from tests.support.broker import local_settings
from tiered.client import Client, TankError
from tiered.protocol.codes import ProduceStatus
from tiered.server.app import App
from tiered.server.registry import Role

PARTITIONS = 3
MESSAGES = 60
SMALL_SEGMENTS = {"log.segment.bytes": "4k"}  # 60 messages of 100 bytes: a sealed segment and an active one


def value(partition: int, i: int) -> bytes:
    return b"p%d-%03d-" % (partition, i) + b"x" * 92


async def write_topic(port: int, config: dict[str, str]) -> None:
    async with await Client.connect("127.0.0.1", port) as c:
        await c.create_topic("t", PARTITIONS, config)
        for p in range(PARTITIONS):
            for i in range(1, MESSAGES + 1):
                await c.produce("t", p, [value(p, i)])


async def read_all(port: int, partition: int) -> list[tuple[int, bytes]]:
    async with await Client.connect("127.0.0.1", port) as c:
        return [(m.seq, m.value) async for m in c.drain("t", partition, 1)]


def expected(partition: int) -> list[tuple[int, bytes]]:
    return [(i, value(partition, i)) for i in range(1, MESSAGES + 1)]


def files(directory: Path, suffix: str) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(suffix))


# The damages, each done to a stopped broker's partition directory.

def torn_tail(directory: Path) -> None:
    """Power lost in the middle of a write: the active segment ends in a partial bundle."""
    with open(files(directory, ".log")[0], "ab") as f:
        f.write(b"\x85\x01garbage that is no whole bundle")


def truncated_index(directory: Path) -> None:
    """The sealed segment's index lost its last bytes (a half-written entry)."""
    index = directory / (files(directory, ".ilog")[0].name.split("-")[0] + ".index")
    os.truncate(index, index.stat().st_size - 3)


def overlapping_segments(directory: Path) -> None:
    """Two sealed segments claim the same seqs: recovery cannot tell which holds them, and refuses to open."""
    sealed = files(directory, ".ilog")[0]
    base_last, stamp = sealed.name.split("_")
    shutil.copy(sealed, directory / f"5-{base_last.split('-')[1]}_{stamp}")


def garbage_head(directory: Path) -> None:
    """Bytes overwritten at the head of a sealed segment (its index left as it was): no cut can repair that, and
    recovery refuses to open the directory rather than serve the garbage."""
    with open(files(directory, ".ilog")[0], "r+b") as f:
        f.write(b"\xff" * 64)


def file_for_directory(directory: Path) -> None:
    """A file where the partition's directory should be."""
    shutil.rmtree(directory)
    directory.write_text("not a directory")


# ------------------------------------------------------------------------------------------------- recoverable


async def written_without_a_catalog(tmp_path: Path):
    """The settings of a broker without a catalog whose topic `t` was written and that then stopped."""
    settings = local_settings(tmp_path / "data", http_listen="127.0.0.1:0")
    app = App(settings, local_only=True)
    await app.start()
    try:
        await write_topic(app.broker.port, SMALL_SEGMENTS)
    finally:
        await app.stop()
    return settings


@pytest.mark.parametrize("damage", [torn_tail, truncated_index])
async def test_what_recovery_repairs_is_repaired_and_every_partition_serves(tmp_path, damage):
    settings = await written_without_a_catalog(tmp_path)
    damage(tmp_path / "data" / "t" / "1")

    app = App(settings, local_only=True)
    await app.start()
    try:
        assert app.registry.damaged == {}
        for p in range(PARTITIONS):
            assert await read_all(app.broker.port, p) == expected(p)
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.produce("t", 1, [b"after"])
        assert (await read_all(app.broker.port, 1))[-1] == (MESSAGES + 1, b"after")
        ready = await ahttp_get(app.http.port, "/readyz")
        assert (ready.status, ready.text) == (200, "ready\n")
    finally:
        await app.stop()


# ------------------------------------------------------------------------------------------- no catalog below


@pytest.mark.parametrize("damage", [overlapping_segments, garbage_head, file_for_directory])
async def test_without_a_catalog_a_partition_that_cannot_be_opened_is_left_out_alone(tmp_path, damage):
    settings = await written_without_a_catalog(tmp_path)
    damaged = tmp_path / "data" / "t" / "1"
    damage(damaged)
    before = sorted(os.listdir(damaged)) if damaged.is_dir() else damaged.read_text()

    app = App(settings, local_only=True)
    await app.start()
    try:
        # The topic and its other partitions serve.
        for p in (0, 2):
            assert await read_all(app.broker.port, p) == expected(p)
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.produce("t", 2, [b"after"])
            # The damaged one is not led here: a produce is answered "no leader", and nothing is written.
            assert await c.produce_raw("t", 1, _bundle(b"lost?")) == ProduceStatus.NO_LEADER
        assert app.registry.get("t", 1).role is not Role.LEADER
        assert after_of(damaged) == before  # its files are left as they were, for an operator
        [record] = app.registry.damaged.values()
        assert (str(record.tp), record.served, record.kept_at) == ("t/1", False, None)
        ready = await ahttp_get(app.http.port, "/readyz")
        assert ready.status == 200
        assert ready.text.startswith("ready\npartition t/1 could not be opened (")
        assert "not served here until it is repaired" in ready.text
        metrics = await scrape(app.http.port)
        assert metrics.value("tiered_partitions_damaged", served="false") == 1
        assert metrics.value("tiered_partitions_damaged", served="true") == 0
        view = await ahttp_get(app.http.port, "/v1/tier")  # the per-partition view shows it, empty and not led
        assert view.status == 200 and {"topic": "t", "partition": 1, "role": "opening", "local_last": 0}.items() <= \
            next(p for p in json.loads(view.text) if (p["topic"], p["partition"]) == ("t", 1)).items()
        assert app.broker.enforce_retention() == 0  # the timers pass over it
    finally:
        await app.stop()


def after_of(path: Path):
    return sorted(os.listdir(path)) if path.is_dir() else path.read_text()


def _bundle(payload: bytes) -> bytes:
    from tiered.client.client import as_messages
    from tiered.protocol.bundle import encode_bundle

    return encode_bundle(as_messages([payload]))


# ------------------------------------------------------------------------------------- with a catalog below


@pytest.mark.parametrize("damage", [overlapping_segments, garbage_head, file_for_directory])
async def test_with_a_catalog_a_damaged_partition_starts_again_from_the_bucket(brokers, tmp_path, damage):
    """Every message was acknowledged durably, so the bucket holds it: the damaged partition's files are moved aside
    whole and it is opened again empty, as a lost disk is; its history is read from the bucket at the same seqs,
    and produces continue after the catalog's high-water mark."""
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    app = await brokers.start("disk", catalog_url, http_listen="127.0.0.1:0")
    await write_topic(app.broker.port, SMALL_SEGMENTS)
    await app.stop()
    damaged = tmp_path / "disk" / "t" / "1"
    damage(damaged)
    before = after_of(damaged)

    app = await brokers.start("disk", catalog_url, http_listen="127.0.0.1:0")
    for p in range(PARTITIONS):
        assert await read_all(app.broker.port, p) == expected(p)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.produce("t", 1, [b"after"])
    assert (await read_all(app.broker.port, 1))[-1] == (MESSAGES + 1, b"after")
    [record] = app.registry.damaged.values()
    assert (str(record.tp), record.served) == ("t/1", True)
    kept = Path(record.kept_at)
    assert kept.parent == tmp_path / "disk" / ".tiered" / "damaged" and after_of(kept) == before
    ready = await ahttp_get(app.http.port, "/readyz")
    assert ready.status == 200 and "partition t/1 could not be opened (" in ready.text
    assert f"its files are in {kept}" in ready.text
    assert (await scrape(app.http.port)).value("tiered_partitions_damaged", served="true") == 1
    await app.stop()
    brokers.check(catalog_url)

    # The next start opens the new directory as any other: nothing is damaged any more.
    app = await brokers.start("disk", catalog_url)
    assert app.registry.damaged == {}
    assert (await read_all(app.broker.port, 1))[-1] == (MESSAGES + 1, b"after")


async def test_a_creation_a_crash_interrupted_is_done_again_at_the_next_start(brokers, tmp_path):
    """A wiped disk is given the catalog's topics at start; a kill -9 in the middle of laying one out leaves its
    staging directory (`.t`, empty partition directories). The next start lays it out again and serves it, instead
    of answering "unknown topic" for it until an operator removes the directory."""
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    app = await brokers.start("disk", catalog_url)
    await write_topic(app.broker.port, SMALL_SEGMENTS)
    await app.stop()
    shutil.rmtree(tmp_path / "disk" / "t")  # the disk lost the topic, and its new layout was cut short:
    for p in range(2):
        (tmp_path / "disk" / ".t" / str(p)).mkdir(parents=True)

    app = await brokers.start("disk", catalog_url)
    assert not (tmp_path / "disk" / ".t").exists()
    for p in range(PARTITIONS):
        assert await read_all(app.broker.port, p) == expected(p)
    assert app.registry.damaged == {}


async def test_with_a_catalog_a_partition_that_cannot_be_moved_aside_is_left_out_until_repaired(brokers, tmp_path):
    """When the damaged directory cannot be moved aside (here `.tiered/damaged` is a file), the partition is not
    served here, even once claimed: no produce is appended to its damaged files, the topic's other partitions serve,
    and /readyz says why. Once the obstacle is gone, the next start moves it aside and serves it from the bucket."""
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    app = await brokers.start("disk", catalog_url, http_listen="127.0.0.1:0")
    await write_topic(app.broker.port, SMALL_SEGMENTS)
    await app.stop()
    damaged = tmp_path / "disk" / "t" / "1"
    overlapping_segments(damaged)
    before = after_of(damaged)
    obstacle = tmp_path / "disk" / ".tiered" / "damaged"
    obstacle.write_text("in the way")

    app = await brokers.start("disk", catalog_url, http_listen="127.0.0.1:0")
    for p in (0, 2):
        assert await read_all(app.broker.port, p) == expected(p)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        assert await c.produce_raw("t", 1, _bundle(b"lost?")) == ProduceStatus.NO_LEADER
        await c.produce("t", 0, [b"after"])
    assert app.registry.get("t", 1).role is not Role.LEADER
    assert after_of(damaged) == before
    [record] = app.registry.damaged.values()
    assert (str(record.tp), record.served) == ("t/1", False)
    assert "RecoveryError" in record.reason and "FileExistsError" in record.reopen_error
    ready = await ahttp_get(app.http.port, "/readyz")
    assert ready.status == 200 and "partition t/1 could not be opened (" in ready.text
    assert "not served here until it is repaired (moving it aside failed: FileExistsError" in ready.text
    await app.stop()

    obstacle.unlink()
    app = await brokers.start("disk", catalog_url)
    assert await read_all(app.broker.port, 1) == expected(1)
    [record] = app.registry.damaged.values()
    assert record.served and after_of(Path(record.kept_at)) == before
    brokers.check(catalog_url)


async def test_with_a_catalog_a_partition_whose_directory_is_gone_is_served_again(brokers, tmp_path):
    """The last partition's directory deleted: the disk alone cannot tell the topic had it, the catalog can. The
    partition is opened again empty and served from the bucket, like a partition of a lost disk."""
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    app = await brokers.start("disk", catalog_url)
    await write_topic(app.broker.port, SMALL_SEGMENTS)
    await app.stop()
    shutil.rmtree(tmp_path / "disk" / "t" / str(PARTITIONS - 1))

    app = await brokers.start("disk", catalog_url)
    for p in range(PARTITIONS):
        assert await read_all(app.broker.port, p) == expected(p)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.produce("t", PARTITIONS - 1, [b"after"])
    [record] = app.registry.damaged.values()
    assert (str(record.tp), record.served, record.kept_at) == (f"t/{PARTITIONS - 1}", True, None)
    assert (tmp_path / "disk" / "t" / str(PARTITIONS - 1)).is_dir()
    await app.stop()
    brokers.check(catalog_url)


async def test_a_claim_plan_the_local_log_cannot_take_reopens_the_partition_empty_and_continues(
        brokers, tmp_path, s3_faults, monkeypatch):
    """Broker.apply_plans: the disk opened cleanly, but carrying the claim's plan out on it fails (here its
    truncation of records the catalog never committed, replaced by another volume's, meets segments that overlap,
    put there after the broker opened the directory and before its claim). The partition is moved aside and opened again empty, the plan
    continues on the empty log: every acknowledged message reads back from the bucket at its seq, and produces
    continue after the catalog's high-water mark."""
    from tiered.server.broker import Broker

    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    a = await brokers.start("disk", catalog_url, produce_ack_timeout_ms=500, shutdown_timeout_s=1.0)
    acked = [b"a-%03d" % i for i in range(60)]
    async with await Client.connect("127.0.0.1", a.broker.port) as c:
        await c.create_topic("t", 1, {"log.segment.bytes": "1m"})
        for i in range(0, 60, 10):
            await c.produce("t", 0, acked[i:i + 10])
        s3_faults.go_away()  # 61..63 are appended on the disk but never committed
        for i in range(3):
            with pytest.raises(TankError):
                await c.produce("t", 0, [b"never-%d" % i])
    await a.stop()
    s3_faults.come_back()
    b = await brokers.start("disk-b", catalog_url)  # another volume leads and commits 61..70: A's 61..63 must go
    async with await Client.connect("127.0.0.1", b.broker.port) as c:
        acked += [b"b-%03d" % i for i in range(10)]
        await c.produce("t", 0, acked[60:])
    await b.stop()

    directory = tmp_path / "disk" / "t" / "0"
    plans_seen = []
    apply_plans = Broker.apply_plans

    async def damaged_before_the_claim(self, plans):
        for plan in plans:
            plans_seen.append(plan)
            if (plan.topic, plan.partition) == ("t", 0):
                [active] = files(directory, ".log")  # a copy of the active segment claiming its first seq
                shutil.copy(active, directory / "1-1.ilog")
        await apply_plans(self, plans)

    monkeypatch.setattr(Broker, "apply_plans", damaged_before_the_claim)
    app = await brokers.start("disk", catalog_url)
    [plan] = plans_seen
    assert plan.truncate_after == 60  # the plan had to change the local log: the path under test
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        assert [(m.seq, m.value) async for m in c.drain("t", 0, 1)] == list(enumerate(acked, start=1))
        await c.produce("t", 0, [b"after"])
        assert [(m.seq, m.value) async for m in c.drain("t", 0, 1)][-1] == (71, b"after")
    [record] = app.registry.damaged.values()
    assert (str(record.tp), record.served) == ("t/0", True)
    assert record.reason.startswith("RecoveryError:") and "overlap" in record.reason
    kept = Path(record.kept_at)
    assert kept.parent == tmp_path / "disk" / ".tiered" / "damaged"
    # Two segments based at seq 1 (the truncation may have renamed the copy): moved aside as they were refused.
    assert len([n for n in os.listdir(kept) if n.startswith(("1.", "1_", "1-"))]) == 2, os.listdir(kept)
    assert app.registry.get("t", 0).role is Role.LEADER
    await app.stop()
    brokers.check(catalog_url)
