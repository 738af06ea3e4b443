"""The partitions the compactor's periodic pass looks at (Registry.compacted): those whose config compacts them,
kept by every write of a partition's config, so that an idle broker's pass costs what is compacted, not how many
partitions exist."""

from __future__ import annotations

from tiered.metrics import Metrics
from tiered.server import compaction
from tiered.server.compaction import Compactor
from tiered.server.registry import Registry, Role
from tiered.tier_interface import LocalOnly
from tiered.topic_partition import TopicPartition

CLEANUP = "log.cleanup.policy=cleanup\n"
DELETE = "log.cleanup.policy=delete\n"


def compacted(registry: Registry) -> set[TopicPartition]:
    return {part.tp for part in registry.compacted()}


def test_the_compacted_partitions_follow_every_config_write(tmp_path):
    tier = LocalOnly()
    registry = Registry(tmp_path, {})
    registry.create_topic("plain", 3, DELETE, tier)
    registry.create_topic("kept", 2, CLEANUP, tier)
    kept = {TopicPartition("kept", 0), TopicPartition("kept", 1)}
    assert compacted(registry) == kept

    # `tiered topic config`: every partition of the topic, one way and back.
    registry.reconfigure_topic("plain", CLEANUP)
    assert compacted(registry) == kept | {TopicPartition("plain", p) for p in range(3)}
    registry.reconfigure_topic("plain", DELETE)
    assert compacted(registry) == kept

    # A partition's own config (TANK's ReloadConf) over its topic's.
    (tmp_path / "plain" / "1" / "config").write_text(CLEANUP)
    part = registry.get("plain", 1)
    assert part is not None
    registry.configure(part, registry.topic_config(DELETE, {"log.cleanup.policy": "cleanup"}))
    assert compacted(registry) == kept | {part.tp}
    registry.close()

    # Opened again from the disk: the partition's file still compacts it, under a topic that does not.
    again = Registry(tmp_path, {})
    again.open_all(tier)
    assert compacted(again) == kept | {part.tp}
    again.close()


async def test_the_pass_looks_at_compacted_partitions_led_here_only(tmp_path, monkeypatch):
    """Of 102 partitions, the trigger is evaluated for the one both compacted and led here."""
    tier = LocalOnly()
    registry = Registry(tmp_path, {})
    registry.create_topic("plain", 100, DELETE, tier)
    registry.create_topic("kept", 2, CLEANUP, tier)
    compactor = Compactor(registry, Metrics(), tier)  # type: ignore[arg-type]
    for part in registry.all_partitions():
        part.role = Role.LEADER
    followed = registry.get("kept", 1)
    assert followed is not None
    followed.role = Role.FOLLOWER
    evaluated: list[TopicPartition] = []
    monkeypatch.setattr(compaction, "_due_safely", lambda part: evaluated.append(part.tp) or False)
    assert await compactor._due() == []
    assert evaluated == [TopicPartition("kept", 0)]
    registry.close()
