"""S3 backend behaviour beyond the shared contract: retries through injected faults, multipart, prefix, settings."""

from __future__ import annotations

import os

import pytest
from botocore.exceptions import ClientError

from tiered.tiering.objects import s3_store as s3_store_module
from tiered.tiering.objects.s3_store import S3ObjectStore
from tiered.tiering.objects.store import ObjectNotFound, StoreError, open_store

KiB = 1024


def is_part(method: str, path: str) -> bool:
    return method == "PUT" and "partNumber=" in path


async def test_5xx_is_retried_and_recovers(s3_store, s3_faults):
    s3_faults.fail_next(2, status=503)
    await s3_store.put("k", b"v")  # 3 attempts allowed: two 503s, then success
    s3_faults.fail_next(2, status=500)
    assert await s3_store.get("k") == b"v"
    assert [m for m, _ in s3_faults.requests] == ["PUT"] * 3 + ["GET"] * 3
    assert s3_faults.pending() == 0
    assert s3_store.counters.errors == 0


async def test_store_error_once_retries_are_exhausted(s3_store, s3_faults):
    s3_faults.fail_next(3, status=503)
    with pytest.raises(StoreError) as caught:
        await s3_store.put("k", b"v")
    assert isinstance(caught.value.__cause__, ClientError)  # the cause is chained for the logs
    assert len(s3_faults.requests) == 3  # bounded: max_attempts in all
    assert s3_store.counters.errors == 1 and s3_store.counters.puts == 0
    await s3_store.put("k", b"v")  # the same client recovers once S3 does
    assert await s3_store.get("k") == b"v"


async def test_a_stall_past_the_read_timeout_is_retried(s3_store, s3_faults):
    await s3_store.put("k", b"v")
    s3_faults.stall_next(1, seconds=5)  # the store's read timeout is 1 s
    assert await s3_store.get_range("k", 0, 1) == b"v"
    assert len(s3_faults.requests) == 3  # PUT, the stalled GET, the retried GET


async def test_dropped_connections_are_retried(s3_store, s3_faults):
    s3_faults.drop_next(2)
    await s3_store.put("k", b"v")
    assert await s3_store.get("k") == b"v"


async def test_an_outage_is_a_store_error_then_recovery(s3_store, s3_faults):
    await s3_store.put("k", b"v")
    s3_faults.go_away()
    for call in (lambda: s3_store.get("k"), lambda: s3_store.head("k"), lambda: s3_store.put("k2", b"x")):
        with pytest.raises(StoreError):
            await call()
    with pytest.raises(StoreError):
        [info async for info in s3_store.list("")]
    with pytest.raises(StoreError):
        await s3_store.delete_many(["k"])
    assert s3_store.counters.errors == 5
    s3_faults.come_back()
    assert [i.object_key async for i in s3_store.list("")] == ["k"]


async def test_multipart_upload_uses_parts(s3_store, s3_faults, s3_admin, s3_bucket, tmp_path, monkeypatch):
    import moto.s3.models

    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 64 * KiB)
    data = os.urandom(300 * KiB)
    path = tmp_path / "seg.ilog"
    path.write_bytes(data)
    s3_faults.fail_next(1, status=500, match=is_part)  # one part fails once and is retried on its own
    await s3_store.put_file("seg.ilog", path, multipart_threshold_bytes=100 * KiB, part_bytes=100 * KiB)
    part_requests = [p for m, p in s3_faults.requests if is_part(m, p)]
    assert len(part_requests) == 4  # 3 parts + 1 retry
    assert {p.split("partNumber=")[1].split("&")[0] for p in part_requests} == {"1", "2", "3"}
    assert s3_admin.get_object(Bucket=s3_bucket, Key="store/seg.ilog")["Body"].read() == data


async def test_failed_multipart_upload_is_aborted(s3_store, s3_faults, s3_admin, s3_bucket, tmp_path, monkeypatch):
    import moto.s3.models

    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 64 * KiB)
    path = tmp_path / "seg.ilog"
    path.write_bytes(os.urandom(300 * KiB))
    s3_faults.fail_next(3, status=500, match=lambda m, p: is_part(m, p) and "partNumber=2&" in p + "&")
    with pytest.raises(StoreError):
        await s3_store.put_file("seg.ilog", path, multipart_threshold_bytes=100 * KiB, part_bytes=100 * KiB)
    assert any(m == "DELETE" and "uploadId=" in p for m, p in s3_faults.requests)
    assert s3_admin.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    with pytest.raises(ObjectNotFound):
        await s3_store.head("seg.ilog")


async def test_delete_many_batches(s3_store, s3_faults, monkeypatch):
    monkeypatch.setattr(s3_store_module, "DELETE_BATCH", 3)
    keys = [f"d/{i}" for i in range(7)]
    for key in keys:
        await s3_store.put(key, b"")
    await s3_store.delete_many(keys + ["d/missing"])
    assert sum(1 for m, p in s3_faults.requests if m == "POST" and "delete" in p) == 3  # 3 + 3 + 2 keys
    assert [i async for i in s3_store.list("d/")] == []


async def test_the_prefix_is_the_stores_own(s3_endpoint, s3_bucket, s3_admin):
    one = open_store(f"s3://{s3_bucket}/tenant/one", endpoint_url=s3_endpoint, path_style=True)
    two = open_store(f"s3://{s3_bucket}/tenant/one-more/", endpoint_url=s3_endpoint, path_style=True)
    whole = open_store(f"s3://{s3_bucket}", endpoint_url=s3_endpoint, path_style=True)
    try:
        await one.put("segments/a", b"1")
        await two.put("segments/a", b"2")
        assert [i.object_key async for i in one.list("")] == ["segments/a"]
        assert [i.object_key async for i in two.list("seg")] == ["segments/a"]
        assert await one.get("segments/a") == b"1"
        keys = [o["Key"] for o in s3_admin.list_objects_v2(Bucket=s3_bucket)["Contents"]]
        assert keys == ["tenant/one-more/segments/a", "tenant/one/segments/a"]
        assert [i.object_key async for i in whole.list("")] == keys
        await one.delete_many(["segments/a"])
        assert [i.object_key async for i in whole.list("")] == ["tenant/one-more/segments/a"]
    finally:
        for store in (one, two, whole):
            await store.close()


async def test_settings_come_from_the_environment_like_the_aws_sdks(s3_endpoint, s3_bucket, monkeypatch):
    # s3_endpoint set dummy credentials and AWS_REGION; the endpoint and addressing style come from the environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("TIERED_S3_PATH_STYLE", "true")
    store = open_store(f"s3://{s3_bucket}/env")
    try:
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
    finally:
        await store.close()


async def test_missing_bucket_is_a_store_error_not_a_missing_object(s3_endpoint):
    store = S3ObjectStore("no-such-bucket-here", endpoint_url=s3_endpoint, path_style=True, max_attempts=1)
    try:
        with pytest.raises(StoreError):
            await store.get("k")
        with pytest.raises(StoreError):
            await store.put("k", b"v")
    finally:
        await store.close()


def test_path_style_env_values(monkeypatch):
    monkeypatch.setenv("TIERED_S3_PATH_STYLE", "sideways")
    with pytest.raises(ValueError):
        S3ObjectStore("b")
    for value, expected in [("1", "path"), ("off", "virtual")]:
        monkeypatch.setenv("TIERED_S3_PATH_STYLE", value)
        config = S3ObjectStore("b")._client_options["config"]
        assert config.s3 == {"addressing_style": expected}
    monkeypatch.setenv("TIERED_S3_PATH_STYLE", "1")
    assert S3ObjectStore("b", path_style=False)._client_options["config"].s3 == {"addressing_style": "virtual"}


def test_store_urls():
    store = open_store("s3://bucket/a/b/", region="eu-west-1", max_attempts=2)
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix) == ("bucket", "a/b/")
    assert store._client_options["region_name"] == "eu-west-1"
    assert open_store("s3://bucket").prefix == ""
    for bad in ["s3:///prefix", "s3://bucket/p?x=1", "gs://bucket/p", "bucket/p"]:
        with pytest.raises(ValueError):
            open_store(bad)
    with pytest.raises(TypeError):
        open_store("s3://bucket", no_such_option=1)
