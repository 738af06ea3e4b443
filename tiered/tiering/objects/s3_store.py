"""The S3 backend, on aiobotocore, for AWS S3 and S3-compatible services (MinIO, Ceph, R2, moto).

Settings are resolved as the AWS SDKs resolve them, by botocore itself: credentials from AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, profiles, web identity (IRSA) or instance metadata; the endpoint from
AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL; the region from AWS_DEFAULT_REGION or the config file. On top of that:
AWS_REGION is honoured as the other SDKs do, and TIERED_S3_PATH_STYLE=1 forces path-style addressing (MinIO and moto
need it). Constructor options override all of these.

Objects at rest: with `encryption` (ServerSideEncryption) every object this store writes is asked to be encrypted
by S3, with S3's own keys (SSE-S3) or a KMS key (SSE-KMS): a PUT carries the request headers, and so does the creation
of a multipart upload, whose parts and completed object inherit them. The store never copies an object server-side
(CopyObject / UploadPartCopy), so there is no third kind of write to cover. Without it the bucket's default
encryption applies (S3 encrypts every new object with SSE-S3 at least).

Retries are botocore's "standard" mode: up to `max_attempts` attempts in all, with jittered exponential backoff, for
5xx, throttling, timeouts and dropped connections. What is still failing after that surfaces as StoreError.

One client (and its connection pool) is opened on first use and kept until close(); a store belongs to the event
loop that first used it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from tiered.tiering.objects.store import ObjectInfo, ObjectNotFound, ObjectStore, Piece, StoreError, check_object_key
from tiered.tiering.objects.meter import s3_op

STREAM_PIECE_BYTES = 1 << 20  # the most a streamed GET hands over at once
DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys
MAX_PARTS = 10_000  # S3's limit on parts per multipart upload
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


SSE_MODES = {"s3": "AES256", "kms": "aws:kms"}  # our names -> S3's ServerSideEncryption values


@dataclass(frozen=True, slots=True)
class ServerSideEncryption:
    """The encryption asked of S3 for every object written: mode "s3" (SSE-S3, AES256) or "kms" (SSE-KMS, with
    `kms_key_id`: a key id, ARN or alias/NAME; empty: the account's aws/s3 key)."""

    mode: str
    kms_key_id: str = ""

    def __post_init__(self) -> None:
        if self.mode not in SSE_MODES:
            raise ValueError(f"server-side encryption {self.mode!r}: use s3 (SSE-S3) or kms (SSE-KMS)")
        if self.kms_key_id and self.mode != "kms":
            raise ValueError("a KMS key id needs server-side encryption kms")

    @property
    def algorithm(self) -> str:
        """S3's name for it, as head_object reports it (ServerSideEncryption)."""
        return SSE_MODES[self.mode]

    def request_args(self) -> dict[str, str]:
        """The parameters of a PutObject or CreateMultipartUpload that ask for it."""
        args = {"ServerSideEncryption": self.algorithm}
        if self.kms_key_id:
            args["SSEKMSKeyId"] = self.kms_key_id
        return args


class S3ObjectStore(ObjectStore):
    # Every HTTP request botocore sends, each retry attempt and each multipart part, is counted as it goes out
    # (botocore's before-send event), against the attribution of the store call it is sent for: S3 bills each one.
    counts_own_requests = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        max_attempts: int = 5,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        max_pool_connections: int = 32,
        multipart_concurrency: int = 4,
        encryption: ServerSideEncryption | None = None,
    ):
        super().__init__()
        if max_attempts < 1 or multipart_concurrency < 1:
            raise ValueError("max_attempts and multipart_concurrency must be at least 1")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        if path_style is None:
            path_style = _env_bool("TIERED_S3_PATH_STYLE")
        config_options: dict[str, Any] = dict(
            retries={"mode": "standard", "total_max_attempts": max_attempts},  # attempts in all, first included
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            max_pool_connections=max_pool_connections,
        )
        if path_style is not None:
            config_options["s3"] = {"addressing_style": "path" if path_style else "virtual"}
        self._client_options: dict[str, Any] = {
            "region_name": region or os.environ.get("AWS_REGION") or None,
            "endpoint_url": endpoint_url,
            "aws_access_key_id": access_key_id,
            "aws_secret_access_key": secret_access_key,
            "aws_session_token": session_token,
            "config": AioConfig(**config_options),
        }
        self.multipart_concurrency = multipart_concurrency
        self.encryption = encryption
        # Added to every request that creates an object (PutObject, CreateMultipartUpload).
        self._write_args: dict[str, str] = encryption.request_args() if encryption is not None else {}
        self._client_context = None
        self._client = None
        self._client_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix})"

    # --- ObjectStore ----------------------------------------------------------------------------------------------

    async def _put(self, object_key: str, pieces: list[Piece]) -> None:
        client = await self._connected()
        # One request body: pieces are joined in a worker thread, off the event loop (a block is 8 MiB).
        data = pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else await asyncio.to_thread(
            b"".join, pieces)
        with self._errors(object_key):
            await client.put_object(Bucket=self.bucket, Key=self._key(object_key), Body=data, **self._write_args)

    async def _put_file(self, object_key: str, path: Path, multipart_threshold_bytes: int, part_bytes: int,
                        immutable_source: bool) -> int:
        key = self._key(object_key)
        try:
            size = (await asyncio.to_thread(path.stat)).st_size
            data = await asyncio.to_thread(path.read_bytes) if size <= multipart_threshold_bytes else None
        except OSError as e:
            raise StoreError(f"cannot upload {path}: {e}") from e
        if data is not None:
            await self._put(object_key, [data])
            return len(data)
        await self._multipart_upload(object_key, key, path, size, max(part_bytes, -(-size // MAX_PARTS)))
        return size

    async def _get_range(self, object_key: str, start: int, end: int | None) -> bytes:
        client = await self._connected()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(object_key)}
        if end is not None:
            kwargs["Range"] = f"bytes={start}-{end - 1}"
        with self._errors(object_key):
            try:
                response = await client.get_object(**kwargs)
            except ClientError as e:
                if _code(e) == "InvalidRange":  # start at or past the end: S3 says 416, we say "nothing there"
                    return b""
                raise
            async with response["Body"] as body:
                return await body.read()

    async def _read_range_into(self, object_key: str, start: int, end: int, sink: Callable[[bytes], None],
                               pace: Callable[[], Awaitable[None]] | None) -> None:
        client = await self._connected()
        with self._errors(object_key):
            try:
                response = await client.get_object(Bucket=self.bucket, Key=self._key(object_key),
                                                   Range=f"bytes={start}-{end - 1}")
            except ClientError as e:
                if _code(e) == "InvalidRange":
                    return
                raise
            async with response["Body"] as body:
                # read(n) answers with what has arrived (up to n bytes), so each piece goes on as soon as it is in.
                # While `pace` holds the read, aiohttp stops reading the socket once its buffer is full.
                while True:
                    if pace is not None:
                        await pace()
                    piece = await body.read(STREAM_PIECE_BYTES)
                    if not piece:
                        break
                    sink(piece)

    async def _head(self, object_key: str) -> ObjectInfo:
        client = await self._connected()
        with self._errors(object_key):
            response = await client.head_object(Bucket=self.bucket, Key=self._key(object_key))
        return ObjectInfo(object_key, response["ContentLength"], _utc(response["LastModified"]))

    async def _list_page(self, prefix: str, start_after: str | None, max_keys: int) -> tuple[list[ObjectInfo], bool]:
        client = await self._connected()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix, "MaxKeys": max_keys}
        if start_after:
            kwargs["StartAfter"] = self.prefix + start_after
        with self._errors(None):
            response = await client.list_objects_v2(**kwargs)
        page = [
            ObjectInfo(item["Key"][len(self.prefix) :], item["Size"], _utc(item["LastModified"]))
            for item in response.get("Contents", ())
        ]
        return page, bool(response.get("IsTruncated"))

    async def _delete_many(self, object_keys: list[str]) -> None:
        client = await self._connected()
        keys = [self._key(k) for k in object_keys]
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i : i + DELETE_BATCH]
            with self._errors(None):
                response = await client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            errors = response.get("Errors") or []
            if errors:
                shown = ", ".join(f"{e.get('Key')}: {e.get('Code')}" for e in errors[:5])
                raise StoreError(f"{len(errors)} of {len(batch)} deletes failed ({shown})")

    async def _close(self) -> None:
        async with self._client_lock:
            context, self._client_context, self._client = self._client_context, None, None
            if context is not None:
                await context.__aexit__(None, None, None)

    # --- helpers --------------------------------------------------------------------------------------------------

    def _key(self, object_key: str) -> str:
        check_object_key(object_key)
        return self.prefix + object_key

    async def _connected(self):
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:
                context = get_session().create_client("s3", **self._client_options)
                try:
                    self._client = await context.__aenter__()
                except (BotoCoreError, ValueError) as e:
                    raise StoreError(f"cannot create S3 client for {self!r}: {e}") from e
                self._client_context = context
                self._client.meta.events.register("before-send.s3", self._sending)
            return self._client

    def _sending(self, event_name: str, **_: Any) -> None:
        self.sent(s3_op(event_name.rsplit(".", 1)[-1]))

    def _errors(self, object_key: str | None) -> _S3Errors:
        return _S3Errors(self, object_key)

    async def _multipart_upload(self, object_key: str, key: str, path: Path, size: int, part_bytes: int) -> None:
        client = await self._connected()
        with self._errors(object_key):
            upload_id = (await client.create_multipart_upload(Bucket=self.bucket, Key=key, **self._write_args))[
                "UploadId"]
        limit = asyncio.Semaphore(self.multipart_concurrency)

        async def upload_part(number: int, position: int) -> dict[str, Any]:
            # Each part is read inside the semaphore: memory stays at multipart_concurrency × part_bytes.
            async with limit:
                try:
                    data = await asyncio.to_thread(_read_part, path, position, min(part_bytes, size - position))
                except OSError as e:
                    raise StoreError(f"cannot upload {path}: {e}") from e
                with self._errors(object_key):
                    response = await client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
                    )
                return {"PartNumber": number, "ETag": response["ETag"]}

        tasks = [
            asyncio.ensure_future(upload_part(number, position))
            for number, position in enumerate(range(0, size, part_bytes), start=1)
        ]
        try:
            parts = await asyncio.gather(*tasks)
            with self._errors(object_key):
                await client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Best effort: an upload left behind only costs storage, and a bucket lifecycle rule can expire it.
            with contextlib.suppress(BotoCoreError, aiohttp.ClientError, OSError):
                await client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise


class _S3Errors:
    """Turns what botocore and aiohttp raise into ObjectNotFound or StoreError (cause chained)."""

    def __init__(self, store: S3ObjectStore, object_key: str | None):
        self.store = store
        self.object_key = object_key

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or isinstance(exc, (StoreError, ObjectNotFound)):
            return False
        if isinstance(exc, ClientError):
            code = _code(exc)
            if self.object_key is not None and code in _NOT_FOUND_CODES:
                raise ObjectNotFound(self.object_key) from exc
            raise StoreError(f"{self.store!r}: {code}: {exc}") from exc
        if isinstance(exc, (BotoCoreError, aiohttp.ClientError, OSError)):  # OSError covers TimeoutError
            raise StoreError(f"{self.store!r}: {type(exc).__name__}: {exc}") from exc
        return False


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _read_part(path: Path, position: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(position)
        data = f.read(length)
    if len(data) != length:
        raise OSError(f"{path} shrank during upload: {len(data)} of {length} bytes at {position}")
    return data


def _env_bool(name: str) -> bool | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: expected 1/0, true/false, yes/no or on/off")
