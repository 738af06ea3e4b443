"""A tier state (tiered.tiering.partition_state) with partitions led here, for tests that build the tier's parts."""

from __future__ import annotations

from tiered.storage.topic_config import TopicConfig
from tiered.tiering.partition_state import TierState
from tiered.topic_partition import TopicPartition


def led_state(epochs: dict[tuple[str, int], int], *, committed_seq: int = 0,
              config: TopicConfig | None = None) -> TierState:
    state = TierState()
    for (topic, partition), epoch in epochs.items():
        state.lead(TopicPartition(topic, partition), epoch, config or TopicConfig(), committed_seq)
    return state


def configure(state: TierState, led: list[tuple[TopicPartition, TopicConfig]]) -> None:
    """Each led partition's config, as a claim or `tiered topic config` hands it to the tier state."""
    for tp, config in led:
        state.reconfigured(tp, config)
