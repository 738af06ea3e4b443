"""Every deadline goes through tiered.cancellation.within, which keeps a cancellation of the caller that arrives as the
awaited call finishes; Python 3.11's asyncio.wait_for loses it (it returns the result, and the task runs on). The
race is arranged with the loop's own order, no timing: the awaited future is resolved and the waiting task cancelled
in one step of the test, before the task runs again."""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Awaitable, Callable

import pytest

from tiered.cancellation import within
from tests.support.broker import REPO

Bounded = Callable[[Awaitable[str], float], Awaitable[str]]


async def cancelled_as_it_finishes(bounded: Bounded) -> asyncio.Task[str]:
    """A task waiting on a future through `bounded`, cancelled in the step that resolves the future; returned ended."""
    loop = asyncio.get_running_loop()
    inner: asyncio.Future[str] = loop.create_future()

    async def waiting() -> str:
        return await bounded(inner, 60.0)

    task = loop.create_task(waiting())
    await asyncio.sleep(0)  # the task runs first (it was scheduled first) and waits on `inner`
    assert not task.done() and not inner.done()
    inner.set_result("answer")
    task.cancel()
    await asyncio.wait([task])  # it ends either way: with the answer, or cancelled
    return task


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="from 3.12 on, asyncio.wait_for is asyncio.timeout")
async def test_wait_for_loses_a_cancel_that_arrives_as_its_future_finishes() -> None:
    task = await cancelled_as_it_finishes(asyncio.wait_for)
    assert not task.cancelled() and task.result() == "answer"  # the cancel is gone


async def test_within_keeps_a_cancel_that_arrives_as_its_future_finishes() -> None:
    task = await cancelled_as_it_finishes(within)
    assert task.cancelled()


async def test_within_answers_in_time_and_raises_TimeoutError_at_its_own_deadline() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()
    done.set_result("now")
    assert await within(done, 0) == "now"
    never: asyncio.Future[str] = loop.create_future()
    with pytest.raises(TimeoutError):
        await within(never, 0)  # a deadline already passed fires at the loop's next step
    assert never.cancelled()
    assert asyncio.current_task().cancelling() == 0  # its own cancellation was taken back


async def test_a_cancel_during_a_deadline_that_passes_at_the_same_moment_stays_a_cancel() -> None:
    """The deadline and the caller's cancel in one step: the caller is cancelled, not timed out."""
    loop = asyncio.get_running_loop()
    never: asyncio.Future[str] = loop.create_future()
    task = loop.create_task(within(never, 0))
    await asyncio.sleep(0)  # the task waits; its deadline (already passed) is scheduled behind this step
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()


def test_no_asyncio_wait_for_in_the_package() -> None:
    """A deadline written with asyncio.wait_for would bring the lost cancel back on 3.11."""
    users = [str(path.relative_to(REPO)) for path in sorted((REPO / "tiered").rglob("*.py"))
             if re.search(r"\bwait_for\(", path.read_text())]
    assert users == []
