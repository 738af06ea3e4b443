"""SIGTERM under a produce load: the broker stops accepting, answers what it took in, commits the open block and exits
0; after a restart on the same disk, catalog and store, every acknowledged message is there, and the catalog
already held every acknowledged seq when the broker stopped (nothing acknowledged needs uploading again)."""

from __future__ import annotations

import asyncio
import json
import time


from tiered.catalog import Catalog
from tiered.catalog import partitions as catalog_partitions
from tiered.client import Client, TankError
from tiered.protocol.codes import ProduceStatus

PARTITIONS = 3
PRODUCERS = 4


async def _producer(port: int, number: int, acked: dict[int, list[bytes]], failures: list[str]) -> None:
    """Produces one message at a time, round robin over the partitions, until the broker stops answering."""
    try:
        client = await Client.connect("127.0.0.1", port)
    except OSError as exc:
        failures.append(f"connect: {exc!r}")
        return
    try:
        for n in range(100_000):
            partition = (number + n) % PARTITIONS
            value = b"p%d-%06d" % (number, n)
            try:
                await asyncio.wait_for(client.produce("load", partition, [value]), 30)
            except (Exception, asyncio.TimeoutError) as exc:  # the broker is going away: this one was not acked
                failures.append(repr(exc))
                return
            acked[partition].append(value)
    finally:
        await client.close()


def _catalog_hwmarks(data_dir, topic: str) -> dict[int, int]:
    catalog = Catalog.open(f"sqlite:///{(data_dir / '.tiered' / 'catalog.db').resolve()}")
    try:
        return {s.partition: s.hwmark_seq for s in catalog_partitions.get_partition_states(catalog, topic)}
    finally:
        catalog.close()


async def test_sigterm_during_a_produce_load_loses_no_acknowledged_message(broker_process, tmp_path):
    data_dir = tmp_path / "data"
    flags = ("--block-max-age-ms", "20", "--shutdown-timeout-s", "10", "--log-format", "json")
    bp = broker_process(*flags, data_dir=data_dir)
    async with await Client.connect("127.0.0.1", bp.port) as c:
        await c.create_topic("load", PARTITIONS)
    acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    failures: list[str] = []
    producers = [asyncio.ensure_future(_producer(bp.port, i, acked, failures)) for i in range(PRODUCERS)]
    deadline = time.monotonic() + 20
    while sum(map(len, acked.values())) < 60 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert sum(map(len, acked.values())) >= 60, f"the load did not get going: {failures}\n{bp.output()}"
    sent_at = time.monotonic()
    code = await asyncio.to_thread(bp.terminate, 15)
    stopped_s = time.monotonic() - sent_at
    await asyncio.wait_for(asyncio.gather(*producers), 30)
    output = bp.output()
    assert code == 0, output
    assert stopped_s < 10, f"shutdown took {stopped_s:.1f} s, more than the shutdown timeout"
    assert len(failures) == PRODUCERS  # every producer ran until the broker went away
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert not [r for r in lines if r["level"] == "error"], output
    assert lines[-1]["msg"] == "stopped"

    # The catalog, as the stopped broker left it, holds every acknowledged message of every partition.
    hwmarks = _catalog_hwmarks(data_dir, "load")
    restarted = broker_process(*flags, data_dir=data_dir)
    async with await Client.connect("127.0.0.1", restarted.port) as c:
        for p in range(PARTITIONS):
            stored = {m.value: m.seq async for m in c.drain("load", p, 0)}
            missing = [v for v in acked[p] if v not in stored]
            assert not missing, f"partition {p}: {len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
            assert max(stored[v] for v in acked[p]) <= hwmarks[p], f"partition {p}: acked past the catalog"
    assert restarted.terminate(15) == 0


async def test_sigterm_commits_the_open_block_and_says_so(broker_process, tmp_path):
    # A long block age: the produce below sits in the open block when SIGTERM arrives.
    bp = broker_process("--block-max-age-ms", "5000", "--shutdown-timeout-s", "10", data_dir=tmp_path / "data")
    async with await Client.connect("127.0.0.1", bp.port) as c:
        await c.create_topic("late", 1)
        producing = asyncio.ensure_future(c.produce("late", 0, [b"in the open block"]))
        await asyncio.sleep(0.3)
        assert not producing.done()
        code = await asyncio.to_thread(bp.terminate, 15)
        await asyncio.wait_for(producing, 5)  # acknowledged: committed at shutdown, well before the block's age
    assert code == 0
    assert _catalog_hwmarks(tmp_path / "data", "late") == {0: 1}
    said = [line for line in bp.output().splitlines() if "open block" in line and "commit" in line]
    assert said, bp.output()


async def test_a_request_arriving_during_shutdown_is_answered(ops_broker):
    app = await ops_broker(block_max_age_ms=5000, shutdown_timeout_s=2.0)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("late", 1)
        first = asyncio.ensure_future(c.produce("late", 0, [b"before"]))
        await asyncio.sleep(0.2)
        stopping = asyncio.ensure_future(app.broker.stop())
        await asyncio.sleep(0)  # the broker stops accepting and commits the open block ...
        second = asyncio.ensure_future(c.produce("late", 0, [b"during"]))  # ... while this one arrives
        await asyncio.wait_for(first, 5)
        started = time.monotonic()
        outcome = await asyncio.gather(second, return_exceptions=True)
        await asyncio.wait_for(stopping, 5)
    # Answered either way (acked, or refused with a TANK status), promptly, not dropped with the connection.
    assert not isinstance(outcome[0], ConnectionError), outcome
    if isinstance(outcome[0], TankError):
        assert outcome[0].code == ProduceStatus.NO_LEADER  # TANK's client retries on the broker taking over
    assert time.monotonic() - started < 1.0
