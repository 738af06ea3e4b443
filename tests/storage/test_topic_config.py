import pytest

from tiered.storage.topic_config import ConfigError, TopicConfig, parse_config_text, parse_duration, parse_size

KIB = 1024


@pytest.mark.parametrize(
    "text, expected",
    [
        ("100", 100),
        ("0", 0),
        ("1t", KIB**4), ("1tb", KIB**4), ("1tbs", KIB**4), ("1terabyte", KIB**4), ("2terabytes", 2 * KIB**4),
        ("1TiB", KIB**4),
        ("1g", KIB**3), ("1gb", KIB**3), ("1gbs", KIB**3), ("1gibabyte", KIB**3), ("3gigabytes", 3 * KIB**3),
        ("1GiB", KIB**3), ("1GB", KIB**3),
        ("1m", KIB**2), ("1mb", KIB**2), ("1mbs", KIB**2), ("1megabyte", KIB**2), ("10megabytes", 10 * KIB**2),
        ("1MiB", KIB**2),
        ("1k", KIB), ("1kb", KIB), ("1kbs", KIB), ("1kilobyte", KIB), ("4kilobytes", 4 * KIB), ("1KiB", KIB),
        ("7b", 7), ("1byte", 1), ("9bytes", 9),
        ("1g+512m", KIB**3 + 512 * KIB**2),
        ("1g,512m", KIB**3 + 512 * KIB**2),
        ("1m1k", KIB**2 + KIB),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "k", "1x", "1.5g", "1g+", "-1", "1 g", "1gb+abc", "99999999999999999999999t"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("90", 90),
        ("1w", 604800), ("1week", 604800), ("2weeks", 1209600),
        ("1y", 31536000), ("1year", 31536000), ("2years", 63072000),
        ("1mon", 31536000), ("1month", 31536000), ("2months", 63072000),  # TANK: a month is 365 days
        ("1d", 86400), ("1day", 86400), ("3days", 259200),
        ("1h", 3600), ("1hour", 3600), ("2hours", 7200),
        ("1min", 60), ("5mins", 300), ("1minute", 60), ("10minutes", 600),
        ("1s", 1), ("2sec", 2), ("3secs", 3), ("1second", 1), ("4seconds", 4),
        ("1h+30min", 5400), ("2d,12h", 216000), ("1h30min", 5400),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["5m", "1ms", "", "h", "1hr", "1h+", "1.5h", "1 h", "9999999999w"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_parse_config_text_comments_case_and_unknown_keys():
    text = (
        "# topic settings\n"
        "LOG.Segment.Bytes = 64mb   # roll often\n"
        "\n"
        "   \n"
        "retention.segments.count=5\n"
        "some.future.key=1\n"
    )
    values, warnings = parse_config_text(text)
    assert values == {"log.segment.bytes": "64mb", "retention.segments.count": "5", "some.future.key": "1"}
    assert len(warnings) == 1 and "some.future.key" in warnings[0] and "line 6" in warnings[0]


@pytest.mark.parametrize("line", ["log.segment.bytes=", "log.segment.bytes", "log.segment.bytes=" + "1" * 129, "=5"])
def test_parse_config_text_rejects_bad_lines(line):
    with pytest.raises(ConfigError):
        parse_config_text(line + "\n")


def test_value_of_128_chars_is_accepted():
    values, _ = parse_config_text("some.key=" + "a" * 128)
    assert values["some.key"] == "a" * 128


def test_defaults_are_tanks():
    config = TopicConfig.from_layers()
    assert config == TopicConfig()
    assert config.retention_segments_count == 0
    assert config.log_retention_bytes == 0
    assert config.log_retention_secs == 0
    assert config.log_segment_bytes == 1024**3
    assert config.log_index_interval_bytes == 4096
    assert config.log_index_size_max_bytes == 10 * 1024**2
    assert config.log_roll_jitter_secs == 0
    assert config.log_roll_secs == 604800
    assert config.log_cleanup_policy == "delete"
    assert config.log_cleaner_min_cleanable_ratio == 0.5
    assert config.log_cleaner_delete_retention_secs == 86400
    assert config.flush_messages == 0 and config.flush_secs == 0
    assert config.produce_ack == "durable"
    assert config.remote_retention_secs == 0 and config.remote_retention_bytes == 0
    assert config.remote_copy is True


def test_layers_override_in_order():
    topic, _ = parse_config_text("log.segment.bytes=1gb\nlog.retention.secs=1d\nproduce.ack=local\n")
    partition, _ = parse_config_text("LOG.SEGMENT.BYTES=2mb\n")
    config = TopicConfig.from_layers(topic, partition)
    assert config.log_segment_bytes == 2 * 1024**2
    assert config.log_retention_secs == 86400
    assert config.produce_ack == "local"


def test_every_key_parses():
    text = """
        retention.segments.count=2
        log.retention.bytes=128
        log.retention.secs=1w
        log.segment.bytes=64
        log.index.interval.bytes=128
        log.index.size.max.bytes=1k
        log.roll.jitter.secs=2h
        log.roll.secs=1d
        log.cleanup.policy=CLEANUP
        log.cleaner.min.cleanable.ratio=0.25
        log.cleaner.delete.retention.secs=12h
        flush.messages=100
        flush.secs=5s
        produce.ack=Local
        remote.retention.secs=30d
        remote.retention.bytes=10g
        remote.copy=false
    """
    values, warnings = parse_config_text(text)
    assert warnings == []
    config = TopicConfig.from_layers(values)
    assert config == TopicConfig(
        retention_segments_count=2,
        log_retention_bytes=128,
        log_retention_secs=604800,
        log_segment_bytes=64,
        log_index_interval_bytes=128,
        log_index_size_max_bytes=1024,
        log_roll_jitter_secs=7200,
        log_roll_secs=86400,
        log_cleanup_policy="cleanup",
        log_cleaner_min_cleanable_ratio=0.25,
        log_cleaner_delete_retention_secs=12 * 3600,
        flush_messages=100,
        flush_secs=5,
        produce_ack="local",
        remote_retention_secs=30 * 86400,
        remote_retention_bytes=10 * 1024**3,
        remote_copy=False,
    )
    assert TopicConfig.from_layers(parse_config_text(config.to_text())[0]) == config
    assert TopicConfig().to_text() == ""


@pytest.mark.parametrize(
    "key, value",
    [
        ("retention.segments.count", "1"),
        ("retention.segments.count", "x"),
        ("log.retention.bytes", "127"),
        ("log.segment.bytes", "1"),  # CreateTopic observed answering 04 for this
        ("log.segment.bytes", "63"),
        ("log.index.interval.bytes", "127"),
        ("log.index.size.max.bytes", "100"),
        ("log.retention.secs", "5m"),
        ("log.cleanup.policy", "compact"),
        ("log.cleaner.min.cleanable.ratio", "1.5"),
        ("log.cleaner.min.cleanable.ratio", "half"),
        ("log.cleaner.delete.retention.secs", "5m"),
        ("flush.messages", "-1"),
        ("produce.ack", "all"),
        ("remote.copy", "maybe"),
        ("remote.retention.bytes", "lots"),
    ],
)
def test_bad_values_name_key_and_value(key, value):
    with pytest.raises(ConfigError) as info:
        TopicConfig.from_layers({key: value})
    assert info.value.key == key and info.value.value == value
    assert key in str(info.value) and value in str(info.value)


@pytest.mark.parametrize(
    "key, value, field, expected",
    [
        ("retention.segments.count", "0", "retention_segments_count", 0),
        ("log.retention.bytes", "0", "log_retention_bytes", 0),
        ("log.segment.bytes", "64", "log_segment_bytes", 64),
    ],
)
def test_limits_accept_their_edges(key, value, field, expected):
    assert getattr(TopicConfig.from_layers({key: value}), field) == expected


def test_unknown_keys_are_skipped_by_from_layers():
    assert TopicConfig.from_layers({"no.such.key": "zzz"}) == TopicConfig()
