"""Fail-back: broker A's volume is replaced by B's (same broker id, as a pod on a new volume), B acknowledges new
messages; then A comes back on its old disk, which holds records at those same seqs that were appended but never
committed. A must serve B's messages at their seqs, never its own divergent records, and never copy them."""

from __future__ import annotations

import pytest

from tiered.client import Client, TankError
from tiered.protocol.bundle import Message

from tests.durability.conftest import SMALL_SEGMENTS


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_broker_back_on_its_old_disk_serves_the_new_leader_s_history(brokers, backend, request, tmp_path,
                                                                              s3_faults):
    catalog_url = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path}/c.db"
    # shutdown_timeout_s: its stop waits out the outage, 1 s rather than 3
    a = await brokers.start("disk-a", catalog_url, produce_ack_timeout_ms=500, shutdown_timeout_s=1.0)
    async with await Client.connect("127.0.0.1", a.broker.port) as c:
        await c.create_topic("t", 1, {**SMALL_SEGMENTS, "log.segment.bytes": "1m"})
        acked = [b"a-%03d" % i for i in range(100)]
        for i in range(0, 100, 10):
            await c.produce("t", 0, acked[i : i + 10])
        s3_faults.go_away()  # A appends 101..105 but cannot commit them: answered "not confirmed"
        for i in range(5):
            with pytest.raises(TankError):
                await c.produce("t", 0, [b"divergent-%d" % i])
    await a.stop()  # its open blocks cannot commit: the divergent records stay on disk A only
    s3_faults.come_back()

    b = await brokers.start("disk-b", catalog_url)  # a new volume under the same broker id
    async with await Client.connect("127.0.0.1", b.broker.port) as c:
        new = [b"b-%03d" % i for i in range(10)]
        await c.produce("t", 0, new)
        got = [(m.seq, m.value) async for m in c.drain("t", 0, 0)]
    expected = list(enumerate(acked + new, start=1))
    assert got == expected  # B continues at 101, from the catalog
    await b.stop()
    brokers.check(catalog_url)

    a = await brokers.start("disk-a", catalog_url)  # A is back, on its old disk
    async with await Client.connect("127.0.0.1", a.broker.port) as c:
        got = [(m.seq, m.value) async for m in c.drain("t", 0, 0)]
        assert got == expected  # B's messages at 101..110, not A's divergent records
        await c.produce("t", 0, [b"after"])
        got = [(m.seq, m.value) async for m in c.drain("t", 0, 0)]
        assert got == expected + [(111, b"after")]
        part = a.broker.registry.get("t", 0)
        held = [r.first_seq for r in part.log.iter_records(1, 200)]
        assert held == list(range(1, 101, 10)) + [111]  # the divergent 101..105 are gone from disk A
    brokers.check(catalog_url)


async def test_a_commit_that_does_not_continue_the_catalog_is_refused(brokers, tmp_path):
    """Two brokers claiming in turn: the one that lost the partition can neither commit (stale epoch) nor, after a
    fresh claim, reuse seqs the other committed (continuity): its produce is refused and nothing is overwritten."""
    catalog_url = f"sqlite:///{tmp_path}/c.db"
    a = await brokers.start("disk-a", catalog_url)
    async with await Client.connect("127.0.0.1", a.broker.port) as c:
        await c.create_topic("t", 1)
        await c.produce("t", 0, [b"one"])
    b = await brokers.start("disk-b", catalog_url)  # claims t/0 while A still runs: A is fenced at its next commit
    async with await Client.connect("127.0.0.1", b.broker.port) as cb:
        await cb.produce("t", 0, [b"two"])
    async with await Client.connect("127.0.0.1", a.broker.port) as c:
        with pytest.raises(TankError) as refused:
            await c.produce("t", 0, [Message(b"stale")])
        assert refused.value.code == 0xFD  # no leader here any more: safe to send to the new leader
    async with await Client.connect("127.0.0.1", b.broker.port) as cb:
        assert [(m.seq, m.value) async for m in cb.drain("t", 0, 0)] == [(1, b"one"), (2, b"two")]
    brokers.check(catalog_url)
