"""`tiered cluster status|rebalance`, `tiered topic describe` and `tiered topic config` against a running service,
as an operator runs them; and a SQLite catalog refusing a second live broker."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.cluster.conftest import LEASE_MS
from tests.support.broker import BrokerProcess
from tests.support.cli import one_line_error, tiered


def bootstrap(cluster) -> str:
    return ",".join(f"127.0.0.1:{bp.port}" for bp in cluster.brokers.values())


def test_status_shows_brokers_leases_and_leaders_and_rebalance_evens_them_out(cluster):
    cluster.start_all(range(3))
    tiered("topic", "create", "-b", bootstrap(cluster), "ev", "6", "-o", "produce.ack=durable")
    cluster.wait_for_leaders("ev", {0, 1, 2})
    cluster.kill(2)
    cluster.wait_for_leaders("ev", {0, 1}, timeout_s=LEASE_MS / 1000 + 10)
    cluster.start(2)
    assert Counter(cluster.leaders("ev").values()) == {0: 3, 1: 3}  # a returning broker takes nothing back

    status = tiered("cluster", "status", "--catalog", cluster.catalog_url).stdout.decode()
    brokers, partitions = status.split("\n\n")
    rows = [line.split() for line in brokers.splitlines()[1:]]
    assert [(r[0], r[1], r[-1]) for r in rows] == [
        ("0", f"127.0.0.1:{cluster.brokers[0].port}", "3"), ("1", f"127.0.0.1:{cluster.brokers[1].port}", "3"),
        ("2", f"127.0.0.1:{cluster.brokers[2].port}", "0")]
    assert all("live" in line for line in brokers.splitlines()[1:])
    assert len(partitions.splitlines()) == 1 + 6

    moved = tiered("cluster", "rebalance", "--catalog", cluster.catalog_url)
    assert len(moved.stdout.decode().splitlines()) == 2
    assert "asked the leaders to move 2 partitions" in moved.stderr.decode()
    deadline = time.monotonic() + 15
    while Counter(cluster.leaders("ev").values()) != {0: 2, 1: 2, 2: 2}:
        assert time.monotonic() < deadline, cluster.leaders("ev")
        time.sleep(0.2)
    cluster.wait_for_leaders("ev", {0, 1, 2})
    assert "would move 0 partitions" in tiered("cluster", "rebalance", "--dry-run", "--catalog",
                                               cluster.catalog_url).stderr.decode()
    cluster.check("ev")


def test_describe_says_what_an_ack_promises(cluster):
    cluster.start(0)
    b = bootstrap(cluster)
    tiered("topic", "create", "-b", b, "fast", "2", "-o", "produce.ack=local")
    tiered("topic", "create", "-b", b, "safe", "1")
    fast = tiered("topic", "describe", "-b", b, "fast", "--catalog", cluster.catalog_url).stdout.decode()
    assert "acks\tproduce.ack=local: acknowledged once appended on the leader's disk; a leader that dies loses" in fast
    safe = tiered("topic", "describe", "-b", b, "safe", env={"TIERED_CATALOG_URL": cluster.catalog_url}).stdout
    assert "acks\tproduce.ack=durable (the default" in safe.decode()


@pytest.mark.parametrize("second_id", [1])
def test_a_sqlite_catalog_refuses_a_second_live_broker_naming_postgresql(tmp_path, second_id):
    catalog = f"sqlite:///{tmp_path}/catalog.db"
    store = f"file://{tmp_path}/objects"
    first = BrokerProcess(tmp_path / "a", "--catalog", catalog, "--store", store, "--broker-id", "0").start()
    try:
        second = BrokerProcess(tmp_path / "b", "--catalog", catalog, "--store", store, "--broker-id",
                               str(second_id))
        with pytest.raises(RuntimeError, match="PostgreSQL"):
            second.start(timeout_s=20)
        # A crashed broker's lease does not stand in the way: its process is gone.
        first.kill()
        second.start(timeout_s=20)
        second.kill()
    finally:
        first.kill()


def test_a_topic_config_change_reaches_every_broker_and_the_bucket(cluster, s3_bucket):
    """`tiered topic config` writes the catalog and the bucket's topic object; each broker applies the change at its
    next look at the catalog and keeps it on its disk for the next start."""
    cluster.start_all(range(2))
    tiered("topic", "create", "-b", bootstrap(cluster), "ev", "2", "-o", "produce.ack=durable")
    cluster.wait_for_leaders("ev", {0, 1})
    flags = ("--catalog", cluster.catalog_url, "--store", cluster.store_url, "--s3-path-style")
    env = {"AWS_ENDPOINT_URL": cluster.s3_endpoint}
    changed = tiered("topic", "config", "ev", "-o", "remote.retention.secs=7d,log.segment.bytes=1m", *flags, env=env)
    assert "topic ev: produce.ack=durable, remote.retention.secs=7d, log.segment.bytes=1m" in changed.stdout.decode()
    expected = "produce.ack=durable\nremote.retention.secs=7d\nlog.segment.bytes=1m\n"
    files = [cluster.brokers[b].data_dir / "ev" / "config" for b in range(2)]
    deadline = time.monotonic() + 10
    while not all(f.exists() and f.read_text() == expected for f in files):
        assert time.monotonic() < deadline, [f.read_text() if f.exists() else None for f in files]
        time.sleep(0.1)
    assert cluster.logs().count("topic ev: configuration applied from the catalog") >= 2

    import boto3

    s3 = boto3.client("s3", endpoint_url=cluster.s3_endpoint)
    body = s3.get_object(Bucket=s3_bucket, Key="cluster/topics/ev.json")["Body"].read().decode()
    assert "remote.retention.secs=7d" in body

    shown = tiered("topic", "config", "ev", "--unset", "log.segment.bytes", *flags, env=env).stdout.decode()
    assert "topic ev: produce.ack=durable, remote.retention.secs=7d\n" in shown
    refused = tiered("topic", "config", "ev", "-o", "log.retention.secs=soon", *flags, env=env, check=False)
    assert "invalid value 'soon' for 'log.retention.secs'" in one_line_error(refused, "topic config")
    assert "unknown topic 'nosuch'" in one_line_error(
        tiered("topic", "config", "nosuch", *flags, env=env, check=False), "topic config")
    cluster.check("ev")
