"""Blocking range reads of the bucket, for replay executors: each process opens its own client.

The broker's ObjectStore (tiered.tiering.objects.store) is asyncio; a Spark task is plain blocking Python, so executors read
through this small synchronous twin instead: boto3 range GETs for `s3://bucket/prefix`, `pread` for `file://` URLs.
URLs, prefixes and key checks are the broker's (tiered.tiering.objects.store.check_object_key), so a replay reads exactly
the keys the broker wrote. A missing object raises tiered.tiering.objects.store.ObjectNotFound, any other failure
StoreError (after botocore's standard retries).

S3 settings are resolved as the AWS SDKs resolve them, by botocore, in each executor's environment
(AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, credentials, profiles, IRSA), plus
path-style addressing from the `s3PathStyle` option or TIERED_S3_PATH_STYLE, as the broker reads it.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

import boto3
from boto3.s3.transfer import S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tiered.config import SettingsError, parse_bool
from tiered.tiering.objects.store import ObjectNotFound, StoreError, check_object_key

S3_MAX_ATTEMPTS = 5
S3_POOL_CONNECTIONS = 16


class RangeReader(Protocol):
    def get_range(self, object_key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object; fewer only if the object is shorter."""

    def get(self, object_key: str) -> bytes:
        """The whole object."""


@dataclass(frozen=True, slots=True)
class StoreLocation:
    scheme: str  # "s3" or "file"
    bucket: str  # s3 only
    prefix: str  # s3: "" or "some/prefix/"; file: the directory


def parse_store_url(url: str) -> StoreLocation:
    """The store URL as the broker's open_store reads it: s3://bucket[/prefix], file:///abs, file://rel, file:rel."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"store URL {url!r} has a query or fragment")
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"no bucket in store URL {url!r}")
        prefix = unquote(parts.path).strip("/")
        return StoreLocation("s3", parts.netloc, prefix + "/" if prefix else "")
    if parts.scheme == "file":
        path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
        if not path:
            raise ValueError(f"no directory in store URL {url!r}")
        return StoreLocation("file", "", str(Path(path).absolute()))
    raise ValueError(f"unsupported store URL {url!r}: use s3://bucket/prefix or file:///dir")


def open_range_reader(url: str, *, s3_path_style: bool | None = None) -> RangeReader:
    location = parse_store_url(url)
    if location.scheme == "file":
        return FileRangeReader(location.prefix)
    return S3RangeReader(location.bucket, location.prefix, s3_client(resolve_path_style(s3_path_style)))


def resolve_path_style(option: bool | None) -> bool | None:
    """The option if given, else TIERED_S3_PATH_STYLE (as the broker reads it), else None (botocore's default)."""
    if option is not None:
        return option
    text = os.environ.get("TIERED_S3_PATH_STYLE", "").strip()
    if not text:
        return None
    try:
        return parse_bool(text)
    except SettingsError as exc:
        raise ValueError(f"TIERED_S3_PATH_STYLE: {exc}") from None


class FileRangeReader:
    def __init__(self, root: str):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"FileRangeReader({str(self.root)!r})"

    def _path(self, object_key: str) -> Path:
        return self.root.joinpath(*check_object_key(object_key))

    def get_range(self, object_key: str, start: int, end: int) -> bytes:
        if not 0 <= start < end:
            raise ValueError(f"bad byte range [{start}, {end})")
        try:
            fd = os.open(self._path(object_key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ObjectNotFound(object_key) from exc
        except OSError as exc:
            raise StoreError(f"{self!r}: cannot open {object_key}: {exc}") from exc
        try:
            chunks, position = [], start
            while position < end:
                chunk = os.pread(fd, min(end - position, 16 << 20), position)
                if not chunk:
                    break
                chunks.append(chunk)
                position += len(chunk)
            return b"".join(chunks)
        except OSError as exc:
            raise StoreError(f"{self!r}: cannot read {object_key}: {exc}") from exc
        finally:
            os.close(fd)

    def get(self, object_key: str) -> bytes:
        try:
            return self._path(object_key).read_bytes()
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ObjectNotFound(object_key) from exc
        except OSError as exc:
            raise StoreError(f"{self!r}: cannot read {object_key}: {exc}") from exc


_client_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _cached_client(path_style: bool | None, environment: tuple[tuple[str, str], ...]):
    # `environment` is only part of the cache key.
    config: dict = {
        "retries": {"mode": "standard", "total_max_attempts": S3_MAX_ATTEMPTS},
        "max_pool_connections": S3_POOL_CONNECTIONS,
    }
    if path_style is not None:
        config["s3"] = {"addressing_style": "path" if path_style else "virtual"}
    region = os.environ.get("AWS_REGION") or None  # the other SDKs honour AWS_REGION; botocore alone does not
    return boto3.session.Session().client("s3", region_name=region, config=Config(**config))


def s3_client(path_style: bool | None):
    """A boto3 S3 client shared by the tasks of this process (Spark reuses Python workers; clients are
    thread-safe). Keyed by the AWS_* environment too, so a changed environment gets a new client."""
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    with _client_lock:
        return _cached_client(path_style, environment)


class S3RangeReader:
    def __init__(self, bucket: str, prefix: str, client):
        self.bucket = bucket
        self.prefix = prefix
        self.client = client

    def __repr__(self) -> str:
        return f"S3RangeReader(s3://{self.bucket}/{self.prefix})"

    def _key(self, object_key: str) -> str:
        check_object_key(object_key)
        return self.prefix + object_key

    def get_range(self, object_key: str, start: int, end: int) -> bytes:
        if not 0 <= start < end:
            raise ValueError(f"bad byte range [{start}, {end})")
        return self._get(object_key, Range=f"bytes={start}-{end - 1}")

    def get(self, object_key: str) -> bytes:
        return self._get(object_key)

    def _get(self, object_key: str, **kwargs) -> bytes:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(object_key), **kwargs)
            with response["Body"] as body:
                return body.read()
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "NotFound", "404"):
                raise ObjectNotFound(object_key) from exc
            raise StoreError(f"{self!r}: {code}: {exc}") from exc
        except (BotoCoreError, OSError) as exc:
            raise StoreError(f"{self!r}: {type(exc).__name__}: {exc}") from exc

    def put_file(self, object_key: str, path: str | Path) -> None:
        """Uploads a local file (multipart above boto3's threshold). For `tiered replay --parquet s3://...`."""
        try:
            self.client.upload_file(str(path), self.bucket, self._key(object_key))
        except (S3UploadFailedError, ClientError, BotoCoreError, OSError) as exc:
            raise StoreError(f"{self!r}: cannot upload {object_key}: {exc}") from exc

    def any_object(self, prefix: str = "") -> bool:
        """Whether some object's key starts with `prefix` (relative to this reader's prefix)."""
        try:
            response = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + prefix, MaxKeys=1)
        except (ClientError, BotoCoreError, OSError) as exc:
            raise StoreError(f"{self!r}: cannot list: {exc}") from exc
        return bool(response.get("KeyCount"))
