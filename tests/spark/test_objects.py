"""Executors' blocking range reads: the broker's store URLs and keys, on a directory and on S3 (moto)."""

from __future__ import annotations

import pytest

from tiered.spark.execution import fetch, piece_gets
from tiered.spark.objects import FileRangeReader, open_range_reader, parse_store_url
from tiered.spark.planning import RunPiece
from tiered.tiering.objects.store import ObjectNotFound, StoreError


def test_store_urls_parse_as_the_broker_reads_them(tmp_path, monkeypatch):
    assert parse_store_url("s3://bucket") == parse_store_url("s3://bucket/")
    assert parse_store_url("s3://bucket/a/b/").prefix == "a/b/"
    assert parse_store_url("file:///abs/dir").prefix == "/abs/dir"
    monkeypatch.chdir(tmp_path)
    assert parse_store_url("file://rel/dir").prefix == str(tmp_path / "rel/dir")
    assert parse_store_url("file:rel").prefix == str(tmp_path / "rel")
    for bad in ("s3:///nobucket", "gs://b/p", "s3://b/p?x=1", "file://"):
        with pytest.raises(ValueError):
            parse_store_url(bad)


def test_file_reads_ranges_and_names_missing_objects(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "obj").write_bytes(b"0123456789")
    reader = open_range_reader(f"file://{tmp_path}")
    assert isinstance(reader, FileRangeReader)
    assert reader.get_range("a/obj", 2, 5) == b"234"
    assert reader.get_range("a/obj", 8, 20) == b"89"
    assert reader.get("a/obj") == b"0123456789"
    with pytest.raises(ObjectNotFound):
        reader.get_range("a/none", 0, 1)
    with pytest.raises(StoreError):
        reader.get("../escape")
    # The catalog promised more bytes than the object holds: a clear error, never a silent short read.
    with pytest.raises(StoreError, match="the catalog says"):
        fetch(reader, *piece_gets(reader, RunPiece("a/obj", 5, 10, 1, 1, 1)))


def test_s3_reads_with_the_endpoint_and_path_style_from_the_environment(s3_endpoint, s3_bucket, s3_admin,
                                                                        monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("TIERED_S3_PATH_STYLE", "true")
    s3_admin.put_object(Bucket=s3_bucket, Key="pre/fix/blocks/x.blk", Body=b"abcdefgh")
    reader = open_range_reader(f"s3://{s3_bucket}/pre/fix")
    assert reader.get_range("blocks/x.blk", 1, 4) == b"bcd"
    assert reader.get("blocks/x.blk") == b"abcdefgh"
    with pytest.raises(ObjectNotFound):
        reader.get_range("blocks/none.blk", 0, 4)
    assert reader.any_object("blocks/") and not reader.any_object("segments/")
