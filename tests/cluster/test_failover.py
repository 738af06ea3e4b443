"""Several brokers as one service (docs/cluster.md): leaderships spread, any broker answers through redirects, a
killed leader's partitions are taken over from the catalog and the bucket, a paused leader acknowledges nothing
after its lease, and a rolling restart under durable produce loses and duplicates nothing.

Each test reads every acknowledged message back byte for byte and runs the catalog's consistency check."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType

from tests.cluster.conftest import LEASE_MS
from tests.cluster.producers import Producers, check_partition, read_partition
from tests.server.rawwire import RawConnection

DURABLE = {"produce.ack": "durable"}


async def start_three(cluster, topic: str, partitions: int) -> Client:
    cluster.start_all(range(3))
    client = await Client.connect_any([f"127.0.0.1:{cluster.brokers[0].port}"])
    await client.create_topic(topic, partitions, DURABLE)
    cluster.wait_for_leaders(topic, {0, 1, 2})
    return client


async def read_back(cluster, topic: str, producers: Producers, *, duplicates_allowed: bool = True) -> None:
    """Through a client that knows one live broker only: every partition read back and checked."""
    live = [bp for bp in cluster.brokers.values() if bp.proc.poll() is None]
    async with await Client.connect_any([f"127.0.0.1:{live[0].port}"]) as reader:
        for partition, log in producers.logs.items():
            check_partition(partition, log, await read_partition(reader, topic, partition),
                            duplicates_allowed=duplicates_allowed)
    cluster.check(topic)


async def test_twelve_partitions_spread_and_one_client_reaches_them_all(cluster):
    client = await start_three(cluster, "ev", 12)
    try:
        assert Counter(cluster.leaders("ev").values()) == {0: 4, 1: 4, 2: 4}
        for p in range(12):
            await client.produce("ev", p, [f"a{p}", f"b{p}"])
        for p in range(12):
            got = await client.consume("ev", p, 1)
            assert [(m.seq, m.value) for m in got.messages] == [(1, f"a{p}".encode()), (2, f"b{p}".encode())]
        # Topic list and describe from any broker see the same topic.
        for broker_id in (1, 2):
            async with await Client.connect(*cluster.endpoint(broker_id)) as other:
                assert [(t.name, t.partitions) for t in await other.discover_topics()] == [("ev", 12)]
    finally:
        await client.close()
    cluster.check("ev")


@pytest.mark.parametrize("seed", [7])
async def test_kill_9_of_leaders_during_sustained_durable_produce(cluster, seed):
    """Rounds of: kill -9 a random broker while every partition takes durable produces; the others take its
    partitions over; produce resumes everywhere; the killed broker comes back (and takes nothing back)."""
    rng = random.Random(seed)
    client = await start_three(cluster, "ev", 6)
    producers = Producers(client, "ev", 6)
    try:
        await producers.wait_for_acks(5)
        for _ in range(3):
            victim = rng.choice(sorted(cluster.brokers))
            led_before = {p for p, b in cluster.leaders("ev").items() if b == victim}
            cluster.kill(victim)
            killed_at = time.monotonic()
            survivors = set(cluster.brokers) - {victim}
            cluster.wait_for_leaders("ev", survivors, timeout_s=LEASE_MS / 1000 + 10)
            await producers.wait_for_acks(3, timeout_s=LEASE_MS / 1000 + 15)
            took = time.monotonic() - killed_at
            assert took < LEASE_MS / 1000 + 10, f"partitions {led_before} dark for {took:.1f} s"
            cluster.check("ev")
            cluster.start(victim)
            assert all(b in survivors for b in cluster.leaders("ev").values())  # nothing taken back
            await producers.wait_for_acks(2)
    finally:
        await producers.stop()
        await client.close()
    assert producers.acked() > 6 * 10
    await read_back(cluster, "ev", producers)


async def test_a_paused_leader_acknowledges_nothing_after_its_lease(cluster):
    cluster.start_all([0, 1])
    async with await Client.connect_any([f"127.0.0.1:{cluster.brokers[1].port}"]) as client:
        await client.create_topic("ev", 2, DURABLE)
        assert cluster.wait_for_leaders("ev", {0, 1}) == {0: 0, 1: 1}
        producers = Producers(client, "ev", 2)
        await producers.wait_for_acks(5)
        # A connection to broker 0 opened before the pause; its produce is read only after SIGCONT.
        raw = await RawConnection.open(cluster.brokers[0].port)
        cluster.pause(0)
        try:
            cluster.wait_for_leaders("ev", {1}, timeout_s=LEASE_MS / 1000 + 10)
            await producers.wait_for_acks(5)  # partition 0 continues on broker 1
            bundle = encode_bundle([Message(b"late")])
            req = rq.ProduceRequest(9, (rq.ProduceTopic("ev", (rq.ProducePartition(0, bundle),)),))
            await raw.send(MsgType.PRODUCE, rq.encode_produce_request(req))
        finally:
            cluster.resume(0)
        msg_id, payload = await raw.recv()
        await raw.close()
        assert msg_id == MsgType.PRODUCE and payload[:4] == (9).to_bytes(4, "little")
        assert payload[4] in (ProduceStatus.NO_LEADER, ProduceStatus.OTHER_LEADER), payload.hex()
        await producers.wait_for_acks(5)
        await producers.stop()
        assert b"late" not in [v for _, v in await read_partition(client, "ev", 0)]
    await read_back(cluster, "ev", producers)


async def test_a_rolling_restart_under_durable_produce_loses_and_duplicates_nothing(cluster):
    client = await start_three(cluster, "ev", 6)
    producers = Producers(client, "ev", 6)
    try:
        await producers.wait_for_acks(5)
        for broker_id in range(3):
            assert cluster.stop(broker_id) == 0, cluster.logs()
            await producers.wait_for_acks(3)  # every partition takes produce again, the stopped broker's too
            cluster.start(broker_id)
            await producers.wait_for_acks(3)
    finally:
        await producers.stop()
        await client.close()
    for partition, log in producers.logs.items():
        # Nothing refused: every produce was answered or redirected until a leader took it. (A produce written as
        # its broker closed the connection is "unsure": never sent twice, so never stored twice.)
        assert not log.refused, (partition, log.refused)
    await read_back(cluster, "ev", producers, duplicates_allowed=False)


async def test_a_second_process_with_the_same_broker_id_fences_the_first(cluster):
    """An operator's mistake: broker 1 started again on another disk while the first broker 1 still runs. The newer
    process takes the id over (the first's lease renewal fails from then on) and claims broker 1's partitions with a
    new epoch, so the first one's later commits are refused: nothing it acknowledges can be lost or overwritten. The
    first one then stops by itself (exit 1): it could only answer "no leader" any more."""
    _, first = cluster.start_all([0, 1])
    async with await Client.connect_any([f"127.0.0.1:{cluster.brokers[0].port}"]) as client:
        await client.create_topic("ev", 2, DURABLE)
        assert cluster.wait_for_leaders("ev", {0, 1}) == {0: 0, 1: 1}
        producers = Producers(client, "ev", 2)
        try:
            await producers.wait_for_acks(5)
            cluster.start(1, disk="disk1-again")  # the first process keeps running
            await producers.wait_for_acks(10, timeout_s=LEASE_MS / 1000 + 20)
            assert first.proc.wait(timeout=LEASE_MS / 1000 + 20) == 1, cluster.logs()
            assert "broker id 1 was taken over by another process" in first.output()
            epochs = {a.partition: a.leader_epoch for a in cluster.assignments("ev")}
            await producers.wait_for_acks(5)
        finally:
            await producers.stop()
        assert epochs[1] > 1 and {a.partition: a.leader_broker for a in cluster.assignments("ev")}[1] == 1
    await read_back(cluster, "ev", producers)
