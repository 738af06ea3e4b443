"""The cost meter: shares, counting at the store (each S3 attempt, retries and parts included), refusal of a call
without an attribution, every store call in the tree passing one, and the catalog's usage rows."""

from __future__ import annotations

import ast
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tiered.catalog import usage as catalog_usage
from tiered.catalog.migrate import upgrade
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.tiering.objects.meter import CATALOG, CATALOG_WIDE, UNATTRIBUTED, Attribution, Meter, Op, s3_op
from tiered.tiering.objects.store import AttributionMissing

from .s3_ops import request_op

REPO = Path(__file__).resolve().parents[2]
KiB = 1024
T0 = datetime(2026, 11, 29, 10, 30, tzinfo=timezone.utc)


def test_a_shared_request_is_split_by_bytes_and_the_shares_add_up():
    meter = Meter()
    shares = Attribution.by_bytes([("a", 300), ("b", 100), ("a", 100), ("c", 0)])
    assert shares.shares == (("a", 400.0), ("b", 100.0))
    meter.request(shares, Op.PUT)
    meter.request(shares, Op.PUT)
    meter.request(CATALOG, Op.LIST)
    assert meter.requests == {("a", "put"): 1.6, ("b", "put"): 0.4, (CATALOG_WIDE, "list"): 1.0}
    assert sum(meter.requests.values()) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        Attribution((("a", 1.0), ("a", 2.0)))
    with pytest.raises(ValueError):
        Attribution(())


def test_an_s3_operation_we_never_send_is_priced_in_its_class():
    assert s3_op("UploadPart") == Op.PART and s3_op("DeleteObjects") == Op.DELETE
    assert s3_op("PutObjectTagging") == Op.PUT and s3_op("ListParts") == Op.PUT
    assert s3_op("HeadBucket") == Op.GET and s3_op("GetBucketLocation") == Op.GET


def test_what_a_flush_takes_is_put_back_when_it_fails():
    meter = Meter()
    meter.request(Attribution.topic("a"), Op.GET)
    taken = meter.take_pending()
    meter.request(Attribution.topic("a"), Op.GET)
    meter.restore(taken)
    assert meter.take_pending().requests == {("a", "get"): 2.0}
    assert meter.take_pending().empty()
    assert meter.requests == {("a", "get"): 2.0}  # the running totals are not touched by flushes


async def test_the_local_store_counts_one_request_per_call(tmp_path):
    store = LocalObjectStore(tmp_path / "objects", fsync=False)
    a, b = Attribution.topic("a"), Attribution.by_bytes({"a": 1, "b": 3})
    await store.put("x", b"12345678", attribution=b)
    assert await store.get_range("x", 0, 4, attribution=a) == b"1234"
    [info async for info in store.list("", attribution=CATALOG)]
    await store.delete_many(["x"], attribution=CATALOG)
    await store.put("y", b"1")  # no attribution: counted, as unattributed
    assert store.meter.requests == {("a", "put"): 0.25, ("b", "put"): 0.75, ("a", "get"): 1.0,
                                    (CATALOG_WIDE, "list"): 1.0, (CATALOG_WIDE, "delete"): 1.0,
                                    (UNATTRIBUTED, "put"): 1.0}
    assert store.meter.bytes == {("a", "written"): 2.0, ("b", "written"): 6.0, ("a", "read"): 4.0,
                                 (UNATTRIBUTED, "written"): 1.0}


async def test_a_store_that_requires_attributions_refuses_a_call_without_one(tmp_path):
    store = LocalObjectStore(tmp_path / "objects", fsync=False)
    store.require_attribution = True
    with pytest.raises(AttributionMissing):
        await store.put("x", b"1")
    with pytest.raises(AttributionMissing):
        [info async for info in store.list("")]
    assert not store.meter.requests and not (tmp_path / "objects" / "x").exists()


async def test_s3_counts_every_attempt_and_every_part_as_the_bucket_sees_them(s3_store, s3_faults, s3_bucket,
                                                                           tmp_path, monkeypatch):
    import moto.s3.models

    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 64 * KiB)
    s3_store.require_attribution = True
    a, b = Attribution.topic("a"), Attribution.topic("b")
    s3_faults.fail_next(2, status=503)
    await s3_store.put("k", b"v", attribution=a)  # two 503s, then success: three PUTs billed
    path = tmp_path / "seg.ilog"
    path.write_bytes(os.urandom(300 * KiB))
    s3_faults.fail_next(1, status=500, match=lambda m, p: m == "PUT" and "partNumber=" in p)
    await s3_store.put_file("seg.ilog", path, multipart_threshold_bytes=100 * KiB, part_bytes=100 * KiB,
                            attribution=b)
    assert await s3_store.get_range("seg.ilog", 0, 10, attribution=b) == path.read_bytes()[:10]
    await s3_store.head("k", attribution=a)
    [info async for info in s3_store.list("", attribution=CATALOG)]
    await s3_store.delete_many(["k", "seg.ilog"], attribution=CATALOG)
    seen: dict[tuple[str, str], float] = {}
    for method, p in s3_faults.requests:
        key, op = request_op(method, p, s3_bucket, "store")
        topic = {"k": "a", "seg.ilog": "b"}.get(key, CATALOG_WIDE)
        seen[topic, op] = seen.get((topic, op), 0) + 1
    assert seen == {("a", "put"): 3, ("b", "multipart"): 2, ("b", "part"): 4, ("b", "get"): 1, ("a", "head"): 1,
                    (CATALOG_WIDE, "list"): 1, (CATALOG_WIDE, "delete"): 1}
    assert dict(s3_store.meter.requests) == seen


STORE_METHODS = {"put", "put_file", "get", "get_range", "read_range_into", "head", "list", "delete_many"}


def test_every_store_call_in_the_tree_names_its_topics():
    """Statically, every call of a store method on something called a store, in tiered/, passes `attribution`
    (the brokers of the test suite refuse a call without one at run time too: tests/conftest.py)."""
    missing, checked = [], 0
    for path in sorted((REPO / "tiered").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in STORE_METHODS):
                continue
            receiver = ast.unparse(node.func.value)
            if receiver.split(".")[-1] not in ("store", "_store"):
                continue
            checked += 1
            if not any(k.arg == "attribution" for k in node.keywords):
                missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert missing == []
    assert checked >= 25  # the walk does see the calls (blocks, segments, reads, retention, rebuild, reconciler...)


@pytest.fixture(params=["sqlite", "postgresql"])
def usage_catalog(request, tmp_path):
    from tiered.catalog import Catalog

    url = request.getfixturevalue("pg_empty_url") if request.param == "postgresql" else \
        f"sqlite:///{tmp_path / 'catalog.db'}"
    upgrade(url)
    cat = Catalog.open(url)
    yield cat
    cat.close()


def test_usage_rows_add_up_per_hour_and_broker_and_a_window_is_whole_hours(usage_catalog):
    cat = usage_catalog
    catalog_usage.add_usage(cat, 1, {("a", "put"): 0.5, ("a", "bytes_written"): 100.0}, now=T0)
    catalog_usage.add_usage(cat, 1, {("a", "put"): 0.25, ("b", "get"): 2.0}, now=T0 + timedelta(minutes=10))
    catalog_usage.add_usage(cat, 2, {("a", "put"): 1.0}, now=T0 + timedelta(hours=1))
    catalog_usage.add_usage(cat, 2, {("a", "put"): 4.0}, now=T0 - timedelta(hours=2))
    assert catalog_usage.usage(cat, None) == {("a", "put"): 5.75, ("a", "bytes_written"): 100.0, ("b", "get"): 2.0}
    # From 10:59: the hour 10:00-11:00 counts whole, 08:00 does not.
    assert catalog_usage.usage(cat, T0 + timedelta(minutes=29)) == {
        ("a", "put"): 1.75, ("a", "bytes_written"): 100.0, ("b", "get"): 2.0}
    assert catalog_usage.usage(cat, T0 + timedelta(hours=5)) == {}
    # Rows older than KEEP go with the next flush.
    catalog_usage.add_usage(cat, 1, {("a", "get"): 1.0}, now=T0 + catalog_usage.KEEP + timedelta(hours=3))
    assert catalog_usage.usage(cat, None) == {("a", "get"): 1.0}
