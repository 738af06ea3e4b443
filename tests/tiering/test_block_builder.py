"""The block builder (pure bookkeeping) and the trimming of remote chunks to whole bundles."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.tiering.tier_state import led_state
from tiered.protocol.bundle import Message, encode_bundle, encode_record, validate_bundle
from tiered.protocol.errors import ProtocolError
from tiered.tier_interface import AckOutcome
from tiered.tiering.blocks.block_builder import BlockBuilder, NotLeading, record_stats, run_fields
from tiered.tiering.blocks.block_format import (
    INDEX_EVERY_BYTES,
    decode_block,
    encode_block,
    encode_block_pieces,
    read_block_indexes,
    run_index_of,
)
from tiered.tiering.reads.caches import RangeCache, SizedLru
from tiered.tiering.partition_state import TierState
from tiered.tiering.reads.run_reads import trim_chunk
from tiered.storage.index import SparseIndex
from tiered.topic_partition import TopicPartition


def record(values, ts=1000, codec=0, seqs=None):
    messages = [Message(v, None, ts + i, seqs[i] if seqs else 0) for i, v in enumerate(values)]
    return encode_record(encode_bundle(messages, codec=codec, sparse=seqs is not None))


def leading(*partitions, epoch=3, committed=0, **kwargs) -> BlockBuilder:
    builder = BlockBuilder(led_state({tp: epoch for tp in partitions}, committed_seq=committed), **kwargs)
    for topic, partition in partitions:
        builder.lead(TopicPartition(topic, partition))
    return builder


def test_nothing_pending_closes_nothing():
    builder = BlockBuilder(TierState(), max_bytes=1024, max_age_ms=250)
    assert builder.due_ms() is None and not builder.should_close(10_000) and builder.close() is None


def test_a_block_closes_by_age_of_its_oldest_record():
    builder = leading(("t", 0), max_bytes=1 << 20, max_age_ms=250)
    builder.add(TopicPartition("t", 0), 1, 1, record([b"a"]), 1, now_ms=1000)
    builder.add(TopicPartition("t", 0), 2, 2, record([b"b"]), 1, now_ms=1200)
    assert builder.due_ms() == 1250
    assert not builder.should_close(1249) and builder.should_close(1250)


def test_a_block_closes_by_size():
    builder = leading(("t", 0), max_bytes=100, max_age_ms=10_000)
    builder.add(TopicPartition("t", 0), 1, 1, record([b"x" * 60]), 1, now_ms=0)
    assert not builder.should_close(1)
    builder.add(TopicPartition("t", 0), 2, 2, record([b"y" * 60]), 1, now_ms=1)
    assert builder.should_close(1)


def test_stamps_beyond_the_signed_64_bit_range_are_recorded_at_its_top():
    builder = leading(("t", 0), ("u", 0))
    top = (1 << 63) - 1
    builder.add(TopicPartition("t", 0), 1, 2, record([b"a", b"b"], ts=(1 << 64) - 2), 1, now_ms=0)
    builder.add(TopicPartition("u", 0), 1, 1, record([b"c"], ts=5), 1, now_ms=0)
    builder.add(TopicPartition("u", 0), 2, 2, record([b"d"], ts=1 << 63), 1, now_ms=0)
    t, u = builder.close().runs
    assert (t.min_ts_ms, t.max_ts_ms) == (top, top) and (u.min_ts_ms, u.max_ts_ms) == (5, top)
    encode_block([(t.meta(), b"".join(t.records))])  # the footer takes them


def test_stamps_beyond_the_range_in_the_append_path_s_facts_are_recorded_at_its_top_too():
    builder = leading(("t", 0))
    r = record([b"a", b"b"], ts=(1 << 64) - 2)
    builder.add(TopicPartition("t", 0), 1, 2, r, 1, now_ms=0, facts=validate_bundle(bundle_of(r)))
    [t] = builder.close().runs
    assert (t.min_ts_ms, t.max_ts_ms) == ((1 << 63) - 1, (1 << 63) - 1)


def test_the_builder_s_runs_encode_as_their_metadata_does():
    """The pipeline hands its PendingRuns to the footer as they are (no RunMeta per run): the same object, rows."""
    builder = leading(*[(t, p) for t in "tu" for p in range(3)])
    seqs = {}
    for i in range(20):
        topic, partition = "tu"[i % 2], i % 3
        r = record([b"x" * i] * (1 + i % 3), ts=100 + i)
        first = seqs.get((topic, partition), 0) + 1
        seqs[(topic, partition)] = first + i % 3
        builder.add(TopicPartition(topic, partition), first, first + i % 3, r, 1, now_ms=0,
                    facts=validate_bundle(bundle_of(r)))
    runs = builder.close().runs
    direct = encode_block_pieces([(run, run.records) for run in runs], [run.index for run in runs])
    copied = encode_block_pieces([(run.meta(), run.records) for run in runs], [run.index for run in runs])
    assert direct == copied and len(direct[1]) == 6
    assert [r for r, _ in decode_block(b"".join(direct[0]))] == direct[1]


def test_facts_spare_the_builder_a_walk_and_bad_records_are_refused():
    r = record([b"a", b"b"], ts=40)
    facts = validate_bundle(r[1:])
    assert record_stats(r, facts) == record_stats(r) == (2, 40, 41)
    with pytest.raises(ProtocolError, match="ends after 1 of 2"):
        record_stats(encode_record(b"\x08\x00" + bytes(8) + b"\x01a"))


def test_runs_are_grouped_by_partition_byte_for_byte_with_stats():
    builder = leading(("t", 1), ("u", 0))
    r1, r2, r3 = record([b"a", b"b"], ts=10), record([b"c"], ts=5), record([b"d", b"e", b"f"], ts=20, codec=1)
    loop = asyncio.new_event_loop()
    ack = loop.create_future()
    builder.add(TopicPartition("t", 1), 1, 2, r1, 1, now_ms=0, ack=ack)
    builder.add(TopicPartition("u", 0), 7, 7, r2, 7, now_ms=1)
    builder.add(TopicPartition("t", 1), 3, 5, r3, 1, now_ms=2)
    block = builder.close()
    loop.close()
    assert builder.empty and builder.pending_bytes == 0
    assert [(r.topic, r.partition, r.from_seq, r.first_seq, r.last_seq, r.messages, r.leader_epoch)
            for r in block.runs] == [("t", 1, 1, 1, 5, 5, 3), ("u", 0, 1, 7, 7, 1, 3)]
    assert (block.runs[0].min_ts_ms, block.runs[0].max_ts_ms) == (10, 22)
    assert block.acks == [(("t", 1), ack)]
    data, rows = encode_block([(r.meta(), b"".join(r.records)) for r in block.runs])
    runs = decode_block(data)
    assert bytes(runs[0][1]) == r1 + r3 and bytes(runs[1][1]) == r2
    assert [r for r, _ in runs] == rows


def test_a_partition_s_runs_split_where_its_segment_rolled_and_chain():
    """Every run lies inside one local segment, so a remote segment later answers for exactly its runs."""
    builder = leading(("t", 0), committed=40)
    builder.add(TopicPartition("t", 0), 41, 42, record([b"a", b"b"]), 1, now_ms=0)
    builder.add(TopicPartition("t", 0), 43, 43, record([b"c"]), 43, now_ms=0)  # the segment rolled: base 43
    builder.add(TopicPartition("t", 0), 50, 50, record([b"d"]), 43, now_ms=0)  # a jump inside the segment
    first = builder.close()
    assert [(r.segment_base, r.from_seq, r.first_seq, r.last_seq) for r in first.runs] == [
        (1, 41, 41, 42), (43, 43, 43, 50)]
    builder.add(TopicPartition("t", 0), 51, 51, record([b"e"]), 43, now_ms=0)
    assert [(r.from_seq, r.first_seq) for r in builder.close().runs] == [(51, 51)]  # the chain goes on


def test_records_of_a_partition_must_arrive_in_seq_order_and_be_led():
    builder = leading(("t", 0))
    builder.add(TopicPartition("t", 0), 5, 6, record([b"a", b"b"]), 5, now_ms=0)
    with pytest.raises(NotLeading):
        builder.add(TopicPartition("t", 0), 6, 6, record([b"c"]), 5, now_ms=0)
    with pytest.raises(NotLeading):
        builder.add(TopicPartition("u", 0), 1, 1, record([b"c"]), 1, now_ms=0)


def test_release_drops_the_partition_and_refuses_its_acks():
    builder = leading(("t", 0), ("t", 1))
    loop = asyncio.new_event_loop()
    mine, other = loop.create_future(), loop.create_future()
    builder.add(TopicPartition("t", 0), 1, 1, record([b"a"]), 1, now_ms=0, ack=mine)
    builder.add(TopicPartition("t", 1), 1, 1, record([b"b"]), 1, now_ms=0, ack=other)
    builder.release(TopicPartition("t", 0))
    assert mine.result() is AckOutcome.REFUSED and not other.done()
    with pytest.raises(NotLeading):  # released: its records are no longer taken, even while the state leads it
        builder.add(TopicPartition("t", 0), 2, 2, record([b"c"]), 1, now_ms=0)
    assert [(r.topic, r.partition) for r in builder.close().runs] == [("t", 1)]
    loop.close()


def test_trim_starts_at_the_bundle_holding_the_seq_and_ends_on_a_boundary():
    records = [record([b"a%d" % i, b"b%d" % i]) for i in range(5)]  # seqs 1-2, 3-4, 5-6, 7-8, 9-10
    data = b"".join(records)
    chunk, first, sparse = trim_chunk(data, 1, 6, fetch_size=len(records[2]) + 1)
    assert (first, sparse) == (5, False)
    assert chunk == records[2]  # the next bundle does not fit in the fetch size
    chunk, first, _ = trim_chunk(data, 1, 6, fetch_size=1)
    assert chunk == records[2]  # always one whole bundle, even above the fetch size
    chunk, first, _ = trim_chunk(data, 1, 3, fetch_size=10_000)
    assert (chunk, first) == (b"".join(records[1:]), 3)
    assert trim_chunk(data, 1, 11, 100) is None


def test_trim_follows_sparse_bundles():
    sparse = record([b"x", b"y"], seqs=[100, 105])
    plain = record([b"z"])
    chunk, first, is_sparse = trim_chunk(sparse + plain, 1, 103, 10_000)
    assert (first, is_sparse, chunk) == (100, True, sparse + plain)
    chunk, first, is_sparse = trim_chunk(sparse + plain, 1, 106, 10_000)
    assert (first, is_sparse, chunk) == (106, False, plain)


class Row:
    def __init__(self, from_seq, last):
        self.topic, self.partition, self.from_seq, self.last_seq = "t", 0, from_seq, last


T0 = TopicPartition("t", 0)


def test_range_cache_expires_and_evicts():
    now = [0.0]
    cache = RangeCache(lambda: now[0], per_partition=2, ttl_s=10)
    cache.put(Row(1, 10))
    cache.put(Row(11, 20))
    assert cache.get(T0, 15).from_seq == 11 and cache.get(T0, 25) is None
    cache.put(Row(21, 30))  # evicts the least recently used: 1-10
    assert cache.get(T0, 5) is None
    now[0] = 11
    assert cache.get(T0, 15) is None  # older than the ttl


def test_sized_lru_of_indexes_is_bounded_by_bytes():
    cache = SizedLru(32, lambda index: index.size_bytes)
    for name in "abc":
        cache.put(name, SparseIndex([(0, 0), (1, 10)]))  # 16 bytes each
    assert cache.get("a") is None and cache.get("b") is not None and cache.size_bytes == 32


def test_sized_lru_of_bytes_is_bounded_and_keeps_the_recent():
    cache = SizedLru(10, len)
    cache.put(("a", 0), b"1234")
    cache.put(("b", 0), b"5678")
    assert cache.get(("a", 0)) == b"1234"  # a is now the most recent
    cache.put(("c", 0), b"90ab")  # evicts b
    assert cache.get(("b", 0)) is None and cache.get(("a", 0)) == b"1234" and cache.size_bytes == 8
    cache.put(("big", 0), b"x" * 11)  # larger than the cache: not kept
    assert cache.get(("big", 0)) is None


def test_runs_keep_the_bundle_index_the_footer_would_read_from_their_bundles():
    """The builder's index (one entry per INDEX_EVERY_BYTES, at record boundaries) is the one run_index_of reads
    from the bundles, sparse bundles and seq jumps included; the footer stores it."""
    builder = leading(("t", 0), committed=0)
    rng = random.Random(5)
    seq = 1
    for i in range(300):
        count = rng.randint(1, 4)
        if i % 50 == 49:  # a sparse bundle, with a jump
            messages = [Message(rng.randbytes(900), None, 1, seq + 5 * k) for k in range(count)]
            data = encode_record(encode_bundle(messages, sparse=True))
            first, last = seq, seq + 5 * (count - 1)
        else:
            data = encode_record(encode_bundle([Message(rng.randbytes(rng.randint(10, 2000)), None, 1)] * count))
            first, last = seq, seq + count - 1
        builder.add(TopicPartition("t", 0), first, last, data, 1, now_ms=0)
        seq = last + 1 + (7 if i % 60 == 59 else 0)
    [run] = builder.close().runs
    records = b"".join(run.records)
    assert len(run.index) >= len(records) // INDEX_EVERY_BYTES - 1 > 3
    assert run.index == run_index_of(records, run.first_seq)
    data, _ = encode_block([(run.meta(), records)], [run.index])
    [(_, index)] = read_block_indexes(data, len(data))
    assert list(zip(index.seqs[1:], index.positions[1:])) == run.index


def test_records_as_read_only_views_give_the_block_of_their_bytes():
    """Records handed over as read-only views of request payloads (AppendResult.record) build, check and encode the
    same block as the same records as bytes: one-, two- and three-byte lengths, and the index past 64 KiB."""
    from tiered.tiering.blocks.block_format import encode_block_pieces

    rng = random.Random(11)
    records = [record([rng.randbytes(rng.choice([5, 200, 3000, 40_000]))] * rng.randint(1, 3)) for _ in range(40)]
    payload = bytearray(b"head" + b"".join(records))  # the records laid out as in one received payload
    view = memoryview(payload).toreadonly()
    views, at = [], 4
    for r in records:
        views.append(view[at : at + len(r)])
        at += len(r)
    blocks = []
    for pieces in (records, views):
        builder = leading(("t", 0))
        seq = 1
        for piece in pieces:
            messages = record_stats(piece)[0]
            builder.add(TopicPartition("t", 0), seq, seq + messages - 1, piece, 1, now_ms=0,
                        facts=validate_bundle(bundle_of(piece)))
            seq += messages
        [run] = builder.close().runs
        parts, rows = encode_block_pieces([(run.meta(), run.records)], [run.index])
        blocks.append((b"".join(parts), rows, run.index))
    assert blocks[0] == blocks[1] and len(blocks[0][2]) > 3
    assert [bytes(data) for _, data in decode_block(blocks[1][0])] == [b"".join(records)]


def bundle_of(data) -> bytes:
    """The bundle of one `{varint length, bundle}` record."""
    from tiered.protocol.bundle import maybe_record

    start, end = maybe_record(data)
    return bytes(data[start:end])


# -- BlockBuilder.add's common case natively (_builder: Run, add_to_run) against its reference --------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.protocol.strategies import budget  # noqa: E402
from tiered.protocol.bundle import BundleFacts  # noqa: E402
from tiered.tiering.blocks import block_builder as builder_module  # noqa: E402

native_builder = pytest.importorskip("tiered.tiering.blocks._builder")
TPS = [TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)]
# One step: ("add", partition, seq step, messages, record bytes, new segment?, facts kind, ts bounds), ("close",),
# ("release", partition) or ("lead", partition).
steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 2), st.integers(1, 4), st.integers(1, 40_000),
              st.booleans(), st.sampled_from(["facts", "facts", "none", "huge ts"]),
              st.tuples(st.integers(0, 2**40), st.integers(0, 2**40))),
    st.tuples(st.just("close")), st.tuples(st.just("release"), st.integers(0, 2)),
    st.tuples(st.just("lead"), st.integers(0, 2))), max_size=60)


def _run_steps(path: str, run_class, ops) -> list:
    """What a builder did with `ops` on `path` ("python": the reference add_to_run) with runs of `run_class`: every
    add's answer (or refusal), every closed block's runs and size, and at the end the pending runs, next seqs and
    pending bytes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(builder_module, "PendingRun", run_class)
        builder = leading(*TPS, committed=10)
        builder._add_to_run = builder_module.add_to_run_for(path)
        seqs = {tp: 10 for tp in TPS}
        bases = {tp: 1 for tp in TPS}
        seen = []
        loop = asyncio.new_event_loop()
        futures: list[asyncio.Future] = []
        for op in ops:
            if op[0] == "add":
                _, p, step, messages, size, new_segment, kind, (low, high) = op
                tp = TPS[p]
                first = seqs[tp] + 1 + step if step < 2 else seqs[tp]  # step 2: a seq that does not follow
                last = first + messages - 1
                if new_segment:
                    bases[tp] = first
                rec = memoryview(bytes([p]) * size).toreadonly()
                facts = None if kind == "none" else BundleFacts(0, messages, False, None, None, 1, min(low, high),
                                                                  2**63 + 5 if kind == "huge ts" else max(low, high))
                if kind == "none":  # a record the builder reads itself
                    rec = memoryview(record([b"v"] * messages, ts=low)).toreadonly()
                ack = None
                if size % 3 == 0:  # a durable record: its ack waits in the builder
                    ack = loop.create_future()
                    futures.append(ack)
                try:
                    seen.append(builder.add(tp, first, last, rec, bases[tp], float(len(seen)), ack, facts))
                    seqs[tp] = last
                except NotLeading as exc:
                    seen.append(str(exc))
            elif op[0] == "close":
                block = builder.close()
                seen.append(None if block is None else ([run_fields(r) for r in block.runs], block.size_bytes,
                                                        [(k, futures.index(a)) for k, a in block.acks],
                                                        block.opened_ms))
            elif op[0] == "release":
                builder.release(TPS[op[1]])
            else:
                builder.lead(TPS[op[1]])
                seqs[TPS[op[1]]] = builder._next_from[TPS[op[1]]] - 1
        pending = {tp: [run_fields(r) for r in runs] for tp, runs in builder._runs.items()}
        acks = [(k, futures.index(a)) for k, a in builder._acks]
        refused = [i for i, f in enumerate(futures) if f.done()]  # released partitions' acks
        loop.close()
        return [seen, pending, dict(builder._next_from), builder.pending_bytes, acks, refused, builder.opened_ms]


@budget(150)
@given(steps)
def test_native_runs_and_add_to_run_build_what_the_reference_builds(ops):
    reference = _run_steps("python", builder_module.PyPendingRun, ops)
    assert _run_steps("native", builder_module.PendingRun, ops) == reference
    assert _run_steps("python", builder_module.PendingRun, ops) == reference  # the reference on the C fields too


def test_the_native_add_takes_the_reference_s_arguments_and_refuses_others():
    builder = leading(TPS[0])
    first = record([b"x"])
    assert builder.add(TPS[0], 1, 1, first, 1, now_ms=5.0) is True
    assert builder.add(TPS[0], 2, 2, b"y", 1, 6.0, facts=BundleFacts(0, 1, False, None, None, 1, 5, 5)) is False
    for args, kwargs in [((TPS[0], 3, 3, b"z", 1), {}), ((TPS[0], 3, 3, b"z", 1, 7.0), {"nosuch": 1}),
                         ((TPS[0], 3, 3, b"z", 1, 7.0, None, None, None), {}),
                         ((TPS[0], 3, 3, b"z", 1, 7.0), {"key": TPS[0]})]:
        with pytest.raises(TypeError):
            builder.add(*args, **kwargs)
    with pytest.raises(NotLeading):
        builder.add(TPS[1], 1, 1, b"z", 1, 7.0)
    assert builder.pending_bytes == len(first) + 1 and builder.opened_ms == 5.0 and builder._next_from[TPS[0]] == 3


def test_native_add_to_run_reads_bundle_facts_by_these_positions():
    assert [BundleFacts._fields.index(f) for f in ("messages", "min_ts_ms", "max_ts_ms")] == [1, 6, 7]


def test_a_native_run_is_a_pending_run():
    run = builder_module.PendingRun("t", 2, 3, 10, 9, 10, 12, min_ts_ms=5, max_ts_ms=7)
    same = builder_module.PyPendingRun("t", 2, 3, 10, 9, 10, 12, min_ts_ms=5, max_ts_ms=7)
    assert run == same and run_fields(run) == run_fields(same) and run.meta() == same.meta()
    assert run.records == [] and run.index == [] and run.records is not builder_module.PendingRun(
        "t", 2, 3, 10, 9, 10, 12).records  # a list of its own each
    run.records.append(run)  # a cycle through the run: the collector frees it
    run.size_bytes += 5
    assert run.size_bytes == 5 and repr(run).startswith("PendingRun(")
    for bad in [(), ("t", 1, 2, 3, 4, 5), (b"t", 1, 2, 3, 4, 5, 6), ("t", 1, 2, -3, 4, 5, 6)]:
        with pytest.raises((TypeError, OverflowError, ValueError)):
            builder_module.PendingRun(*bad)
    with pytest.raises(TypeError):
        builder_module.PendingRun("t", 1, 2, 3, 4, 5, 6, records=(1,))


def test_native_add_to_run_takes_only_its_common_case_and_survives_misuse():
    add_to_run = native_builder.add_to_run
    tp = TopicPartition("a", 0)
    facts = BundleFacts(0, 1, False, None, None, 1, 5, 5)
    builder = leading(tp)
    assert add_to_run(builder._runs, builder._next_from, tp, 1, 1, b"x", 1, facts, 64) is None  # no run yet
    builder.add(tp, 1, 1, b"x", 1, 0.0, None, facts)
    args = [builder._runs, builder._next_from, tp, 2, 2, b"y", 1, facts, 64]
    for i, bad in [(3, 1), (3, -1), (3, 2**64), (3, "2"), (4, 2**64 - 1), (6, 2), (7, None), (7, (1, 2)),
                   (7, BundleFacts(0, 1, False, None, None, 1, 5, 2**64)), (2, TopicPartition("z", 0))]:
        assert add_to_run(*args[:i], bad, *args[i + 1:]) is None  # not the common case: nothing changed
    assert builder._next_from[tp] == 2 and builder._runs[tp][0].records == [b"x"]
    with pytest.raises(TypeError):
        add_to_run(*args[:8])
    with pytest.raises(TypeError):
        add_to_run([], *args[1:])
    with pytest.raises(TypeError):
        add_to_run(*args[:5], 5, *args[6:])  # a record without a length
    assert add_to_run(*args) == 1 and builder._runs[tp][0].records == [b"x", b"y"]


# -- DurablePath.appended natively (_builder.Appended) against its reference -------------------------------------

from types import SimpleNamespace  # noqa: E402

from tiered.storage.appender import AppendResult  # noqa: E402
from tiered.tiering.blocks.durable import DurablePath  # noqa: E402

# One step: (partition, seq step, messages, record bytes, new segment?, durable?, clock moves?) or ("close",).
appended_steps = st.lists(st.one_of(
    st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 4), st.integers(1, 3_000), st.booleans(),
              st.booleans(), st.booleans()),
    st.tuples(st.just("close"))), max_size=50)


def _appended_steps(native: bool, ops) -> list:
    """What a durable path's `appended` did with `ops`: each call's answer (an ack's index, None, or the refusal),
    the blocks it closed (when full), the timer's kicks, and the builder at the end."""
    async def run() -> list:
        builder = leading(*TPS, committed=10, max_bytes=4_000)
        seen: list = []
        acks: list = []
        now = [1000.0]
        path = SimpleNamespace(builder=builder, clock=SimpleNamespace(now_ms=lambda: now[0]),
                               _close_block=lambda: seen.append(("closed", _closed(builder.close()))),
                               _kick=SimpleNamespace(set=lambda: seen.append("kick")))
        appended = (native_builder.Appended(builder, path.clock.now_ms, path._close_block, path._kick.set) if native
                    else lambda tp, result, durable: DurablePath.appended(path, tp, result, durable))
        seqs = {tp: 10 for tp in TPS}
        bases = {tp: 1 for tp in TPS}

        def _closed(block):
            # A block closed inside `appended` (full) holds the ack that call is about to return: the next index.
            return None if block is None else ([run_fields(r) for r in block.runs], block.size_bytes,
                                               [(k, acks.index(a) if a in acks else len(acks)) for k, a in block.acks],
                                               block.opened_ms)

        for op in ops:
            if op[0] == "close":
                seen.append(_closed(builder.close()))
                continue
            p, step, messages, size, new_segment, durable, moves = op
            tp = TPS[p]
            first = seqs[tp] + 1 + step if step < 2 else seqs[tp]
            last = first + messages - 1
            if new_segment:
                bases[tp] = first
            if moves:
                now[0] += 7.0
            rec = memoryview(bytes([p]) * size).toreadonly()
            facts = BundleFacts(0, messages, False, None, None, 1, 5, 9)
            try:
                ack = appended(tp, AppendResult(first, last, bases[tp], 0, size, rec, facts), durable)
                seqs[tp] = last
                if ack is not None:
                    acks.append(ack)
                seen.append(None if ack is None else acks.index(ack))
            except NotLeading as exc:
                seen.append(str(exc))
        return [seen, {tp: [run_fields(r) for r in runs] for tp, runs in builder._runs.items()},
                builder.pending_bytes, builder.opened_ms, [(k, acks.index(a)) for k, a in builder._acks]]

    return asyncio.run(run())


@budget(100)
@given(appended_steps)
def test_the_native_appended_does_what_the_durable_path_s_does(ops):
    assert _appended_steps(True, ops) == _appended_steps(False, ops)


def test_the_native_appended_reads_append_results_by_these_positions_and_refuses_misuse():
    assert [AppendResult._fields.index(f) for f in ("first_seq", "last_seq", "segment_base", "record", "header")] == [
        0, 1, 2, 5, 6]
    builder = leading(TPS[0])
    appended = native_builder.Appended(builder, lambda: 1.0, lambda: None, lambda: None)
    facts = BundleFacts(0, 1, False, None, None, 1, 5, 9)
    assert appended(TPS[0], AppendResult(1, 1, 1, 0, 1, b"x", facts), durable=False) is None
    for args in [(), (TPS[0],), (TPS[0], (1, 2), False), (TPS[0], AppendResult(2, 2, 1, 0, 1, b"y", facts), False, 1)]:
        with pytest.raises(TypeError):
            appended(*args)
    with pytest.raises(RuntimeError):  # a durable record's future needs the running loop
        appended(TPS[0], AppendResult(2, 2, 1, 0, 1, b"y", facts), True)
    with pytest.raises(TypeError):
        native_builder.Appended(object(), None, None, None)
    with pytest.raises(ValueError):
        native_builder.Appended.__new__(native_builder.Appended)(TPS[0], AppendResult(2, 2, 1, 0, 1, b"y", facts),
                                                                  False)
