"""The start-up and takeover plan (tiered.tiering.cluster.startup.plan_partition): pure, as a table of cases."""

from __future__ import annotations

import pytest

from tiered.catalog.partitions import Claim, EpochRow, PartitionState
from tiered.tier_interface import LocalPartition
from tiered.tiering.cluster.startup import plan_partition

ME, OTHER = 1, 2
MY_DISK, OTHER_DISK = "disk-a", "disk-b"


def claim(*, leader, epoch, hwmark, history=(), first=1) -> Claim:
    """The claim of epoch `epoch + 1` by broker ME from disk MY_DISK, the partition being at `epoch` before."""
    before = PartitionState("t", 0, leader, epoch, first if hwmark else 0, hwmark, 0)
    new = EpochRow(epoch + 1, ME, MY_DISK, hwmark + 1)
    return Claim(before, epoch + 1, (*history, new))


def disk(last_held: int, applied: int | None, first: int = 1) -> LocalPartition:
    return LocalPartition("t", 0, first if last_held else 0, last_held, applied)


CASES = {
    # a restart: this disk led at epoch 3 and nobody since; 101..105 were appended, not uploaded
    "restart keeps and uploads the tail": (
        disk(105, 3), claim(leader=ME, epoch=3, hwmark=100), (None, 101, 100)),
    "restart with nothing past the catalog": (
        disk(100, 3), claim(leader=ME, epoch=3, hwmark=100), (None, 101, None)),
    # the disk was lost: an empty volume continues from the catalog
    "empty volume": (
        None, claim(leader=ME, epoch=3, hwmark=700), (None, 701, None)),
    "empty data dir, same broker": (
        disk(0, None), claim(leader=ME, epoch=3, hwmark=700), (None, 701, None)),
    # fail-back: another volume led epochs 4 (from 101) and committed 101..110; this disk holds divergent 101..105
    "fail-back drops what the other leader replaced": (
        disk(105, 3), claim(leader=OTHER, epoch=4, hwmark=110,
                            history=(EpochRow(4, OTHER, OTHER_DISK, 101),)), (100, 111, None)),
    # the same, but the other volume ran under this broker id (a pod on a new volume, then the old one back)
    "fail-back under the same broker id": (
        disk(105, 3), claim(leader=ME, epoch=4, hwmark=110,
                            history=(EpochRow(4, ME, OTHER_DISK, 101),)), (100, 111, None)),
    # a claim of this disk that crashed before it was applied committed nothing: still this disk's history
    "an unapplied claim of this disk": (
        disk(105, 3), claim(leader=ME, epoch=4, hwmark=100,
                            history=(EpochRow(4, ME, MY_DISK, 101),)), (None, 101, 100)),
    # ... but not when another volume led after it
    "an unapplied claim, then another volume": (
        disk(105, 3), claim(leader=OTHER, epoch=5, hwmark=120, history=(
            EpochRow(4, ME, MY_DISK, 101), EpochRow(5, OTHER, OTHER_DISK, 101))), (100, 121, None)),
    # a disk behind the catalog after another leader: nothing of it needs dropping
    "behind after another leader": (
        disk(90, 3), claim(leader=OTHER, epoch=4, hwmark=110,
                           history=(EpochRow(4, OTHER, OTHER_DISK, 101),)), (None, 111, None)),
    # no epoch applied on this disk (an older broker's disk, or a TANK data dir)
    "no epoch, nobody else led": (
        disk(105, None), claim(leader=None, epoch=0, hwmark=0), (None, 1, 0)),
    "no epoch, this broker led": (
        disk(105, None), claim(leader=ME, epoch=7, hwmark=100), (None, 101, 100)),
    "no epoch, another broker led": (
        disk(105, None), claim(leader=OTHER, epoch=7, hwmark=100), (0, 101, None)),
    # the catalog was rebuilt from the bucket: its epochs start over below the one this disk applied
    "rebuilt catalog": (
        disk(105, 9), claim(leader=None, epoch=0, hwmark=100), (None, 101, 100)),
}


@pytest.mark.parametrize("name", CASES)
def test_plan(name):
    local, the_claim, (truncate_after, next_seq, reupload_after) = CASES[name]
    plan = plan_partition(local, the_claim, broker_id=ME, disk_id=MY_DISK)
    assert (plan.truncate_after, plan.next_seq, plan.reupload_after) == (truncate_after, next_seq, reupload_after)
    assert plan.epoch == the_claim.epoch and plan.committed == the_claim.before.hwmark_seq
    assert plan.reason
