"""The broker's long-lived objects are set aside from the cyclic collector's full passes (tiered.heap): after start,
after a topic is laid out here and after partitions are led, so a full pass walks only what came since (at 100,000
partitions a full pass over everything held the GIL for 0.6-0.8 s, in the middle of handovers). At stop they are
collectable again."""

from __future__ import annotations

import gc
import weakref

from tiered.client import Client
from tiered.heap import Heap
from tiered.server.app import App

from tests.support.broker import local_settings


def walked(obj: object) -> bool:
    """Whether a full collection would walk `obj` now: it is in one of the collector's generations (a frozen object
    is in none of them)."""
    return any(o is obj for o in gc.get_objects())


class Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_settle_sets_aside_what_lives_and_thaw_gives_it_back():
    heap = Heap(lambda: 0.0)
    try:
        kept = Cyclic()
        assert walked(kept)
        heap.settle("a test")
        assert not walked(kept) and heap.frozen() > 0 and heap.settles == 1
        young = Cyclic()
        assert walked(young)  # what came after the settle is walked as before
        assert gc.collect() >= 0 and not walked(kept)  # a full pass leaves the frozen objects alone
    finally:
        heap.thaw()
    assert heap.frozen() == 0 and walked(kept)


def test_a_settle_collects_young_garbage_first_so_it_is_not_kept():
    heap = Heap(lambda: 0.0)
    try:
        gc.collect()
        garbage = Cyclic()
        ref = weakref.ref(garbage)  # not its id: a freed object's address may be reused by another
        del garbage  # a young cycle: garbage the settle's young collection frees instead of freezing
        heap.settle("a test")
        assert ref() is None and gc.collect() == 0
    finally:
        heap.thaw()


async def test_a_tiered_broker_freezes_its_partitions_after_laying_a_topic_out_and_leading_it(tmp_path):
    app = App(local_settings(tmp_path / "data"))  # the embedded defaults: a SQLite catalog, a local store
    await app.start()
    try:
        settles = app.broker.heap.settles
        assert settles >= 1  # start-up
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("wide", 64)
            assert app.broker.heap.settles >= settles + 2  # laid out, then led
            parts = app.registry.topics["wide"].partitions
            assert len(parts) == 64 and not any(walked(p) or walked(p.log) for p in parts)
            await c.produce("wide", 5, [b"still served"])
            assert [m.value async for m in c.drain("wide", 5, 0)] == [b"still served"]
        metrics = app.broker.metrics.render()
        assert "tiered_heap_frozen_objects " in metrics and "tiered_heap_settles_total " in metrics
        assert 'python_gc_collections_total{generation="2"}' in metrics
    finally:
        await app.stop()
    assert gc.get_freeze_count() == 0 and walked(parts[0])  # collectable again once stopped


async def test_a_local_only_broker_freezes_a_topic_it_lays_out(tmp_path):
    app = App(local_settings(tmp_path / "data"), local_only=True)
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("t", 8)
        assert not any(walked(p) for p in app.registry.topics["t"].partitions)
    finally:
        await app.stop()
    assert gc.get_freeze_count() == 0
