"""Range GETs streamed into memory, and the byte budget they and the remote reader's caches share.

- `ReadBudget`: the broker's budget for remote reads (`remote_read_budget_bytes`, docs/configuration.md). A quarter
  goes to the caches (index objects, block footers, block run bytes), the rest to the buffers of range GETs in flight. A fetch's
  GET waits for its bytes (`acquire`); a read-ahead takes them only if they are free and read-aheads hold less than
  half of the buffers (`try_acquire`), so read-ahead never holds up a fetch. A single GET larger than the buffers
  waits until they are all free and then takes them all: memory stays within the budget or one GET, whichever is
  larger.
- `RangeRead`: one range GET [start, end) of an object, read by a task of its own into a buffer of its final size
  (allocated once, so slices of it stay valid while bytes keep arriving). Readers wait for a position to arrive
  (`until`) and take zero-copy views of what has. The buffer's bytes are held from the budget until `close`. The
  GET takes in each piece when `pace` lets it (the hot path first, tiered.tiering.blocks.hot_path), and stops early once
  the bytes a reader wants are in (`stop_at`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from tiered.tiering.objects.store import ObjectStore
from tiered.tiering.objects.meter import Attribution

Pace = Callable[[], Awaitable[None]]  # awaited before each piece of a GET is taken in (tiered.tiering.blocks.hot_path)


class ReadBudget:
    def __init__(self, limit_bytes: int):
        if limit_bytes < 1 << 20:
            raise ValueError("the remote read budget must be at least 1 MiB")
        self.limit = limit_bytes
        self.cache_bytes = limit_bytes // 4  # shared by the index and run caches
        self.buffer_bytes = limit_bytes - self.cache_bytes
        self.used = 0  # bytes of GET buffers held
        self.ahead_used = 0  # of which by read-aheads
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    def _fits(self, n: int) -> bool:
        return self.used + n <= self.buffer_bytes or (self.used == 0 and n > self.buffer_bytes)

    async def acquire(self, n: int) -> None:
        """Takes `n` bytes for a fetch's GET, waiting in turn until they are free."""
        if not self._waiting and self._fits(n):
            self.used += n
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((n, waiter))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(n)  # granted while being cancelled: hand it on
            else:
                self._waiting.remove((n, waiter))
                self._grant()
            raise

    def try_acquire_ahead(self, n: int) -> bool:
        """Takes `n` bytes for a read-ahead if they are free now and read-aheads stay under half of the buffers."""
        if self._waiting or self.ahead_used + n > self.buffer_bytes // 2 or self.used + n > self.buffer_bytes:
            return False
        self.used += n
        self.ahead_used += n
        return True

    def release(self, n: int, ahead: bool = False) -> None:
        self.used -= n
        if ahead:
            self.ahead_used -= n
        self._grant()

    def adopt(self, n: int) -> None:
        """A read-ahead's bytes become a fetch's (its consumer came): they no longer count against read-ahead."""
        self.ahead_used -= n

    def _grant(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            n, waiter = self._waiting.popleft()
            if waiter.done():
                continue
            self.used += n
            waiter.set_result(None)


class RangeRead:
    """One streamed range GET; `close` cancels it if still running and gives its bytes back to the budget."""

    def __init__(self, store: ObjectStore, object_key: str, start: int, end: int, budget: ReadBudget, *,
                 ahead: bool, slots: asyncio.Semaphore, attribution: Attribution, pace: Pace | None = None):
        self.object_key = object_key
        self.attribution = attribution
        self.start = start
        self.end = end
        self.buffer = bytearray(end - start)
        self.filled = 0
        self.error: BaseException | None = None
        self.done = False
        self._budget = budget
        self._ahead = ahead
        self._closed = False
        self._stop = end - start  # bytes wanted: the GET stops once they are in (stop_at)
        self._arrived: asyncio.Future | None = None
        self._task = asyncio.get_running_loop().create_task(self._run(store, slots, pace))

    @classmethod
    async def open(cls, store: ObjectStore, object_key: str, start: int, end: int, budget: ReadBudget,
                   slots: asyncio.Semaphore, attribution: Attribution, pace: Pace | None = None) -> RangeRead:
        """A fetch's GET: waits for its bytes of the budget first."""
        await budget.acquire(end - start)
        return cls(store, object_key, start, end, budget, ahead=False, slots=slots, attribution=attribution,
                   pace=pace)

    @classmethod
    def ahead(cls, store: ObjectStore, object_key: str, start: int, end: int, budget: ReadBudget,
              slots: asyncio.Semaphore, attribution: Attribution, pace: Pace | None = None) -> RangeRead | None:
        """A read-ahead GET, or None when the budget has no room for it now."""
        if not budget.try_acquire_ahead(end - start):
            return None
        return cls(store, object_key, start, end, budget, ahead=True, slots=slots, attribution=attribution,
                   pace=pace)

    @property
    def size(self) -> int:
        return self.end - self.start

    async def _run(self, store: ObjectStore, slots: asyncio.Semaphore, pace: Pace | None) -> None:
        try:
            async with slots:
                await store.read_range_into(self.object_key, self.start, self.end, self._received, pace,
                                            attribution=self.attribution)
            if self.filled < self.size:
                raise EOFError(f"object {self.object_key} ends at {self.start + self.filled}, before {self.end}")
        except asyncio.CancelledError:
            self.error = ConnectionAbortedError("range read closed")
            raise
        except Exception as exc:  # handed to the readers, who turn it into an answer
            self.error = exc
        finally:
            self.done = True
            self._wake()

    def _received(self, piece: bytes) -> None:
        n = min(len(piece), self.size - self.filled)  # a store never sends more than asked; if it did, ignore it
        self.buffer[self.filled : self.filled + n] = piece[:n]
        self.filled += n
        self._wake()
        self._stop_if_full()

    def stop_at(self, position: int) -> None:
        """Nothing from object position `position` on is wanted: the GET stops as soon as the bytes before it are in
        (readers asking past it get what arrived, then the abort)."""
        self._stop = min(self._stop, max(0, position - self.start))
        self._stop_if_full()

    def _stop_if_full(self) -> None:
        if self.filled >= self._stop and self.filled < self.size and not self.done and not self._task.done():
            self._task.cancel()

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)
        self._arrived = None

    async def until(self, position: int) -> int:
        """Waits until the bytes before object position `position` have arrived (or all there will be); returns
        the object position up to which bytes are in. Raises what the GET failed with, once nothing more comes."""
        target = min(position, self.end) - self.start
        while self.filled < target and not self.done:
            if self._arrived is None:
                self._arrived = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._arrived)
        if self.filled < target and self.error is not None:
            raise self.error
        return self.start + self.filled

    def view(self, start: int, end: int) -> memoryview:
        """Object bytes [start, end), which must have arrived."""
        return memoryview(self.buffer)[start - self.start : end - self.start]

    def adopt(self) -> None:
        """A read-ahead is taken by the fetch it was made for."""
        if self._ahead:
            self._ahead = False
            self._budget.adopt(self.size)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.done:
            self._task.cancel()
        self._budget.release(self.size, ahead=self._ahead)
