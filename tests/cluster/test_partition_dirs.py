"""A broker makes a partition's directory when the partition's log first writes there, not when its topic is created
nor when it is claimed (tiered.server.registry): each path that reaches a partition whose directory was never made on
this broker keeps working. Three broker processes on PostgreSQL and moto's S3; every read checked byte for byte, and the catalog's check
after each step."""

from __future__ import annotations

import shutil
from pathlib import Path

from tiered.client import Client

from tests.cluster.conftest import LEASE_MS

PARTITIONS = 6
# Small segments with local retention: the led partitions roll and delete, so retention runs beside the unmade ones.
CONFIG = {"produce.ack": "durable", "log.segment.bytes": "4k", "retention.segments.count": "2"}


def value(partition: int, i: int) -> bytes:
    return b"p%d-%03d-" % (partition, i) + b"x" * 92


def made(disk: Path) -> set[int]:
    """The partitions of topic `t` whose directory exists on `disk`."""
    return {int(entry.name) for entry in (disk / "t").iterdir() if entry.is_dir()}


async def produce(cluster, first: int, last: int) -> None:
    """Through a new client that knows the live brokers (one bundle per partition, acknowledged durably)."""
    live = [f"127.0.0.1:{bp.port}" for bp in cluster.brokers.values() if bp.proc.poll() is None]
    async with await Client.connect_any(live) as client:
        for p in range(PARTITIONS):
            await client.produce("t", p, [value(p, i) for i in range(first, last + 1)])


async def read_from(port: int, partition: int) -> list[tuple[int, bytes]]:
    """A consume sent to this broker (followed to the leader for what it does not serve itself)."""
    async with await Client.connect("127.0.0.1", port) as c:
        return [(m.seq, m.value) async for m in c.drain("t", partition, 1)]


async def read_everywhere(cluster, messages: int) -> None:
    for broker_id, bp in cluster.brokers.items():
        if bp.proc.poll() is not None:
            continue
        for p in range(PARTITIONS):
            got = await read_from(bp.port, p)
            assert got == [(i, value(p, i)) for i in range(1, messages + 1)], (broker_id, p)


async def test_directories_follow_leadership_through_reads_takeover_restart_and_wipe(cluster):
    cluster.start_all(range(3))
    async with await Client.connect_any([f"127.0.0.1:{cluster.brokers[0].port}"]) as client:
        await client.create_topic("t", PARTITIONS, CONFIG)
    leaders = cluster.wait_for_leaders("t", {0, 1, 2})
    disks = {b: cluster.root / f"disk{b}" for b in range(3)}
    last = PARTITIONS - 1  # made at creation on every disk: the disk alone counts the topic's partitions
    assert all(made(disk) == {last} for disk in disks.values())  # created and claimed: nothing written yet
    await produce(cluster, 1, 60)

    # A follower serves what it has not made from the bucket: every partition read through every broker.
    await read_everywhere(cluster, 60)
    for b, disk in disks.items():
        assert made(disk) == {p for p, leader in leaders.items() if leader == b} | {last}, b
    cluster.check("t")

    # A restart opens the partitions it never made as not led here, not as damaged ones.
    follower = next(b for b in range(3) if b != leaders[0])
    cluster.kill(follower)
    cluster.wait_for_leaders("t", set(range(3)) - {follower}, timeout_s=LEASE_MS / 1000 + 10)
    cluster.start(follower)
    output = cluster.brokers[follower].output()
    assert "have no directory" not in output and "could not be opened" not in output, output[-3000:]
    await produce(cluster, 61, 80)
    await read_everywhere(cluster, 80)
    cluster.check("t")

    # A takeover: the survivors claim the victim's partitions, whose directories they make at their first write.
    leaders = cluster.wait_for_leaders("t", set(range(3)))
    victim = max(set(leaders.values()), key=lambda b: sum(1 for v in leaders.values() if v == b))
    taken = {p for p, b in leaders.items() if b == victim}
    cluster.kill(victim)
    after = cluster.wait_for_leaders("t", set(range(3)) - {victim}, timeout_s=LEASE_MS / 1000 + 10)
    await produce(cluster, 81, 100)
    for b in set(range(3)) - {victim}:
        assert {p for p in taken if after[p] == b} <= made(disks[b]), b
    await read_everywhere(cluster, 100)
    cluster.check("t")

    # A wiped disk: the catalog's topics are laid out again, no partition's directory made until it is written.
    shutil.rmtree(disks[victim])
    cluster.start(victim)
    assert made(disks[victim]) == {last}
    await read_everywhere(cluster, 100)
    cluster.check("t")
