"""Object key formats: exact shapes, round trips, ordering, and foreign keys parsed as None."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.protocol.codes import UINT64_MAX
from tiered.tiering.objects import keys
from tiered.tiering.objects.keys import (
    BlockIdClock,
    BlockKey,
    SegmentKey,
    block_id_time_ms,
    block_key,
    new_block_id,
    parse_block_key,
    parse_segment_index_key,
    parse_segment_key,
    partition_segments_prefix,
    segment_index_key,
    segment_key,
)

NOW_MS = 1_767_225_600_123  # 2026-01-01T00:00:00.123Z

# TANK's topic rule: 1..64 of [A-Za-z0-9_-], not starting or ending with - or _.
_EDGE = st.text("abcXYZ019", min_size=1, max_size=1)
_MIDDLE = st.text("abcXYZ019_-", max_size=62)
topics = _EDGE | st.builds(lambda first, middle, last: first + middle + last, _EDGE, _MIDDLE, _EDGE)
seqs = st.integers(0, UINT64_MAX)


def test_segment_keys_are_readable_and_tank_named():
    assert segment_key("orders", 3, 81, 90, 1795352634) == (
        "segments/orders/3/00000000000000000081-00000000000000000090_1795352634.ilog"
    )
    assert segment_index_key("orders", 3, 81, 90, 1795352634) == (
        "segments/orders/3/00000000000000000081-00000000000000000090_1795352634.index"
    )
    assert partition_segments_prefix("orders", 3) == "segments/orders/3/"
    assert keys.topic_segments_prefix("orders") == "segments/orders/"
    assert keys.segments_prefix() == "segments/"
    assert segment_key("t", 0, 0, UINT64_MAX, 0).endswith("/00000000000000000000-18446744073709551615_0.ilog")


@settings(max_examples=100, deadline=None)
@given(topics, st.integers(0, 0xFFFF), seqs, seqs, st.integers(0, 2**40))
def test_segment_key_round_trip(topic, partition, a, b, freeze_ts):
    base, last = min(a, b), max(a, b)
    expected = SegmentKey(topic, partition, base, last, freeze_ts)
    ilog = segment_key(topic, partition, base, last, freeze_ts)
    index = segment_index_key(topic, partition, base, last, freeze_ts)
    assert parse_segment_key(ilog) == expected
    assert parse_segment_index_key(index) == expected
    assert parse_segment_key(index) is None and parse_segment_index_key(ilog) is None
    assert ilog.startswith(partition_segments_prefix(topic, partition))
    assert parse_block_key(ilog) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(seqs, st.integers(0, 2**32)), min_size=2, max_size=20, unique_by=lambda t: t[0]))
def test_a_partition_listing_comes_back_in_seq_order(segments):
    object_keys = [segment_key("t", 7, base, base, ts) for base, ts in segments]
    assert [parse_segment_key(k).base for k in sorted(object_keys)] == sorted(base for base, _ in segments)


def test_partition_prefixes_do_not_overlap():
    one = segment_key("t", 1, 5, 9, 1)
    assert one.startswith(partition_segments_prefix("t", 1))
    assert not segment_key("t", 10, 5, 9, 1).startswith(partition_segments_prefix("t", 1))
    assert not segment_key("t-x", 1, 5, 9, 1).startswith(keys.topic_segments_prefix("t"))


def test_block_key_shape_and_round_trip():
    block_id = new_block_id(NOW_MS)
    object_key = block_key(42, block_id)
    prefix, hash4, broker, name = object_key.split("/")
    assert prefix + "/" == keys.blocks_prefix()
    assert len(hash4) == 4 and all(c in "0123456789abcdef" for c in hash4)
    assert broker == "42" and name == block_id + ".blk"
    parsed = parse_block_key(object_key)
    assert parsed == BlockKey(42, block_id)
    assert parsed.created_ms == NOW_MS
    assert parse_segment_key(object_key) is None


def test_block_keys_spread_over_hash_prefixes():
    prefixes = {block_key(1, new_block_id(NOW_MS + i)).split("/")[1] for i in range(200)}
    assert len(prefixes) > 150  # consecutive blocks of one broker land on different key prefixes


def test_block_ids_are_time_ordered_and_unique():
    clock = BlockIdClock()  # new_block_id() uses one process-wide clock; a fresh one keeps this test independent
    same_ms = [clock.next(NOW_MS) for _ in range(1000)]
    assert sorted(same_ms) == same_ms and len(set(same_ms)) == 1000
    assert {block_id_time_ms(i) for i in same_ms} == {NOW_MS}
    later = clock.next(NOW_MS + 1)
    assert later > same_ms[-1] and block_id_time_ms(later) == NOW_MS + 1
    stepped_back = clock.next(NOW_MS - 5000)  # the wall clock went back: still after everything minted before
    assert stepped_back > later and block_id_time_ms(stepped_back) == NOW_MS + 1
    assert len(later) == 26
    assert block_id_time_ms(BlockIdClock().next(0)) == 0
    assert block_id_time_ms(BlockIdClock().next(2**48 - 1)) == 2**48 - 1


def test_block_ids_are_unique_across_threads():
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda _: new_block_id(NOW_MS + 20), range(2000)))
    assert len(set(ids)) == 2000


@pytest.mark.parametrize(
    "object_key",
    [
        "",
        "blocks/",
        "segments/",
        "other/prefix/file",
        "segments/orders/3/00000000000000000081-00000000000000000090_1795352634.log",
        "segments/orders/3/81-90_1795352634.ilog",  # TANK's local name, not ours
        "segments/orders/03/00000000000000000081-00000000000000000090_1795352634.ilog",
        "segments/orders/65536/00000000000000000081-00000000000000000090_1795352634.ilog",
        "segments/orders/3/00000000000000000091-00000000000000000090_1795352634.ilog",  # base > last
        "segments/orders/3/99999999999999999999-99999999999999999999_1.ilog",  # past u64
        "segments/-orders/3/00000000000000000081-00000000000000000090_1795352634.ilog",
        "segments/or.ders/3/00000000000000000081-00000000000000000090_1795352634.ilog",
        "segments/orders/3/00000000000000000081-00000000000000000090_01.ilog",
        "segments/orders/3/00000000000000000081-00000000000000000090_1795352634.ilog/x",
        "prefix/segments/orders/3/00000000000000000081-00000000000000000090_1795352634.ilog",
    ],
)
def test_foreign_keys_parse_as_none(object_key):
    assert parse_block_key(object_key) is None
    assert parse_segment_key(object_key) is None
    assert parse_segment_index_key(object_key) is None


def test_block_keys_not_exactly_ours_are_foreign():
    block_id = new_block_id(NOW_MS)
    object_key = block_key(7, block_id)
    hash4 = object_key.split("/")[1]
    assert parse_block_key(object_key) is not None
    mutations = [
        object_key.replace(f"/{hash4}/", "/0000/" if hash4 != "0000" else "/0001/"),  # hash does not match
        object_key.replace(f"/{hash4}/", f"/{hash4.upper()}/") if hash4 != hash4.upper() else "blocks/x",
        object_key.replace("/7/", "/8/"),  # the hash covers the broker id too
        object_key.replace("/7/", "/07/"),  # same number, not our spelling
        object_key.replace(block_id, block_id.lower()),
        object_key + ".tmp",
        object_key.replace(".blk", ".ilog"),
        "x/" + object_key,
    ]
    for mutated in mutations:
        assert parse_block_key(mutated) is None, mutated
    # 26 characters, but more than 48 bits of time or a letter Crockford does not use
    for bad_id in ["8" + block_id[1:], block_id[:-1] + "I", block_id[:-1] + "U"]:
        forged = f"blocks/{keys._block_hash(7, bad_id)}/7/{bad_id}.blk"
        assert parse_block_key(forged) is None, forged


@pytest.mark.parametrize(
    "call",
    [
        lambda: segment_key("", 0, 0, 0, 0),
        lambda: segment_key("_t", 0, 0, 0, 0),
        lambda: segment_key("a/b", 0, 0, 0, 0),
        lambda: segment_key("x" * 65, 0, 0, 0, 0),
        lambda: segment_key("t", -1, 0, 0, 0),
        lambda: segment_key("t", 65536, 0, 0, 0),
        lambda: segment_key("t", 0, 5, 4, 0),
        lambda: segment_key("t", 0, 0, 2**64, 0),
        lambda: segment_index_key("t", 0, 0, 0, -1),
        lambda: block_key(-1, new_block_id(NOW_MS)),
        lambda: block_key(True, new_block_id(NOW_MS)),
        lambda: block_key(1, "not-a-ulid"),
        lambda: new_block_id(-1),
        lambda: new_block_id(2**48),
        lambda: block_id_time_ms("x"),
    ],
)
def test_builders_refuse_bad_arguments(call):
    with pytest.raises(ValueError):
        call()
