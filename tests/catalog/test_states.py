"""The transition tables: every legal move allowed, every other one refused (pure, no database)."""

from __future__ import annotations

import itertools

import pytest

from tiered.catalog import BlockState, IllegalTransition, SegmentState
from tiered.catalog.states import BLOCK_TRANSITIONS, SEGMENT_TRANSITIONS

B, S = BlockState, SegmentState

LEGAL = {
    "block": {
        (B.PENDING, B.COMMITTED),
        (B.PENDING, B.DELETING),
        (B.COMMITTED, B.DELETING),
    },
    "remote segment": {
        (S.COPY_STARTED, S.COPY_STARTED),
        (S.COPY_STARTED, S.COPY_FINISHED),
        (S.COPY_STARTED, S.DELETE_STARTED),
        (S.COPY_FINISHED, S.DELETE_STARTED),
        (S.DELETE_STARTED, S.DELETE_FINISHED),
        (S.DELETE_FINISHED, S.COPY_STARTED),  # a new copy of a cleaned-up copy's base (segment_copy_started)
    },
}


@pytest.mark.parametrize("table, states", [(BLOCK_TRANSITIONS, B), (SEGMENT_TRANSITIONS, S)], ids=["block", "segment"])
def test_exactly_the_listed_moves_are_legal(table, states):
    for current, target in itertools.product(states, repeat=2):
        if (current, target) in LEGAL[table.kind]:
            table.check(current, target)
        else:
            with pytest.raises(IllegalTransition) as caught:
                table.check(current, target, "x")
            assert (caught.value.current, caught.value.target, caught.value.kind) == (current, target, table.kind)


def test_nothing_leaves_the_final_states_but_a_new_copy():
    assert BLOCK_TRANSITIONS.allowed[B.DELETING] == frozenset()
    assert SEGMENT_TRANSITIONS.allowed[S.DELETE_FINISHED] == frozenset({S.COPY_STARTED})


def test_sources_for_bulk_updates():
    assert BLOCK_TRANSITIONS.sources(B.DELETING) == ["committed", "pending"]
    assert BLOCK_TRANSITIONS.sources(B.COMMITTED) == ["pending"]
    assert BLOCK_TRANSITIONS.sources(B.PENDING) == []
    assert SEGMENT_TRANSITIONS.sources(S.DELETE_STARTED) == ["COPY_FINISHED", "COPY_STARTED"]


def test_unknown_state_is_illegal():
    with pytest.raises(IllegalTransition):
        BLOCK_TRANSITIONS.check("lost", B.COMMITTED)
