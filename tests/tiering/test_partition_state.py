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


DAY = TopicConfig(remote_retention_secs=86400)
SMALL = TopicConfig(remote_retention_bytes=1000)


def test_remote_retention_topics_follow_every_write_of_a_role_or_a_config():
    """The topics remote retention asks the catalog about are those with a partition led here that keeps one, after
    each write: a claim, a config changed, a partition lost or fenced (a table of writes and what follows each)."""
    state = TierState()
    steps = [
        (lambda: state.lead(A, 1, TopicConfig(), 0), []),  # no retention: not asked about
        (lambda: state.lead(B, 1, DAY, 0), [("t", 86400, 0)]),
        (lambda: state.reconfigured(A, DAY), [("t", 86400, 0)]),  # two partitions, one topic and limit
        (lambda: state.lead(C, 2, SMALL, 0), [("t", 86400, 0), ("u", 0, 1000)]),
        (lambda: state.lose(B), [("t", 86400, 0), ("u", 0, 1000)]),  # A still keeps it
        (lambda: state.fence(A), [("u", 0, 1000)]),
        (lambda: state.reconfigured(A, SMALL), [("u", 0, 1000)]),  # fenced: not led, not asked about
        (lambda: state.lead(A, 3, SMALL, 0), [("t", 0, 1000), ("u", 0, 1000)]),
        (lambda: state.reconfigured(C, TopicConfig()), [("t", 0, 1000)]),
        (lambda: state.lead(A, 4, SMALL, 0), [("t", 0, 1000)]),  # claimed again: counted once
        (lambda: state.lose(A), []),
        (lambda: state.lose(A), []),
    ]
    for step, (write, topics) in enumerate(steps):
        write()
        assert state.remote_retention_topics() == topics, step
