"""The object store interface: a handful of async calls, like litestream's ReplicaClient.

Callers use keys relative to the store (tiering/objects/keys.py builds them); the store adds its own prefix. There is one
error for a missing object, ObjectNotFound, whatever the backend; every other failure is a StoreError with the
backend's exception chained, raised after the backend's own bounded retries, so a caller may retry it later.

Store URLs (open_store):
    s3://bucket[/prefix]    S3 or any S3-compatible service (options: see S3ObjectStore).
    file:///abs/dir         a local directory (created if missing).
    file://rel/dir, file:rel/dir
                            a directory relative to the working directory. Not RFC 8089 (which would read `rel` as a
                            host name); no file URL of ours ever names a host.
"""

from __future__ import annotations

import abc
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from tiered.cancellation import within
from tiered.config import Settings, mask_url
from tiered.tiering.objects.meter import Attribution, Direction, Meter, Op

MiB = 1024 * 1024
DEFAULT_MULTIPART_THRESHOLD_BYTES = 64 * MiB
DEFAULT_PART_BYTES = 16 * MiB
DEFAULT_LIST_PAGE = 1000

Piece = bytes | memoryview  # one piece of an object put as pieces: bytes, or a read-only view of received bytes


class StoreError(Exception):
    """The store failed (I/O, network, service error) after its own retries; the cause is chained."""


class ObjectNotFound(LookupError):
    """No object has this key. The same exception for every backend."""

    def __init__(self, object_key: str):
        self.object_key = object_key
        super().__init__(object_key)


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    object_key: str  # relative to the store's prefix
    size_bytes: int
    last_modified: datetime  # timezone-aware, UTC


@dataclass(slots=True)
class StoreCounters:
    """Requests made through one store, for metrics and benchmarks. `errors` counts StoreErrors raised."""

    puts: int = 0
    put_bytes: int = 0
    gets: int = 0
    get_bytes: int = 0
    lists: int = 0
    deletes: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# Every request has a deadline: a store that accepts connections and never answers must not hold a block, a copy or
# a read for minutes. A request's deadline is a base plus its bytes at a floor rate, so a big upload may take long
# and a stalled small one is abandoned (and retried by the caller) within seconds.
DEADLINE_BASE_S = 5.0
DEADLINE_FLOOR_BYTES_PER_S = 4 << 20


def deadline_for(size_bytes: int) -> float:
    return DEADLINE_BASE_S + size_bytes / DEADLINE_FLOOR_BYTES_PER_S


# The attribution of the store call in progress, for a backend that counts the requests it sends itself (S3: each
# HTTP attempt, retries included). Set by ObjectStore around each backend call only; a task the backend starts (a
# multipart upload's parts) inherits it.
_CALL_ATTRIBUTION: contextvars.ContextVar[Attribution | None] = contextvars.ContextVar("store_call_attribution",
                                                                                     default=None)


def call_attribution() -> Attribution | None:
    return _CALL_ATTRIBUTION.get()


class AttributionMissing(ValueError):
    """A store call without an Attribution on a store that requires one (the broker's, in tests): a bug."""


class ObjectStore(abc.ABC):
    """Counting, argument checks, deadlines and error accounting live here; backends implement the underscored
    methods.

    A backend raises ObjectNotFound for a missing object and StoreError (cause chained) for any other failure; a
    request past its deadline (deadline_for) is abandoned and raises StoreError too.

    Every public call takes `attribution`: the topics it is for (tiering/objects/meter.py). Each request sent for it is
    counted in `self.meter`: by this class, one per backend call, unless the backend counts what it sends itself
    (`counts_own_requests`: S3 counts each HTTP attempt, so retries and multipart parts are counted as billed). A call
    without one is counted as unattributed, or refused where `require_attribution` is set.
    """

    counts_own_requests = False

    def __init__(self) -> None:
        self.counters = StoreCounters()
        self.deadline_base_s = DEADLINE_BASE_S
        self.meter = Meter()
        self.require_attribution = False

    # --- public API -----------------------------------------------------------------------------------------------

    async def put(self, object_key: str, data: bytes | list[Piece], *, attribution: Attribution | None = None) -> None:
        """Stores `data` under `object_key`, replacing any object there. Readers see the old object or the new one.

        `data` may be a list of pieces, stored as their concatenation: a block goes out as its runs' records without
        being joined first (joining 8 MiB into fresh memory on the event loop cost more than writing it out). A
        piece may be a read-only view of a produce request's payload (AppendResult.record): stores only read it.
        """
        pieces = data if isinstance(data, list) else [bytes(data)]
        size = sum(len(p) for p in pieces)
        await self._counted(self._put(object_key, pieces), attribution, Op.PUT, size)
        self.counters.puts += 1
        self.counters.put_bytes += size
        self.meter.transferred(attribution, Direction.WRITTEN, size)

    async def put_file(
        self,
        object_key: str,
        path: str | Path,
        *,
        multipart_threshold_bytes: int = DEFAULT_MULTIPART_THRESHOLD_BYTES,
        part_bytes: int = DEFAULT_PART_BYTES,
        immutable_source: bool = False,
        attribution: Attribution | None = None,
    ) -> None:
        """Uploads a file; S3 uses a multipart upload above the threshold (S3 wants parts of at least 5 MiB).

        `immutable_source` is the caller's promise that the file is never written in place again (it is only
        renamed, unlinked, or replaced by a rename) and that the catalog knows the key before this put: a local
        store on the same filesystem may then store the file itself, as a hard link, instead of a copy
        (local_store.py).
        """
        if multipart_threshold_bytes < 1 or part_bytes < 1:
            raise ValueError("multipart threshold and part size must be positive")
        path = Path(path)
        try:
            expected = path.stat().st_size
        except OSError as e:
            raise StoreError(f"cannot upload {path}: {e}") from e
        size = await self._counted(
            self._put_file(object_key, path, multipart_threshold_bytes, part_bytes, immutable_source), attribution,
            Op.PUT, expected)
        self.counters.puts += 1
        self.counters.put_bytes += size
        self.meter.transferred(attribution, Direction.WRITTEN, size)

    async def get(self, object_key: str, *, attribution: Attribution | None = None) -> bytes:
        data = await self._counted(self._get_range(object_key, 0, None), attribution, Op.GET, 1 << 30)
        self.counters.gets += 1
        self.counters.get_bytes += len(data)
        self.meter.transferred(attribution, Direction.READ, len(data))
        return data

    async def get_range(self, object_key: str, start: int, end: int, *,
                        attribution: Attribution | None = None) -> bytes:
        """Bytes [start, end) of the object. Past the end it returns what exists (b"" from the end on), as S3 does."""
        if not 0 <= start < end:
            raise ValueError(f"bad byte range [{start}, {end})")
        data = await self._counted(self._get_range(object_key, start, end), attribution, Op.GET, end - start)
        self.counters.gets += 1
        self.counters.get_bytes += len(data)
        self.meter.transferred(attribution, Direction.READ, len(data))
        return data

    async def read_range_into(self, object_key: str, start: int, end: int, sink: Callable[[bytes], None],
                              pace: Callable[[], Awaitable[None]] | None = None, *,
                              attribution: Attribution | None = None) -> int:
        """Bytes [start, end) of the object handed to `sink` piece by piece as they arrive (a streamed range GET),
        under the same deadline as get_range for the whole range; returns the bytes received (fewer past the end
        of the object, as get_range). `sink` runs on the event loop and must not block. `pace`, when given, is
        awaited before each piece is taken in (the read pauses, and the store stops sending, while it waits); it
        may hold the read up to half of the time (tiered.tiering.blocks.hot_path), so the deadline is twice as long."""
        if not 0 <= start < end:
            raise ValueError(f"bad byte range [{start}, {end})")
        received = 0

        def counted(piece: bytes) -> None:
            nonlocal received
            received += len(piece)
            self.counters.get_bytes += len(piece)
            sink(piece)

        try:
            if pace is None:
                await self._counted(self._read_range_into(object_key, start, end, counted, None), attribution, Op.GET,
                                    end - start)
            else:
                await self._counted(self._read_range_into(object_key, start, end, counted, pace), attribution, Op.GET,
                                    end - start, 2.0)
        finally:
            self.meter.transferred(attribution, Direction.READ, received)  # what arrived, even of a failed read
        self.counters.gets += 1
        return received

    async def head(self, object_key: str, *, attribution: Attribution | None = None) -> ObjectInfo:
        return await self._counted(self._head(object_key), attribution, Op.HEAD)

    async def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None,
        attribution: Attribution | None = None,
    ) -> AsyncIterator[ObjectInfo]:
        """Objects whose key starts with `prefix` (a plain string prefix, as S3's) and sorts after `start_after`,
        in key order, at most `limit` of them. Pages through the backend, one request per page."""
        if limit is not None and limit < 0:
            raise ValueError(f"negative list limit {limit}")
        remaining = limit
        after = start_after
        while remaining is None or remaining > 0:
            page_size = DEFAULT_LIST_PAGE if remaining is None else min(DEFAULT_LIST_PAGE, remaining)
            page, truncated = await self._counted(self._list_page(prefix, after, page_size), attribution, Op.LIST)
            self.counters.lists += 1
            for info in page:
                yield info
            if remaining is not None:
                remaining -= len(page)
            if not truncated or not page:
                return
            after = page[-1].object_key

    async def delete_many(self, object_keys: Iterable[str], *, attribution: Attribution | None = None) -> None:
        """Deletes the objects; keys with no object are fine."""
        keys = list(dict.fromkeys(object_keys))
        if keys:
            await self._counted(self._delete_many(keys), attribution, Op.DELETE)
            self.counters.deletes += len(keys)

    async def close(self) -> None:
        await self._close()

    async def __aenter__(self) -> ObjectStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- backend --------------------------------------------------------------------------------------------------

    @abc.abstractmethod
    async def _put(self, object_key: str, pieces: list[Piece]) -> None:
        """Stores the concatenation of `pieces` (at least one)."""

    @abc.abstractmethod
    async def _put_file(self, object_key: str, path: Path, multipart_threshold_bytes: int, part_bytes: int,
                        immutable_source: bool) -> int:
        """Returns the bytes uploaded. `immutable_source`: see put_file."""

    @abc.abstractmethod
    async def _get_range(self, object_key: str, start: int, end: int | None) -> bytes:
        """end None: to the end of the object."""

    async def _read_range_into(self, object_key: str, start: int, end: int, sink: Callable[[bytes], None],
                               pace: Callable[[], Awaitable[None]] | None) -> None:
        """A backend that can stream overrides this; by default the range is read whole, then handed over."""
        if pace is not None:
            await pace()
        data = await self._get_range(object_key, start, end)
        if data:
            sink(data)

    @abc.abstractmethod
    async def _head(self, object_key: str) -> ObjectInfo: ...

    @abc.abstractmethod
    async def _list_page(self, prefix: str, start_after: str | None, max_keys: int) -> tuple[list[ObjectInfo], bool]:
        """Up to max_keys objects in key order, and whether more may follow."""

    @abc.abstractmethod
    async def _delete_many(self, object_keys: list[str]) -> None: ...

    async def _close(self) -> None:
        return None

    def sent(self, op: Op) -> None:
        """One request sent for the call in progress: for backends that count their own (`counts_own_requests`)."""
        self.meter.request(_CALL_ATTRIBUTION.get(), op)

    async def _counted(self, awaitable, attribution: Attribution | None, op: Op, size_bytes: int = 0,
                       stretch: float = 1.0):
        if attribution is None and self.require_attribution:
            awaitable.close()
            raise AttributionMissing(f"{self!r}: a {op} request without an attribution")
        deadline = (self.deadline_base_s + size_bytes / DEADLINE_FLOOR_BYTES_PER_S) * stretch
        if not self.counts_own_requests:
            self.meter.request(attribution, op)
        token = _CALL_ATTRIBUTION.set(attribution)
        try:
            return await within(awaitable, deadline)
        except TimeoutError:
            self.counters.errors += 1
            raise StoreError(f"{self!r}: no answer within {deadline:.1f} s") from None
        except StoreError:
            self.counters.errors += 1
            raise
        finally:
            _CALL_ATTRIBUTION.reset(token)


def check_object_key(object_key: str) -> list[str]:
    """The `/`-separated parts of a valid object key; a key that could name a path outside a store (absolute, empty
    parts, `.` or `..`) is refused with StoreError by every backend alike."""
    if not isinstance(object_key, str) or not object_key:
        raise StoreError(f"invalid object key {object_key!r}")
    parts = object_key.split("/")
    if any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise StoreError(f"invalid object key {object_key!r}")
    return parts


def store_options(settings: Settings) -> dict[str, Any]:
    """The backend options the settings ask for, for open_store(settings.effective_store_url, ...): every process
    that writes to the bucket (the broker, `tiered topic config`, `tiered catalog rebuild`) opens it so, so that
    every object is written with the same addressing and server-side encryption. Raises SettingsError (one line)
    for encryption settings that cannot apply."""
    encryption = settings.s3_encryption()  # SettingsError for encryption that cannot apply
    if not settings.effective_store_url.startswith("s3://"):
        return {}
    from tiered.tiering.objects.s3_store import ServerSideEncryption

    options: dict[str, Any] = {"path_style": settings.s3_path_style}
    if encryption is not None:
        options["encryption"] = ServerSideEncryption(*encryption)
    return options


def open_store(url: str, **options: Any) -> ObjectStore:
    """An ObjectStore for a store URL (see the module docstring); options go to the backend's constructor."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        from tiered.tiering.objects.s3_store import S3ObjectStore

        if not parts.netloc:
            raise ValueError(f"no bucket in store URL {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"store URL {url!r} has a query or fragment; pass options instead")
        return S3ObjectStore(parts.netloc, unquote(parts.path).strip("/"), **options)
    if parts.scheme == "file":
        from tiered.tiering.objects.local_store import LocalObjectStore

        if parts.query or parts.fragment:
            raise ValueError(f"store URL {url!r} has a query or fragment")
        # file:///abs -> netloc "" and path "/abs"; file://rel/dir -> netloc "rel", path "/dir"; file:rel -> path "rel"
        path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
        if not path:
            raise ValueError(f"no directory in store URL {url!r}")
        return LocalObjectStore(path, **options)
    raise ValueError(f"unsupported store URL {mask_url(url)!r}: use s3://bucket/prefix or file:///dir")
