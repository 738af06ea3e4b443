"""Where seq N is: tiered.bounds.locate as a table, and the bounds a served partition reports (visibility follows
durability)."""

from __future__ import annotations

import pytest

from tiered.bounds import Boundary, Eof, Local, PartitionBounds, Remote, locate
from tiered.protocol.codes import UINT64_MAX
from tiered.server.registry import Partition, Registry, Role, Topic
from tiered.server.tier_events import TierEvents
from tiered.server.waiters import Waiters
from tiered.storage.partition_log import PartitionLog
from tiered.storage.topic_config import TopicConfig

from tests.support.storage_helpers import plain_bundle

# first_available, hwmark, local_first, local_last, lower_tier
EMPTY = PartitionBounds(0, 0, 0, 0, True)
LOCAL_ONLY = PartitionBounds(1, 10, 1, 10, False)  # a TANK broker: everything local
TIERED = PartitionBounds(1, 100, 51, 120, True)  # 1..50 in the bucket, 51..120 local, 101..120 not committed yet
BEHIND = PartitionBounds(1, 100, 1, 30, True)  # the disk ends at 30, the catalog at 100
RETAINED = PartitionBounds(40, 100, 51, 100, True)  # remote retention moved the start to 40
NEW_DISK = PartitionBounds(1, 100, 0, 0, True)  # an empty volume: everything from the bucket

TABLE = [
    # (bounds, seq asked, answer)
    (EMPTY, 0, Eof(0, 0)),
    (EMPTY, 1, Eof(0, 0)),
    (EMPTY, UINT64_MAX, Eof(0, 0)),
    (EMPTY, 2, Boundary(0, 0)),
    (LOCAL_ONLY, 0, Local(1)),
    (LOCAL_ONLY, 1, Local(1)),
    (LOCAL_ONLY, 10, Local(10)),
    (LOCAL_ONLY, 11, Eof(1, 10)),
    (LOCAL_ONLY, UINT64_MAX, Eof(1, 10)),
    (LOCAL_ONLY, 12, Boundary(1, 10)),
    (TIERED, 0, Remote(1)),
    (TIERED, 50, Remote(50)),
    (TIERED, 51, Local(51)),
    (TIERED, 100, Local(100)),
    (TIERED, 101, Eof(1, 100)),  # appended but not committed: the tail of a durable topic
    (TIERED, 102, Boundary(1, 100)),
    (BEHIND, 30, Local(30)),
    (BEHIND, 31, Remote(31)),
    (BEHIND, 100, Remote(100)),
    (RETAINED, 39, Boundary(40, 100)),
    (RETAINED, 0, Remote(40)),
    (RETAINED, 40, Remote(40)),
    (NEW_DISK, 0, Remote(1)),
    (NEW_DISK, 77, Remote(77)),
    (NEW_DISK, 101, Eof(1, 100)),
]


@pytest.mark.parametrize("bounds, seq, answer", TABLE)
def test_locate(bounds, seq, answer):
    assert locate(seq, bounds) == answer


def partition(tmp_path, ack: str, lower_tier: bool) -> Partition:
    log = PartitionLog.open(str(tmp_path / ack / str(lower_tier)), TopicConfig())
    part = Partition("t", 0, log, TopicConfig(produce_ack=ack), lower_tier, role=Role.LEADER)
    for value in (b"a", b"b", b"c"):
        log.append(plain_bundle(value))
    return part


def test_a_follower_shows_the_catalogs_bounds_and_only_the_local_records_it_trusts(tmp_path):
    """Led elsewhere: the hwmark is the catalog's (even on a produce.ack=local topic), and local records past what
    this broker committed as leader are not served (the new leader's history replaced them)."""
    for ack in ("durable", "local"):
        part = partition(tmp_path, ack, True)
        part.role, part.committed, part.catalog_first, part.trusted_local = Role.FOLLOWER, 7, 1, 2
        assert part.bounds() == PartitionBounds(1, 7, 1, 2, True)
        assert locate(2, part.bounds()) == Local(2) and locate(3, part.bounds()) == Remote(3)
        part.trusted_local = 0  # never led here: every read goes to the bucket
        assert part.bounds() == PartitionBounds(1, 7, 0, 0, True)
        part.log.close()


def test_a_durable_partition_shows_only_what_is_committed(tmp_path):
    part = partition(tmp_path, "durable", True)
    assert part.durable and part.bounds() == PartitionBounds(1, 0, 1, 3, True)
    part.committed, part.catalog_first = 2, 1
    assert part.bounds() == PartitionBounds(1, 2, 1, 3, True)
    assert locate(3, part.bounds()) == Eof(1, 2)
    part.log.close()


def test_local_acks_and_a_broker_without_a_tier_show_every_append(tmp_path):
    for ack, lower_tier in (("local", True), ("durable", False)):
        part = partition(tmp_path, ack, lower_tier)
        assert not part.durable and part.bounds().hwmark == 3
        part.log.close()


def test_a_reconfigured_partition_is_durable_as_its_new_config_says(tmp_path):
    """`durable` is an attribute its owner keeps current (the produce path reads it, natively too)."""
    part = partition(tmp_path, "local", True)
    part.reconfigure(TopicConfig(produce_ack="durable"))
    assert part.durable and part.bounds().hwmark == 0 and part.log.config.produce_ack == "durable"
    part.reconfigure(TopicConfig(produce_ack="local"))
    assert not part.durable and part.bounds().hwmark == 3
    part.log.close()


def test_the_catalog_lowers_the_first_available_seq_below_the_local_disk(tmp_path):
    part = partition(tmp_path, "durable", True)
    part.log.truncate_after(0)
    part.log.ensure_next_seq(51)
    part.log.append(plain_bundle(b"z"))
    part.committed, part.catalog_first = 51, 1
    assert part.bounds() == PartitionBounds(1, 51, 51, 51, True)
    assert locate(7, part.bounds()) == Remote(7)
    part.log.close()


def test_the_catalog_s_first_available_seq_is_the_partition_s_above_the_local_disk_too(tmp_path):
    """Remote retention shorter than local retention: the disk still holds 1..2, the catalog's history starts at 3.
    Those seqs expired: a boundary fault, never the disk's old bytes; seq 0 reads from the catalog's start."""
    for role in (Role.LEADER, Role.FOLLOWER):
        part = partition(tmp_path / role.value, "durable", True)
        part.role, part.committed, part.trusted_local = role, 3, 3
        part.catalog_first_moved(3)
        assert part.bounds() == PartitionBounds(3, 3, 1, 3, True)
        assert locate(1, part.bounds()) == Boundary(3, 3) and locate(2, part.bounds()) == Boundary(3, 3)
        assert locate(0, part.bounds()) == Local(3)
        part.log.close()


def test_the_disk_decides_where_a_partition_begins_only_while_the_catalog_holds_nothing_of_it(tmp_path):
    part = partition(tmp_path, "local", True)
    assert part.bounds().first_available == 1  # nothing committed yet: the local records are all there is
    assert locate(0, part.bounds()) == Local(1)
    part.log.close()


def test_the_catalog_s_first_available_seq_never_moves_back(tmp_path):
    """A report older than one applied changes nothing: here a leader's retention pass moved the start to 3, then the
    partition is lost and followed with the coordinator's last look at the catalog, from before the pass."""
    part = partition(tmp_path, "durable", True)
    part.committed = 3
    registry = Registry(tmp_path / "data", {})
    registry.topics["t"] = Topic("t", "", part.config, [part])
    events = TierEvents(registry, Waiters())
    events.committed(part.tp, 1, 3, 30)
    events.first_available_moved(part.tp, 3)
    events.follow(part.tp, None, 3, 1)
    events.first_available_moved(part.tp, 2)
    assert part.role is Role.FOLLOWER and part.catalog_first == 3 and part.first_available == 3
    part.log.close()
