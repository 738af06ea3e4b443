"""The first available seq only moves forward: remote retention shorter than local retention leaves expired seqs on a
broker's disk, and neither that broker (live, restarted over its disk) nor another one following the partition may
serve them again. Found by bench/chaos.py --remote-retention-secs (docs/scale.md): after a kill -9 the reported start
moved back and expired values were served at their old seqs."""

from __future__ import annotations

import pytest

from tiered.catalog import Catalog
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog.states import SegmentState
from tiered.client import BoundaryError, Client
from tiered.protocol.bundle import Message

from tests.support.polling import eventually

# 4 KiB segments kept locally far longer (100 segments) than in the bucket (8 KiB): the disk outlives the copies.
RETAINED = {"log.segment.bytes": "4k", "log.index.interval.bytes": "256", "retention.segments.count": "100",
            "remote.retention.bytes": "8k"}


def value(i: int) -> bytes:
    return b"v%05d-" % i + bytes(90)


def _catalog_first(catalog_url: str) -> int:
    with Catalog.open(catalog_url) as cat:
        return catalog_partitions.get_partition_state(cat, "t", 0).first_available_seq


def _copied(catalog_url: str) -> int:
    with Catalog.open(catalog_url) as cat:
        return len(catalog_segments.list_segments(cat, "t", 0, states=(SegmentState.COPY_FINISHED,)))


async def _starts_at(client: Client, first: int, values: list[bytes], *, discover: bool = True) -> None:
    """The partition starts at `first`: reported so, seqs below it are boundary faults carrying it (never the bytes
    they held), and everything from it reads back at its own seq."""
    if discover:
        [bounds] = await client.discover_partitions("t", [0])
        assert bounds.first_available == first
    for seq in (1, first - 1):
        with pytest.raises(BoundaryError) as caught:
            await client.consume("t", 0, seq)
        assert caught.value.first_available == first
    got = [(m.seq, m.value) async for m in client.drain("t", 0, 0)]
    assert got == list(enumerate(values, start=1))[first - 1:]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_expired_history_on_the_disk_is_not_served_again_live_after_a_restart_or_by_a_follower(
        brokers, backend, request, tmp_path):
    catalog_url = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path}/c.db"
    a = await brokers.start("disk-a", catalog_url)
    async with await Client.connect("127.0.0.1", a.broker.port) as c:
        await c.create_topic("t", 1, RETAINED)
        values = [value(i) for i in range(300)]
        for i in range(0, len(values), 10):
            await c.produce("t", 0, [Message(v) for v in values[i:i + 10]])
        part = a.broker.registry.get("t", 0)
        sealed = len(part.log.segments)
        assert sealed >= 5
        await eventually(lambda: _copied(catalog_url) >= sealed, what="segments copied")
        assert await a.tier.remote_retention_pass() > 0
        first = _catalog_first(catalog_url)
        a.broker.enforce_retention()
        assert 1 < first and part.log.first_available < first  # the disk still holds seqs the bucket expired
        assert part.first_available == first
        await _starts_at(c, first, values)
    await a.stop()

    a = await brokers.start("disk-a", catalog_url)  # back over the same disk
    assert a.broker.registry.get("t", 0).first_available == first
    async with await Client.connect("127.0.0.1", a.broker.port) as c:
        await _starts_at(c, first, values)
    if backend == "postgresql":  # SQLite serves one broker at a time
        b = await brokers.start("disk-b", catalog_url, broker_id=1)  # follows t/0, led by A
        async with await Client.connect("127.0.0.1", b.broker.port) as c:
            await _starts_at(c, first, values, discover=False)  # Discover is the leader's (A's) answer
    assert _catalog_first(catalog_url) == first
    brokers.check(catalog_url)
