"""The data directory: topic names, atomic creation, scanning, partition config for ReloadConf."""

import os

import pytest

from tiered.storage.topic_config import ConfigError
from tiered.storage.topics import (
    InvalidTopicName,
    PartitionConfigError,
    TopicDir,
    TopicDirError,
    TopicDirExists,
    create_topic_dir,
    is_valid_topic_name,
    read_partition_config,
    scan,
    scan_report,
    validate_topic_name,
)


@pytest.mark.parametrize("name", ["a", "events", "pyt", "A-b_c", "x" * 64, "a-_-b", "0", "9lives", "a_b"])
def test_valid_topic_names(name):
    assert is_valid_topic_name(name) and validate_topic_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "..", ".", ".x", "/", "a/b", "bad/name", "x" * 65, "-a", "a-", "_a", "a_", "a b", "a.b", "é", "a\x00", "a\n"],
)
def test_invalid_topic_names(name):
    assert not is_valid_topic_name(name)
    with pytest.raises(InvalidTopicName):
        validate_topic_name(name)


def test_create_topic_dir(tmp_path):
    path = create_topic_dir(str(tmp_path), "events", 3, "log.segment.bytes=1mb\n")
    assert path == str(tmp_path / "events")
    assert sorted(os.listdir(path)) == ["0", "1", "2", "config"]
    assert (tmp_path / "events" / "config").read_text() == "log.segment.bytes=1mb\n"
    assert not os.path.exists(tmp_path / ".events")
    create_topic_dir(str(tmp_path), "logs", 1)
    assert os.listdir(tmp_path / "logs") == ["0"]  # no config file for an empty config
    with pytest.raises(TopicDirExists):
        create_topic_dir(str(tmp_path), "events", 1)


@pytest.mark.parametrize(
    "name, partitions", [("bad/name", 1), ("..", 1), (".x", 1), ("ok", 0), ("ok", 65536), ("tiered", 1)]
)
def test_create_refuses_bad_requests(tmp_path, name, partitions):
    with pytest.raises(ValueError):
        create_topic_dir(str(tmp_path), name, partitions)
    assert os.listdir(tmp_path) == []


def test_create_refuses_bad_config_before_touching_disk(tmp_path):
    with pytest.raises(ConfigError):
        create_topic_dir(str(tmp_path), "t", 1, "log.segment.bytes=1\n")  # observed: CreateTopic answers 04
    assert os.listdir(tmp_path) == []


def test_create_refuses_over_a_stray_staging_dir_holding_more_than_a_creation_writes(tmp_path):
    os.makedirs(tmp_path / ".events" / "0")
    (tmp_path / ".events" / "0" / "1_0.log").write_bytes(b"x")
    with pytest.raises(TopicDirError):
        create_topic_dir(str(tmp_path), "events", 1)
    assert os.listdir(tmp_path) == [".events"]
    assert os.listdir(tmp_path / ".events" / "0") == ["1_0.log"]


def test_create_replaces_what_an_interrupted_creation_left(tmp_path):
    """A kill -9 between a creation's mkdirs and its rename leaves `.events` with empty partition directories (and
    its config): nobody has read it, so the next creation of the topic (a restart creating the catalog's topics)
    starts over instead of leaving the topic unknown."""
    os.makedirs(tmp_path / ".events" / "0")
    os.makedirs(tmp_path / ".events" / "7")
    (tmp_path / ".events" / "config").write_text("retention.segments.count=3\n")
    create_topic_dir(str(tmp_path), "events", 2)
    assert os.listdir(tmp_path) == ["events"]
    assert sorted(os.listdir(tmp_path / "events")) == ["0", "1"]


def test_scan(tmp_path):
    create_topic_dir(str(tmp_path), "events", 2, "retention.segments.count=3\n")
    create_topic_dir(str(tmp_path), "logs", 1)
    os.mkdir(tmp_path / ".half")  # interrupted creation
    os.mkdir(tmp_path / ".tiered")
    (tmp_path / ".cleanup.log").write_bytes(b"")
    os.makedirs(tmp_path / "gappy" / "0")
    os.makedirs(tmp_path / "gappy" / "2")
    os.makedirs(tmp_path / "empty")
    os.makedirs(tmp_path / "bad name")
    (tmp_path / "stray-file").write_text("x")
    (tmp_path / "events" / "notes").write_text("x")
    topics, problems = scan_report(str(tmp_path))
    # A partition without its directory is the registry's to report; the topic's other partitions are loaded.
    assert topics == [TopicDir("events", 2, "retention.segments.count=3\n"), TopicDir("gappy", 3, "", (1,), (1,)),
                      TopicDir("logs", 1, "")]
    assert len(problems) == 6
    for word in (".half", "gappy", "empty", "bad name", "stray-file", "notes"):
        assert any(word in p for p in problems), word
    assert not any(".tiered" in p or ".cleanup.log" in p for p in problems)
    assert os.path.isdir(tmp_path / ".half")  # reported, not deleted
    assert scan(str(tmp_path)) == topics


def test_scan_counts_a_file_where_a_partition_directory_should_be(tmp_path):
    create_topic_dir(str(tmp_path), "t", 4)
    os.rmdir(tmp_path / "t" / "3")
    (tmp_path / "t" / "3").write_text("not a directory")  # the last one: the count still includes it
    os.rmdir(tmp_path / "t" / "1")  # and one in the middle with nothing at all
    os.makedirs(tmp_path / "t" / "4096")  # past any partition count: not a partition
    topics, problems = scan_report(str(tmp_path))
    assert topics == [TopicDir("t", 4, "", (1, 3), (1,))]
    assert any("not a directory, where partition 3's should be" in p for p in problems)
    assert any("partitions [1, 3] have no directory" in p for p in problems)
    assert any("4096" in p and "ignored" in p for p in problems)
    # Where directories are made when led, nothing in a partition's place is no problem; a file in it still is.
    topics, problems = scan_report(str(tmp_path), on_demand=True)
    assert topics == [TopicDir("t", 4, "", (1, 3), (1,))]
    assert any("partitions [3] have no directory" in p for p in problems)


def test_a_topic_created_on_demand_has_its_last_partition_directory_only_and_scans_whole(tmp_path):
    """With a catalog below, a creation makes only the last partition's directory: the disk alone still counts the
    topic's partitions (as TANK's scan does), and the others are absent, not damaged, until led here."""
    path = create_topic_dir(str(tmp_path), "t", 4096, "log.segment.bytes=1mb\n", on_demand=True)
    assert sorted(os.listdir(path)) == ["4095", "config"]
    assert not os.path.exists(tmp_path / ".t")
    topics, problems = scan_report(str(tmp_path), on_demand=True)
    assert topics == [TopicDir("t", 4096, "log.segment.bytes=1mb\n", tuple(range(4095)), tuple(range(4095)))]
    assert problems == []
    os.mkdir(tmp_path / "t" / "7")  # led here since
    [topic] = scan(str(tmp_path), on_demand=True)
    assert (topic.partitions, 7 in topic.absent, len(topic.absent)) == (4096, False, 4094)
    # A one-partition topic is laid out whole.
    create_topic_dir(str(tmp_path), "one", 1, on_demand=True)
    assert os.listdir(tmp_path / "one") == ["0"]


def test_an_interrupted_creation_on_demand_is_laid_out_again(tmp_path):
    """The staging rule holds for a creation that makes one partition directory: what a crash leaves of it (the
    staging directory, its last partition's directory, its config) is removed by the next creation of the topic."""
    staging = tmp_path / ".t"
    (staging / "3").mkdir(parents=True)
    (staging / "config").write_text("log.segment.bytes=1mb\n")
    create_topic_dir(str(tmp_path), "t", 4, on_demand=True)
    assert not staging.exists() and os.listdir(tmp_path / "t") == ["3"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a directory whatever its mode")
def test_scan_reports_a_topic_it_cannot_read_and_loads_the_others(tmp_path):
    create_topic_dir(str(tmp_path), "a", 1)
    create_topic_dir(str(tmp_path), "b", 1)
    os.chmod(tmp_path / "a", 0)
    try:
        topics, problems = scan_report(str(tmp_path))
    finally:
        os.chmod(tmp_path / "a", 0o755)
    assert topics == [TopicDir("b", 1, "")]
    assert any("cannot be read" in p for p in problems)


def test_read_partition_config(tmp_path):
    create_topic_dir(str(tmp_path), "logs", 2)
    with pytest.raises(PartitionConfigError) as info:
        read_partition_config(str(tmp_path), "logs", 0)  # observed: no partition config -> 02
    assert info.value.kind == "missing"
    with pytest.raises(PartitionConfigError) as info:
        read_partition_config(str(tmp_path), "nosuch", 0)
    assert info.value.kind == "unknown_topic"
    with pytest.raises(PartitionConfigError) as info:
        read_partition_config(str(tmp_path), "../logs", 0)
    assert info.value.kind == "unknown_topic"
    with pytest.raises(PartitionConfigError) as info:
        read_partition_config(str(tmp_path), "logs", 5)
    assert info.value.kind == "unknown_partition"

    (tmp_path / "logs" / "config").write_text("log.segment.bytes=5mb\n")  # topic level: not read by ReloadConf
    (tmp_path / "logs" / "1" / "config").write_text("# p1\nlog.retention.secs=1d\nfuture.key=1\n")
    values, warnings = read_partition_config(str(tmp_path), "logs", 1)
    assert values == {"log.retention.secs": "1d", "future.key": "1"} and len(warnings) == 1

    (tmp_path / "logs" / "1" / "config").write_text("log.retention.secs=5m\n")
    with pytest.raises(PartitionConfigError) as info:
        read_partition_config(str(tmp_path), "logs", 1)
    assert info.value.kind == "parse" and "log.retention.secs" in str(info.value)

    (tmp_path / "logs" / "1" / "config").write_bytes(b"\xff\xfe")
    with pytest.raises(PartitionConfigError) as info:
        read_partition_config(str(tmp_path), "logs", 1)
    assert info.value.kind == "io"
