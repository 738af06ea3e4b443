"""A few rounds of the kill -9 / disk wipe / takeover loop (bench/chaos.py; the benchmark runs 20 and more): every
acknowledged message reads back byte for byte at its seq after every round, and the catalog stays consistent."""

from __future__ import annotations

import pytest

from bench.chaos import run_chaos


@pytest.mark.parametrize("seed", [11, 29])
async def test_no_acknowledged_message_is_lost_to_kills_wipes_and_takeovers(tmp_path, pg_url, s3_endpoint,
                                                                            s3_bucket, seed):
    report = await run_chaos(tmp_path, pg_url, {"AWS_ENDPOINT_URL": s3_endpoint}, f"s3://{s3_bucket}/chaos",
                             rounds=4, seed=seed)
    assert report.ok, report.table()
    assert report.rounds == 4 and report.acks > 100

