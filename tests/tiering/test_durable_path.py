"""The durable path alone (tiered.tiering.blocks.durable), on the local object store and SQLite, with a clock the test
moves: blocks close by age, commit in block order whatever order their uploads finish in, and a refused commit
fences its partition without losing the others' records."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tests.tiering.tier_state import led_state
from tiered.tiering.partition_state import Role
from tiered.catalog import Catalog
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import topics as catalog_topics
from tiered.catalog.migrate import upgrade
from tiered import metrics as m
from tiered.metrics import Metrics
from tiered.protocol.bundle import Message, encode_bundle, encode_record, validate_bundle
from tiered.storage.partition_log import AppendResult
from tiered.tier_interface import AckOutcome
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.blocks.durable import DurablePath
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.topic_partition import TopicPartition

from tests.support.clock import ManualClock


class RecordingSink:
    def __init__(self) -> None:
        self.commits: list[tuple[str, int, int, int]] = []
        self.fences: list[tuple[str, int]] = []

    def committed(self, tp, first_seq, last_seq, size_bytes):
        self.commits.append((*tp, first_seq, last_seq))

    def fenced(self, tp, reason):
        self.fences.append(tuple(tp))

    def copied(self, tp, base, last):
        pass

    def first_available_moved(self, tp, seq):
        pass


class GatedStore(LocalObjectStore):
    """A local store whose PUTs wait until the test opens their gate, in the order the test chooses."""

    def __init__(self, root):
        super().__init__(root, fsync=False)
        self.gates: list[asyncio.Event] = []

    async def _put(self, object_key: str, pieces: list[bytes]) -> None:
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        await super()._put(object_key, pieces)


def record(seq_count: int = 1) -> bytes:
    return encode_record(encode_bundle([Message(b"m%d" % i, ts_ms=1000 + i) for i in range(seq_count)]))


def appended(first: int, data: bytes, base: int = 1) -> AppendResult:
    return AppendResult(first, first, base, 0, len(data), data, validate_bundle(data[1:]))


def claimed_catalog(path) -> tuple[Catalog, dict[int, int]]:
    """A new SQLite catalog at `path` with topic "t" of 2 partitions, both claimed by broker 1: (catalog, epochs)."""
    url = f"sqlite:///{path}"
    upgrade(url)
    catalog = Catalog.open(url)
    catalog_topics.create_topic(catalog, "t", 2)
    return catalog, catalog_partitions.claim_partitions(catalog, 1, "t", [0, 1])


async def durable_path(tmp_path, **policy):
    catalog, epochs = claimed_catalog(tmp_path / "c.db")
    clock = ManualClock()
    sink = RecordingSink()
    store = GatedStore(tmp_path / "objects")
    access = AsyncCatalog(catalog)
    state = led_state({("t", p): epoch for p, epoch in epochs.items()})
    durable = DurablePath(store, access, 1, sink, state=state, metrics=Metrics(), max_bytes=1 << 20, max_age_ms=250,
                          grace=catalog_blocks.DEFAULT_DELETE_GRACE, clock=clock, **policy)
    for p in epochs:
        durable.lead(TopicPartition("t", p))
    timer = asyncio.ensure_future(durable.block_timer())
    yield SimpleNamespace(durable=durable, state=state, clock=clock, sink=sink, store=store, cat=catalog,
                          pipeline=durable.pipeline, builder=durable.builder, metrics=durable.metrics)
    timer.cancel()
    for gate in store.gates:
        gate.set()
    await durable.stop()
    access.close()


@pytest.fixture
async def path(tmp_path):
    """Cost-first, the default policy."""
    async for made in durable_path(tmp_path):
        yield made


@pytest.fixture
async def lingering(tmp_path):
    """Latency-first: 5 ms of linger, early closes at most 20 a second (50 ms apart)."""
    async for made in durable_path(tmp_path, linger_ms=5, max_puts_per_s=20):
        yield made


async def settle(path, until, what: str, turns: int = 400):
    for _ in range(turns):
        if until():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


async def test_a_block_closes_when_its_oldest_record_is_due(path):
    ack = path.durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
    await settle(path, lambda: path.clock.sleeping == 1, "the timer waiting for the block's age")
    path.clock.advance(0.249)
    await path.clock.settle()
    assert path.pipeline.in_flight == 0 and path.builder.pending_bytes > 0
    path.clock.advance(0.002)
    await settle(path, lambda: len(path.store.gates) == 1, "block closed and uploading")
    path.store.gates[0].set()
    assert await asyncio.wait_for(ack, 5) is AckOutcome.COMMITTED
    assert path.sink.commits == [("t", 0, 1, 1)]


async def test_commits_keep_block_order_whatever_order_uploads_finish_in(path):
    first = path.durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
    path.clock.advance(0.25)
    await settle(path, lambda: len(path.store.gates) == 1, "first PUT started")
    second = path.durable.appended(TopicPartition("t", 0), appended(2, record()), durable=True)
    path.clock.advance(0.25)
    await settle(path, lambda: len(path.store.gates) == 2, "second PUT started")
    path.store.gates[1].set()  # the second upload finishes first ...
    await asyncio.sleep(0.05)
    assert not second.done() and path.sink.commits == []  # ... but its commit waits for the first block's
    path.store.gates[0].set()
    assert await asyncio.wait_for(second, 5) is AckOutcome.COMMITTED and first.result() is AckOutcome.COMMITTED
    assert path.sink.commits == [("t", 0, 1, 1), ("t", 0, 2, 2)]
    runs = catalog_blocks.runs_for_range(path.cat, "t", 0, 1, 10)
    assert [(r.from_seq, r.first_seq, r.last_seq) for r in runs] == [(1, 1, 1), (2, 2, 2)]


async def test_a_refused_commit_fences_its_partition_and_commits_the_others(path):
    mine = path.durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
    other = path.durable.appended(TopicPartition("t", 1), appended(1, record()), durable=True)
    catalog_partitions.claim_partitions(path.cat, 9, "t", [0])  # another broker takes t/0 over
    path.clock.advance(0.25)
    await settle(path, lambda: len(path.store.gates) == 1, "PUT started")
    path.store.gates[0].set()
    await settle(path, lambda: len(path.store.gates) == 2, "the block rebuilt without t/0")
    path.store.gates[1].set()
    assert await asyncio.wait_for(other, 5) is AckOutcome.COMMITTED
    assert mine.result() is AckOutcome.REFUSED  # never committed: the producer may send it to the new leader
    assert path.sink.fences == [("t", 0)] and path.sink.commits == [("t", 1, 1, 1)]
    assert path.state.of(("t", 0)).role is Role.FENCED and path.state.leads(("t", 1))
    assert path.state.epoch_of(("t", 0)) is None  # fenced: nothing uploads or copies under its old epoch
    assert catalog_partitions.get_partition_states(path.cat, "t")[0].hwmark_seq == 0


async def test_a_store_outage_is_retried_on_the_clock_until_it_ends(path, monkeypatch):
    from tiered.tiering.objects.store import StoreError

    failures = [3]
    original = path.store.put

    async def flaky(object_key, data, **options):  # options: what the pipeline passes on (the PUT's attribution)
        if failures[0]:
            failures[0] -= 1
            raise StoreError("503 slow down")
        return await original(object_key, data, **options)

    monkeypatch.setattr(path.store, "put", flaky)
    ack = path.durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
    path.clock.advance(0.25)
    for _ in range(3):  # each retry waits its backoff on the test's clock
        await settle(path, lambda: path.clock.sleeping >= 1, "retry waiting")
        path.clock.advance(2.0)
    await settle(path, lambda: len(path.store.gates) == 1, "the PUT that succeeds")
    path.store.gates[0].set()
    assert await asyncio.wait_for(ack, 5) is AckOutcome.COMMITTED
    assert path.metrics.count(m.PUT_ERRORS) == 3


async def test_latency_first_an_idle_pipeline_closes_a_block_after_its_linger(lingering):
    ack = lingering.durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
    await settle(lingering, lambda: lingering.clock.sleeping == 1, "the timer waiting for the linger")
    lingering.clock.advance(0.004)
    await lingering.clock.settle()
    assert lingering.pipeline.in_flight == 0  # 4 ms: still lingering
    lingering.clock.advance(0.002)
    await settle(lingering, lambda: len(lingering.store.gates) == 1, "closed after 5 ms, not 250")
    lingering.store.gates[0].set()
    assert await asyncio.wait_for(ack, 5) is AckOutcome.COMMITTED
    assert lingering.metrics.count(m.BLOCKS_CLOSED_EARLY) == 1


async def test_latency_first_records_gather_while_a_block_uploads_then_go_at_once(lingering):
    first = lingering.durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
    lingering.clock.advance(0.005)
    await settle(lingering, lambda: len(lingering.store.gates) == 1, "the first block uploading")
    second = lingering.durable.appended(TopicPartition("t", 0), appended(2, record()), durable=True)
    third = lingering.durable.appended(TopicPartition("t", 1), appended(1, record()), durable=True)
    lingering.clock.advance(0.1)  # long past the linger and the spacing: the upload in flight holds them
    await lingering.clock.settle()
    await asyncio.sleep(0.02)
    assert len(lingering.store.gates) == 1 and lingering.builder.pending_bytes > 0
    lingering.store.gates[0].set()  # the upload ends: the gathered block closes at once, both records in it
    assert await asyncio.wait_for(first, 5) is AckOutcome.COMMITTED
    await settle(lingering, lambda: len(lingering.store.gates) == 2, "the gathered block uploading")
    assert lingering.builder.pending_bytes == 0
    lingering.store.gates[1].set()
    assert await asyncio.wait_for(second, 5) is AckOutcome.COMMITTED and (await third) is AckOutcome.COMMITTED
    assert lingering.sink.commits == [("t", 0, 1, 1), ("t", 0, 2, 2), ("t", 1, 1, 1)]


async def test_latency_first_early_closes_are_spaced_by_the_put_cap(lingering):
    first = lingering.durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
    lingering.clock.advance(0.005)
    await settle(lingering, lambda: len(lingering.store.gates) == 1, "the first block uploading")
    lingering.store.gates[0].set()
    assert await asyncio.wait_for(first, 5) is AckOutcome.COMMITTED
    lingering.durable.appended(TopicPartition("t", 0), appended(2, record()), durable=True)
    lingering.clock.advance(0.010)  # lingered, but only 10 ms after the last early close: 50 ms apart at most
    await lingering.clock.settle()
    await asyncio.sleep(0.02)
    assert len(lingering.store.gates) == 1
    lingering.clock.advance(0.039)
    await lingering.clock.settle()
    await asyncio.sleep(0.02)
    assert len(lingering.store.gates) == 1  # 49 ms after
    lingering.clock.advance(0.002)
    await settle(lingering, lambda: len(lingering.store.gates) == 2, "closed 50 ms after the first early close")
    assert lingering.metrics.count(m.BLOCKS_CLOSED_EARLY) == 2


async def test_cost_first_never_closes_early_even_with_an_idle_pipeline(path):
    path.durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
    path.clock.advance(0.2)
    await path.clock.settle()
    await asyncio.sleep(0.02)
    assert path.pipeline.in_flight == 0 and path.durable.due_ms() == path.builder.opened_ms + 250
    assert path.metrics.count(m.BLOCKS_CLOSED_EARLY) == 0
