"""Brokers reaching the catalog through PgBouncer in transaction mode (docs/scale.md, "Connection pooling"), as
deployed with many brokers: they spread the partitions, take durable produce, take a killed broker's partitions over,
and every acknowledged message reads back; the catalog's check passes."""

from __future__ import annotations

import time

import pytest

from tests.cluster.conftest import LEASE_MS, Cluster
from tests.cluster.producers import Producers
from tests.cluster.test_failover import read_back, start_three
from tests.support.broker import BrokerProcess


@pytest.fixture
def pooled_cluster(tmp_path, pgbouncer_url, s3_endpoint, s3_bucket):
    c = Cluster(tmp_path, pgbouncer_url, f"s3://{s3_bucket}/cluster", s3_endpoint)
    yield c
    c.stop_all()


async def test_three_brokers_through_pgbouncer_take_over_a_killed_one(pooled_cluster):
    cluster = pooled_cluster
    assert "pooled=true" in cluster.catalog_url
    client = await start_three(cluster, "ev", 6)
    producers = Producers(client, "ev", 6)
    try:
        await producers.wait_for_acks(5)
        victim = cluster.leaders("ev")[0]
        cluster.kill(victim)
        survivors = set(cluster.brokers) - {victim}
        cluster.wait_for_leaders("ev", survivors, timeout_s=LEASE_MS / 1000 + 10)
        await producers.wait_for_acks(3, timeout_s=LEASE_MS / 1000 + 15)
        cluster.check("ev")
    finally:
        await producers.stop()
        await client.close()
    # 5 acks before the kill and 3 after, on every partition: the read-back below checks no fewer than those.
    assert producers.acked() >= 6 * (5 + 3)
    await read_back(cluster, "ev", producers)


def test_behind_pgbouncer_a_broker_listens_through_catalog_notices_url_and_says_so_once_without_it(
        tmp_path, pgbouncer_url, pg_url):
    """`tiered serve` with its catalog through PgBouncer: without catalog_notices_url it says once that it looks
    every 0.25 s without notices; with it (here by its environment variable), it listens through the direct URL."""
    store = f"file://{tmp_path / 'objects'}"
    alone = BrokerProcess(tmp_path / "disk1", "--catalog", pgbouncer_url, "--store", store, "--broker-id", "1")
    alone.start()
    try:
        alone.terminate()
    finally:
        alone.kill()
    assert alone.output().count("no change notices: the catalog is reached through a transaction-mode pooler") == 1
    assert "listening for the catalog's change notices" not in alone.output()

    told = BrokerProcess(tmp_path / "disk2", "--catalog", pgbouncer_url, "--store", store, "--broker-id", "2",
                         env={"TIERED_CATALOG_NOTICES_URL": pg_url})
    told.start()
    try:
        deadline = time.monotonic() + 30
        while "listening for the catalog's change notices" not in told.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "listening for the catalog's change notices" in told.output()
        assert "no change notices" not in told.output()
    finally:
        told.kill()
