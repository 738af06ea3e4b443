"""Start-up and takeover: what a broker does with its local records of a partition it is about to lead.

`plan_partition` is pure: from what the disk holds, the claim (the catalog's state just before it and the leadership
history since the epoch this disk last applied) and this disk's id, it decides. The server carries the plan out
(truncate, continue from the catalog's high-water mark, record the epoch as applied) and the tier then uploads the
records past the high-water mark, if the plan keeps them, before they become visible.

The rule (docs/architecture.md, data path step 9; the durability promise):
- The disk's records up to the end of the last epoch it applied agree with the catalog: that epoch's leader was
  this disk, and it committed records in append order.
- If every claim since that epoch was this disk's own (a restart, or a claim that crashed before it was applied,
  which committed nothing), the disk is still the partition's history: its records past the catalog's high-water
  mark were appended but not uploaded (acknowledged locally, or not at all) and are uploaded now.
- Otherwise another volume led in between: the catalog's history after the end of this disk's epoch is that other
  leader's, and this disk's records past it were never committed. They are dropped, and the partition continues
  from the catalog's high-water mark; older seqs the disk lacks are read from the bucket.
- A disk that never applied an epoch (data from before epochs were recorded, a TANK data directory, or a catalog
  rebuilt from the bucket since) is the history if the catalog names no other leader; else its records past the
  catalog's start are not trusted: dropped.
"""

from __future__ import annotations

from tiered.catalog.partitions import Claim
from tiered.tier_interface import LocalPartition, PartitionPlan


def plan_partition(local: LocalPartition | None, claim: Claim, *, broker_id: int, disk_id: str,
                   highest_copied_seq: int = 0) -> PartitionPlan:
    before = claim.before
    hwmark = before.hwmark_seq
    held = local.last_held if local is not None else 0
    prior = local.applied_epoch if local is not None else None
    if prior is not None and prior > before.leader_epoch:
        prior = None  # the catalog's epochs went back (it was rebuilt from the bucket): the disk's epoch says nothing
    since = [e for e in claim.history if e.leader_epoch != claim.epoch]  # claims after `prior`, before this one

    if prior is None:
        ours = held == 0 or before.leader_broker in (None, broker_id)
        keep = hwmark if ours else 0
        why = "no epoch applied on this disk; " + ("the catalog names no other leader" if ours
                                                   else f"broker {before.leader_broker} led it")
    else:
        foreign = [e for e in since if e.disk_id != disk_id]
        ours = not foreign
        keep = since[0].start_seq - 1 if since else hwmark
        why = (f"epoch {prior} was this disk's, and no other volume led since" if ours else
               f"broker {foreign[0].broker_id} (another volume) led from epoch {foreign[0].leader_epoch}")

    truncate_after = None
    reupload_after = None
    if ours:
        if held > hwmark:
            reupload_after = hwmark
            why += f"; uploading {hwmark + 1}..{held} before serving it"
    elif held > keep:
        truncate_after = keep
        why += f"; dropping local records {keep + 1}..{held}, which the catalog never committed"
    if held < hwmark:
        why += f"; the disk ends at {held}, the catalog at {hwmark}: continuing from the catalog"
    return PartitionPlan(
        topic=before.topic,
        partition=before.partition,
        epoch=claim.epoch,
        committed=hwmark,
        first_available=before.first_available_seq,
        highest_copied_seq=highest_copied_seq,
        truncate_after=truncate_after,
        next_seq=hwmark + 1,
        reupload_after=reupload_after,
        reason=why,
    )
