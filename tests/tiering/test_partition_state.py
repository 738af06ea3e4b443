"""The tier state's partitions led here (tiered.tiering.partition_state): what `led_epochs` answers follows every
write that changes a role, and the epoch each partition is led under."""

from __future__ import annotations

from tiered.storage.topic_config import TopicConfig
from tiered.tiering.partition_state import TierState
from tiered.topic_partition import TopicPartition

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


def test_led_epochs_follow_lead_lose_and_fence():
    state = TierState()
    for tp, epoch in ((A, 3), (B, 5), (C, 1)):
        state.lead(tp, epoch, TopicConfig(), 0)
    assert state.led_epochs() == {A: 3, B: 5, C: 1}
    state.lead(A, 4, TopicConfig(), 9)  # claimed again: led under the new epoch
    state.lose(B)
    assert state.fence(C, 1)
    epochs = state.led_epochs()
    assert epochs == {A: 4} and epochs == {tp: s.epoch for tp, s in state.led()}
    epochs[B] = 7  # a copy: the caller's changes are its own
    assert state.led_epochs() == {A: 4} and state.epoch_of(B) is None
    assert not state.fence(A, 3)  # a write under an older epoch than the one led changes nothing
    assert state.led_epochs() == {A: 4}
