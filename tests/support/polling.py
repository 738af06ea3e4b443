"""Waiting for something a background task does, with a bound: the one polling helper of the suite."""

from __future__ import annotations

import asyncio
import time


async def eventually(check, timeout_s: float = 20.0, what: str = "condition"):
    """Polls `check` (sync or async) until it returns something true, and returns that; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)
