"""With a tier below, a partition's directory is made when its log first writes (tiered.server.registry): the
registry's side, on a real data directory. The brokers' side (claims, follower reads, takeovers, restarts, a wiped
disk) is tests/cluster/test_partition_dirs.py."""

from __future__ import annotations

import logging
import os

from tiered.protocol.bundle import Message, encode_bundle
from tiered.server.registry import Registry
from tiered.tier_interface import LocalOnly


class WithCatalog(LocalOnly):
    """The registry asks a tier only whether one is below (and hands it rolls): here, one is."""

    lower_tier = True


def test_a_creation_makes_the_last_partition_directory_only_and_a_restart_opens_the_rest_unmade(tmp_path, caplog):
    tier = WithCatalog()
    registry = Registry(tmp_path, {})
    topic = registry.create_topic("t", 8, "retention.segments.count=3\n", tier)
    assert sorted(os.listdir(tmp_path / "t")) == ["7", "config"]
    assert [p.log.made for p in topic.partitions] == [False] * 7 + [True]

    # Written here: made.
    for p in (2, 5):
        topic.partitions[p].log.append(encode_bundle([Message(b"x", ts_ms=1)], codec=0))
    assert sorted(os.listdir(tmp_path / "t")) == ["2", "5", "7", "config"]
    registry.close()

    caplog.set_level(logging.WARNING)
    again = Registry(tmp_path, {})
    again.open_all(tier)
    parts = again.topics["t"].partitions
    assert [p.log.made for p in parts] == [p in (2, 5, 7) for p in range(8)]
    assert again.damaged == {} and caplog.records == []
    assert all(p.config.retention_segments_count == 3 for p in parts)
    # A new topic config reaches every partition, made or not, and reads no partition file that cannot exist.
    assert len(again.reconfigure_topic("t", "retention.segments.count=4\n")) == 8
    assert all(p.config.retention_segments_count == 4 for p in parts) and caplog.records == []
    again.close()


def test_a_file_where_a_partition_directory_would_be_made_is_damage(tmp_path):
    tier = WithCatalog()
    registry = Registry(tmp_path, {})
    registry.create_topic("t", 4, "", tier)
    registry.close()
    (tmp_path / "t" / "1").write_text("in the way")
    again = Registry(tmp_path, {})
    again.open_all(tier)
    assert [str(tp) for tp in again.damaged] == ["t/1"]
    assert [p.log.made for p in again.topics["t"].partitions] == [False, True, False, True]  # 1: reopened empty
    again.close()


def test_without_a_tier_below_every_partition_directory_is_laid_out_at_creation(tmp_path):
    registry = Registry(tmp_path, {})
    topic = registry.create_topic("t", 4, "", LocalOnly())
    assert sorted(os.listdir(tmp_path / "t")) == ["0", "1", "2", "3"]
    assert all(p.log.made for p in topic.partitions)
    registry.close()
