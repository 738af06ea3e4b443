"""What a data directory remembers about itself: its disk id and the epochs whose plans it carried out."""

from __future__ import annotations

import json

import pytest

from tiered.storage.local_state import LocalState


def test_the_disk_id_is_made_once_and_kept(tmp_path):
    first = LocalState(tmp_path / ".tiered")
    assert len(first.disk_id) == 32
    assert LocalState(tmp_path / ".tiered").disk_id == first.disk_id
    assert LocalState(tmp_path / "other").disk_id != first.disk_id  # a new volume is another disk


def test_applied_epochs_survive_a_restart_and_only_grow_by_record(tmp_path):
    state = LocalState(tmp_path)
    assert state.applied_epoch("t", 0) is None
    state.record_applied({("t", 0): 3, ("t", 1): 5})
    state.record_applied({("t", 0): 4})
    again = LocalState(tmp_path)
    assert (again.applied_epoch("t", 0), again.applied_epoch("t", 1), again.applied_epoch("u", 0)) == (4, 5, None)
    again.forget_topic("t")
    assert LocalState(tmp_path).applied_epoch("t", 1) is None
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, renamed into place


def test_a_damaged_epochs_file_is_refused_with_what_to_do(tmp_path):
    LocalState(tmp_path).record_applied({("t", 0): 1})
    (tmp_path / "epochs.json").write_text("{not json")
    with pytest.raises(ValueError, match="remove it"):
        LocalState(tmp_path)
    (tmp_path / "epochs.json").write_text(json.dumps({"t/0": 2}))
    assert LocalState(tmp_path).applied_epoch("t", 0) == 2
