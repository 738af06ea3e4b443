"""Cancellation that is never lost: every deadline on an await (`within`), the running task's own pending cancel
(`cancel_requested`), and stopping tasks for good (`cancel_until_done`).

Not asyncio.wait_for: on Python 3.11 it loses a cancellation of the calling task that arrives as the awaited call
finishes (it returns the result, and the task runs on as if it had never been cancelled: a loop stopped by one
cancel then never stops). asyncio.timeout keeps it: it turns into TimeoutError only the cancellation its own
deadline made, and lets any other one through.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Sequence, TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """The awaitable's result, or TimeoutError once `seconds` passed, the awaitable cancelled then (a shielded one is
    left running; a worker thread's call cannot be stopped: it runs on, its result dropped)."""
    async with asyncio.timeout(seconds):
        return await awaitable


def cancel_requested() -> bool:
    """Whether the running task was asked to stop. A CancelledError it catches is then its own, to raise on, even
    when what it awaited (another task, a shared future) ended cancelled at the same moment."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def cancel_until_done(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancels the tasks and waits for them to end. A cancellation can still be lost in code not ours (a library's
    asyncio.wait_for on 3.11), so it is repeated until they end."""
    while tasks:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=0.1)
        tasks = [t for t in tasks if not t.done()]
