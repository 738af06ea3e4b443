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
    LocalState(tmp_path)  # folds the log into the snapshot
    (tmp_path / "epochs.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"epochs.json is damaged .*: remove epochs.json and epochs.log to treat"):
        LocalState(tmp_path)
    (tmp_path / "epochs.json").write_text(json.dumps({"t/0": 2}))
    assert LocalState(tmp_path).applied_epoch("t", 0) == 2


def test_a_record_appends_to_the_log_and_a_restart_folds_it_into_the_snapshot(tmp_path):
    state = LocalState(tmp_path)
    state.record_applied({("t", 0): 3, ("t", 1): 5})
    state.record_applied({("t", 0): 4, ("u", 7): 1})
    assert not (tmp_path / "epochs.json").exists()  # nothing rewritten per record: two appends
    assert (tmp_path / "epochs.log").read_text().splitlines() == ["set t 0 3", "set t 1 5", "set t 0 4", "set u 7 1"]
    again = LocalState(tmp_path)
    assert json.loads((tmp_path / "epochs.json").read_text()) == {"t/0": 4, "t/1": 5, "u/7": 1}
    assert (tmp_path / "epochs.log").read_text() == ""
    again.forget_topic("t")
    assert (tmp_path / "epochs.log").read_text() == "forget t\n"
    assert [LocalState(tmp_path).applied_epoch(*key) for key in (("t", 0), ("u", 7))] == [None, 1]


def test_the_log_is_folded_once_it_outgrows_the_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr("tiered.storage.local_state.FOLD_AT_LEAST", 4)
    state = LocalState(tmp_path)
    state.record_applied({("t", p): 1 for p in range(3)})
    assert len((tmp_path / "epochs.log").read_text().splitlines()) == 3
    state.record_applied({("t", 0): 2, ("t", 1): 2})  # 5 lines would be more than max(4, 3 partitions): folded
    assert json.loads((tmp_path / "epochs.json").read_text()) == {"t/0": 2, "t/1": 2, "t/2": 1}
    assert (tmp_path / "epochs.log").read_text() == ""
    assert LocalState(tmp_path).applied_epoch("t", 1) == 2


def test_a_log_replayed_over_a_snapshot_that_holds_it_changes_nothing(tmp_path):
    """A crash between writing the new snapshot and emptying the log."""
    (tmp_path / "epochs.json").write_text(json.dumps({"t/0": 4, "u/0": 2}))
    (tmp_path / "epochs.log").write_text("set t 0 3\nset v 0 9\nforget v\nset t 0 4\nset u 0 2\n")
    state = LocalState(tmp_path)
    assert [state.applied_epoch(*key) for key in (("t", 0), ("u", 0), ("v", 0))] == [4, 2, None]


def test_a_last_line_cut_short_by_a_crash_is_the_record_not_completed(tmp_path):
    state = LocalState(tmp_path)
    state.record_applied({("t", 0): 3})
    with open(tmp_path / "epochs.log", "a") as f:
        f.write("set t 0 1")  # "set t 0 12\n", cut short
    again = LocalState(tmp_path)
    assert again.applied_epoch("t", 0) == 3
    again.record_applied({("t", 1): 1})  # appended after the fold emptied the log, never glued to the fragment
    assert LocalState(tmp_path).applied_epoch("t", 1) == 1


def test_a_damaged_log_line_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "epochs.log").write_text("set t 0 3\nset t zero 4\n")
    with pytest.raises(ValueError, match=r"epochs.log is damaged \(line 2: 'set t zero 4'\): remove epochs.json and"):
        LocalState(tmp_path)
