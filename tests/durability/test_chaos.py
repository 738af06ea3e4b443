"""A few rounds of the kill -9 / disk wipe / takeover / damage loop (bench/chaos.py; the benchmark runs 20 and more):
every acknowledged message reads back byte for byte at its seq after every round, and the catalog stays consistent.
Both seeds draw the damage action after a kill -9 (a partition directory removed; seed 11 also a segment overlapping
another, its fallback for garbage while no partition has a sealed segment): the partition is served again from the
bucket and /readyz names it. Garbage over a sealed segment's head: tests/durability/test_damaged_partitions.py.
Seed 11 and the retention case run as the benchmark does, every block left unexpanded by its commit
(block_expand_in_commit_runs = 0, the expansions held back before each kill); seed 29 with a broker's default, so
that the commits that expand their small blocks themselves are attacked too."""

from __future__ import annotations

import pytest

from bench.chaos import run_chaos
from tiered.catalog.blocks import EXPAND_IN_COMMIT_RUNS


@pytest.mark.parametrize("seed, expand_in_commit_runs", [(11, 0), (29, EXPAND_IN_COMMIT_RUNS)])
async def test_no_acknowledged_message_is_lost_to_kills_wipes_and_takeovers(tmp_path, pg_url, s3_endpoint,
                                                                            s3_bucket, seed, expand_in_commit_runs):
    report = await run_chaos(tmp_path, pg_url, {"AWS_ENDPOINT_URL": s3_endpoint}, f"s3://{s3_bucket}/chaos",
                             rounds=4, seed=seed, expand_in_commit_runs=expand_in_commit_runs)
    assert report.ok, report.table()
    assert report.rounds == 4 and report.acks > 100
    # With expand_in_commit_runs 0, each kill fell while expansions were held back (bench/chaos.py): report.ok says
    # the next broker's sweep expanded what it left and the catalog checked after it held.
    assert report.blocks_committed > 0
    assert report.actions["damage"] >= 1 and sum(report.damaged.values()) == report.actions["damage"]  # report.ok:
    # /readyz named each damaged partition as opened again from the bucket


async def test_retention_expires_only_below_the_first_available_seq_under_kills_wipes_and_takeovers(
        tmp_path, pg_url, s3_endpoint, s3_bucket):
    """Three rounds of the loop with remote.retention.secs=5 on 2 KiB segments kept longer on the disk (8) than in the bucket
    and a retention pass every second: every acknowledged message at or above the first available seq reads back,
    every one missing is shown below it, the first available seq never moves back nor is reported below the
    catalog's (a disk holding expired seqs never serves them again, tests/durability/test_retention_restart.py) and
    no seq is answered with other bytes (bench/chaos.py's docstring)."""
    report = await run_chaos(tmp_path, pg_url, {"AWS_ENDPOINT_URL": s3_endpoint}, f"s3://{s3_bucket}/chaos",
                             rounds=3, seed=7, remote_retention_secs=5)
    assert report.ok, report.table()
    assert report.rounds == 3 and report.acks > 100 and report.retention


def test_a_failed_run_keeps_its_brokers_logs_in_the_order_they_started(tmp_path):
    import os

    from bench.chaos import keep_broker_logs

    run = tmp_path / "run"
    run.mkdir()
    assert keep_broker_logs(run) is None
    for age, port in enumerate((31000, 12000, 20000)):  # started in this order: the port says nothing of it
        log = run / f"broker-{port}.log"
        log.write_text(f"broker on {port}\n")
        os.utime(log, (1_000_000 + age, 1_000_000 + age))
    kept = keep_broker_logs(run)
    assert kept is not None and not list(run.glob("broker-*.log"))
    assert [p.name for p in sorted(kept.iterdir())] == ["00-broker-31000.log", "01-broker-12000.log",
                                                        "02-broker-20000.log"]
    assert (kept / "01-broker-12000.log").read_text() == "broker on 12000\n"
