"""Sustained durable produce to every partition of a topic, through a client that follows redirects, with a record
of what was acknowledged; and the read-back that checks the promise: every acknowledged message once, in order,
with its seq, and the seqs without a hole."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tiered.client import Client, NotConfirmed, TankError


@dataclass
class PartitionLog:
    acked: list[bytes] = field(default_factory=list)  # in ack order: a partition's produces are sequential
    unsure: set[bytes] = field(default_factory=set)  # may or may not be stored (NotConfirmed, a lost connection)
    refused: set[bytes] = field(default_factory=set)  # answered "not stored"


class Producers:
    """One task per partition, each producing `p<partition>-<n>` one message at a time until stopped."""

    def __init__(self, client: Client, topic: str, partitions: int, *, pause_s: float = 0.02):
        self.client = client
        self.topic = topic
        self.logs = {p: PartitionLog() for p in range(partitions)}
        self.pause_s = pause_s
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._run(p)) for p in range(partitions)]

    async def _run(self, partition: int) -> None:
        log = self.logs[partition]
        n = 0
        while not self._stop.is_set():
            value = f"p{partition}-{n}".encode()
            n += 1
            try:
                # A leader that does not answer (paused) costs this long, then the client asks the others.
                await self.client.produce(self.topic, partition, [value], timeout_s=5.0)
            except NotConfirmed:
                log.unsure.add(value)
            except (TankError, ConnectionError) as exc:
                (log.unsure if isinstance(exc, ConnectionError) else log.refused).add(value)
            else:
                log.acked.append(value)
            await asyncio.sleep(self.pause_s)

    def acked(self) -> int:
        return sum(len(log.acked) for log in self.logs.values())

    async def wait_for_acks(self, more: int, timeout_s: float = 30.0) -> None:
        """Until `more` acks past the current count have come, on every partition."""
        targets = {p: len(log.acked) + more for p, log in self.logs.items()}
        deadline = time.monotonic() + timeout_s
        while any(len(self.logs[p].acked) < n for p, n in targets.items()):
            if time.monotonic() > deadline:
                counts = {p: (len(log.acked), targets[p]) for p, log in self.logs.items()}
                raise AssertionError(f"produce did not resume on every partition within {timeout_s} s: {counts}")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def read_partition(client: Client, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """Every message from the first available seq to the high-water mark, as (seq, value)."""
    return [(m.seq, m.value) async for m in client.drain(topic, partition, 0)]


def check_partition(partition: int, log: PartitionLog, read: list[tuple[int, bytes]], *,
                    duplicates_allowed: bool = True) -> None:
    """The promise, for one partition: acked messages once each and in ack order; seqs 1.. without a hole; nothing
    read that was never sent; nothing refused stored."""
    seqs = [seq for seq, _ in read]
    assert seqs == list(range(1, len(read) + 1)), f"partition {partition}: seqs with a hole or out of order"
    values = [value for _, value in read]
    positions = {}
    for i, value in enumerate(values):
        assert value not in positions or duplicates_allowed and value in log.unsure, \
            f"partition {partition}: {value!r} stored twice"
        positions.setdefault(value, i)
    missing = [v for v in log.acked if v not in positions]
    assert not missing, f"partition {partition}: {len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
    order = [positions[v] for v in log.acked]
    assert order == sorted(order), f"partition {partition}: acknowledged messages out of order"
    stray = [v for v in values if v not in set(log.acked) and v not in log.unsure]
    assert not stray, f"partition {partition}: stored but never acknowledged nor in doubt: {stray[:3]}"
