"""Parsing the data source's options (no Spark needed)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tiered.spark.options import OptionError, ReadOptions, datetime_to_us, parse_timestamp_ms
from tiered.spark.planning import DEFAULT_MAX_SPLIT_BYTES, U64_MAX, SeqRange, TimeRange

BASE = {"catalog": "sqlite:///c.db", "store": "s3://bucket/prefix", "topic": "events"}


def test_defaults_read_everything():
    options = ReadOptions.parse(BASE)
    assert (options.catalog_url, options.store_url, options.topic) == ("sqlite:///c.db", "s3://bucket/prefix", "events")
    assert options.partitions is None
    assert options.seqs == SeqRange(1, U64_MAX)
    assert options.times == TimeRange(0, None) and options.times.unbounded
    assert options.max_split_bytes == DEFAULT_MAX_SPLIT_BYTES
    assert options.s3_path_style is None and options.filter_pushdown is False


def test_every_option_case_insensitively():
    options = ReadOptions.parse({
        **BASE, "PARTITIONS": " 2, 0 ,2", "startingseq": "10", "endingSeq": "20",
        "startingTimestamp": "1700000000000", "endingTimestamp": "2023-11-14T22:13:21.5+00:00",
        "maxSplitBytes": "8MiB", "s3PathStyle": "true", "filterPushdown": "yes",
    })
    assert options.partitions == frozenset({0, 2})
    assert options.seqs == SeqRange(10, 20)
    assert options.times == TimeRange(1_700_000_000_000_000, 1_700_000_001_500_000)
    assert options.max_split_bytes == 8 << 20
    assert options.s3_path_style is True and options.filter_pushdown is True


@pytest.mark.parametrize("options, text", [
    ({"topic": ""}, "topic required"),
    ({"catalog": None, "store": None}, "catalog, store required"),
    ({"startingSeq": "0"}, "startingSeq"),
    ({"endingSeq": "x"}, "endingSeq"),
    ({"partitions": "1,a"}, "partitions"),
    ({"partitions": "70000"}, "partitions"),
    ({"startingTimestamp": "yesterday"}, "startingTimestamp"),
    ({"endingTimestamp": "-5"}, "before the epoch"),
    ({"maxSplitBytes": "1k"}, "at least"),
    ({"maxSplitBytes": "lots"}, "maxSplitBytes"),
    ({"s3PathStyle": "maybe"}, "s3PathStyle"),
    ({"startSeq": "1"}, "unknown option 'startSeq'"),
])
def test_bad_options_are_named(options, text):
    with pytest.raises(OptionError, match=text):
        ReadOptions.parse({**BASE, **options})


def test_timestamps_from_milliseconds_or_iso_8601():
    assert parse_timestamp_ms("1700000000123") == 1_700_000_000_123
    assert parse_timestamp_ms("2023-11-14T22:13:20.123Z") == 1_700_000_000_123
    assert parse_timestamp_ms("2023-11-14 22:13:20.123") == 1_700_000_000_123  # no offset: UTC
    assert parse_timestamp_ms("2023-11-14T23:13:20.123+01:00") == 1_700_000_000_123
    moment = datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert datetime_to_us(moment) == 1_700_000_000_123_456 - 7_200_000_000
    assert datetime_to_us(moment.replace(tzinfo=None)) == 1_700_000_000_123_456
