"""A disk lost after some of its segments were copied: the acknowledged tail that lived only in block runs stays
readable at its seqs, through the new disk's first copies and local retention (the data loss of the adversarial run:
a consume at 601 answered from 701, 601..700 pruned from the catalog)."""

from __future__ import annotations

import shutil

import pytest

from tiered.catalog import Catalog
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import segments as catalog_segments
from tiered.catalog.states import SegmentState
from tiered.client import Client

from tests.durability.conftest import SMALL_SEGMENTS
from tests.support.polling import eventually


def value(i: int) -> bytes:
    return b"acked-%05d-" % i + bytes([65 + i % 26]) * 60


async def produce(c: Client, first: int, count: int) -> list[bytes]:
    values = [value(i) for i in range(first, first + count)]
    for i in range(0, count, 10):
        await c.produce("t", 0, values[i : i + 10])
    return values


def copied_last(catalog_url: str) -> int:
    with Catalog.open(catalog_url) as cat:
        rows = catalog_segments.list_segments(cat, "t", 0, states=(SegmentState.COPY_FINISHED,))
    return max((r.last_seq for r in rows), default=0)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_lost_disk_keeps_every_acknowledged_message_readable(brokers, backend, request, tmp_path):
    catalog_url = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path}/c.db"
    app = await brokers.start("disk", catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("t", 1, SMALL_SEGMENTS)
        acked = await produce(c, 1, 700)
        part = app.broker.registry.get("t", 0)
        sealed_last = part.log.segments[-1].last
        await eventually(lambda: copied_last(catalog_url) >= sealed_last, what="segments copied")
    tail_first = sealed_last + 1  # from here on, only block runs hold the acknowledged messages
    assert tail_first <= 700
    await app.stop()
    brokers.check(catalog_url)
    shutil.rmtree(tmp_path / "disk")  # the disk is lost

    app = await brokers.start("disk", catalog_url)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        acked += await produce(c, 701, 400)
        part = app.broker.registry.get("t", 0)
        new_sealed = part.log.segments[-1].last
        await eventually(lambda: copied_last(catalog_url) >= new_sealed, what="the new disk's segments copied")
        app.broker.enforce_retention()  # the new disk's oldest segments leave it: their seqs come from the bucket
        brokers.check(catalog_url)
        # The lost disk's tail is still a block run, not pruned by the new disk's copies.
        with Catalog.open(catalog_url) as cat:
            run = catalog_blocks.find_run(cat, "t", 0, tail_first)
        assert run is not None and run.holds(tail_first) and run.first_seq == tail_first
        got = await c.consume("t", 0, tail_first, fetch_bytes=100)
        assert got.messages[0].seq == tail_first and got.messages[0].value == acked[tail_first - 1]
        everything = [m async for m in c.drain("t", 0, 0, fetch_bytes=2000)]
    assert [m.seq for m in everything] == list(range(1, 1101))
    assert [m.value for m in everything] == acked
    await app.stop()
    brokers.check(catalog_url)
