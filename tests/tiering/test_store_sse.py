"""Objects at rest: the S3 store asks for server-side encryption (SSE-S3 or SSE-KMS) on every write, as moto's
server reports it back through head_object; and the settings that ask for it."""

from __future__ import annotations

import os
import subprocess
import sys

import boto3
import pytest

from tiered.config import SettingsError, load_settings
from tiered.tiering.objects.s3_store import S3ObjectStore, ServerSideEncryption
from tiered.tiering.objects.store import open_store, store_options

from tests.support.s3 import REGION

KiB = 1024


@pytest.fixture
def kms_key(s3_server, s3_endpoint) -> str:
    """A KMS key in moto (the same server answers KMS), as an operator would name it: its ARN."""
    kms = boto3.client("kms", region_name=REGION, endpoint_url=s3_server.moto_url)
    return kms.create_key(Description="tiered objects")["KeyMetadata"]["Arn"]


async def encrypted_store(s3_endpoint: str, s3_bucket: str, encryption: ServerSideEncryption | None):
    return S3ObjectStore(s3_bucket, "store", endpoint_url=s3_endpoint, path_style=True, max_attempts=3,
                         encryption=encryption)


def encryption_of(s3_admin, bucket: str, key: str) -> tuple[str | None, str | None]:
    head = s3_admin.head_object(Bucket=bucket, Key=f"store/{key}")
    return head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")


@pytest.mark.parametrize("mode", ["s3", "kms"])
async def test_every_write_asks_for_the_encryption(mode, s3_endpoint, s3_bucket, s3_admin, s3_faults, kms_key,
                                                   tmp_path):
    encryption = ServerSideEncryption(mode, kms_key if mode == "kms" else "")
    store = await encrypted_store(s3_endpoint, s3_bucket, encryption)
    single = tmp_path / "small.ilog"
    single.write_bytes(os.urandom(10 * KiB))
    large = tmp_path / "large.ilog"
    large.write_bytes(os.urandom(11 * 1024 * KiB))  # three parts of 5 MiB (S3's smallest part), the last shorter
    try:
        await store.put("blocks/one", b"a block")
        await store.put("blocks/pieces", [b"a ", memoryview(b"block "), b"in pieces"])
        await store.put_file("segments/small.ilog", single)
        await store.put_file("segments/large.ilog", large, multipart_threshold_bytes=1 * KiB, part_bytes=5 * 1024 * KiB)
        await store.put_file("segments/one-part.ilog", single, multipart_threshold_bytes=1 * KiB)
    finally:
        await store.close()
    parts = [path for method, path in s3_faults.requests if method == "PUT" and "partNumber=" in path]
    assert len(parts) == 3 + 1, "both multipart uploads went out in parts"
    expected = ("AES256", None) if mode == "s3" else ("aws:kms", kms_key)
    for key in ("blocks/one", "blocks/pieces", "segments/small.ilog", "segments/large.ilog", "segments/one-part.ilog"):
        sse, key_id = encryption_of(s3_admin, s3_bucket, key)
        assert (sse, key_id if mode == "kms" else None) == expected, key


async def test_kms_without_a_key_id_uses_the_accounts_key(s3_endpoint, s3_bucket, s3_admin):
    store = await encrypted_store(s3_endpoint, s3_bucket, ServerSideEncryption("kms"))
    try:
        await store.put("topics/t", b"config")
    finally:
        await store.close()
    assert encryption_of(s3_admin, s3_bucket, "topics/t")[0] == "aws:kms"


async def test_without_encryption_the_buckets_default_applies(s3_endpoint, s3_bucket, s3_admin):
    store = await encrypted_store(s3_endpoint, s3_bucket, None)
    try:
        await store.put("blocks/plain", b"x")
        # moto's buckets have no default encryption, so an object nobody asked to encrypt says so.
        assert encryption_of(s3_admin, s3_bucket, "blocks/plain") == (None, None)
        s3_admin.put_bucket_encryption(Bucket=s3_bucket, ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
        await store.put("blocks/default", b"x")
    finally:
        await store.close()
    assert encryption_of(s3_admin, s3_bucket, "blocks/default")[0] == "AES256"


def test_encryption_is_one_of_two_modes_and_a_key_needs_kms() -> None:
    assert ServerSideEncryption("s3").request_args() == {"ServerSideEncryption": "AES256"}
    assert ServerSideEncryption("kms", "alias/streams").request_args() == {
        "ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/streams"}
    with pytest.raises(ValueError, match="use s3 .* or kms"):
        ServerSideEncryption("aes")
    with pytest.raises(ValueError, match="needs server-side encryption kms"):
        ServerSideEncryption("s3", "alias/streams")


def test_settings_open_the_store_with_the_encryption(tmp_path) -> None:
    environ = {"TIERED_S3_SSE": "kms", "TIERED_S3_SSE_KMS_KEY_ID": "alias/streams"}
    settings = load_settings({"store_url": "s3://bucket/prefix", "data_dir": str(tmp_path)}, environ=environ)
    options = store_options(settings)
    assert options["encryption"] == ServerSideEncryption("kms", "alias/streams")
    store = open_store(settings.effective_store_url, **options)
    assert isinstance(store, S3ObjectStore) and store.encryption == ServerSideEncryption("kms", "alias/streams")
    config = tmp_path / "tiered.toml"
    config.write_text('store_url = "s3://bucket/prefix"\ns3_sse = "s3"\n')
    assert store_options(load_settings({"config": str(config)}, environ={}))["encryption"] == ServerSideEncryption("s3")
    assert "encryption" not in store_options(load_settings({"store_url": "s3://b/p"}, environ={}))


@pytest.mark.parametrize(("values", "message"), [
    ({"store_url": "s3://b/p", "s3_sse": "aes"}, "flag --s3-sse: s3_sse: 'aes' is not one of off, s3, kms"),
    ({"store_url": "s3://b/p", "s3_sse": "s3", "s3_sse_kms_key_id": "k"},
     "s3_sse_kms_key_id is set but s3_sse is s3"),
    ({"store_url": "s3://b/p", "s3_sse_kms_key_id": "k"}, "s3_sse_kms_key_id is set but s3_sse is off"),
    ({"s3_sse": "kms"}, "s3_sse = kms asks S3 to encrypt objects, but the store is file://"),
])
def test_settings_that_cannot_work_are_one_line(values, message, tmp_path) -> None:
    with pytest.raises(SettingsError) as caught:
        store_options(load_settings({**values, "data_dir": str(tmp_path)}, environ={}))
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("flags", "message"), [
    (["--s3-sse", "kms"], "s3_sse = kms asks S3 to encrypt objects, but the store is file://"),
    (["--store", "s3://b/p", "--s3-sse-kms-key-id", "alias/x"], "s3_sse_kms_key_id is set but s3_sse is off"),
    (["--s3-sse", "aes"], "flag --s3-sse: s3_sse: 'aes' is not one of off, s3, kms"),
])
def test_tiered_serve_refuses_them_in_one_line(flags, message, tmp_path) -> None:
    argv = [sys.executable, "-m", "tiered.cli.main", "serve", "-p", str(tmp_path / "data"), "-l", "127.0.0.1:0",
            "-P", "off", *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == f"tiered serve: {done.stderr.strip().removeprefix('tiered serve: ')}"
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
