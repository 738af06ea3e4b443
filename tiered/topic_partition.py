"""The name of one partition of a topic: what travels wherever a partition is meant (a NamedTuple, so that it is
also the `(topic, partition)` tuple older signatures use, and hashes like it)."""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"
