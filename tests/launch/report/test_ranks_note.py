"""A run resumed on another number of ranks says so in `compare` (issue 30, item 8): the
stretches [[first step, ranks], ...] kept in the checkpoint's stats and summary.json, extended on
each resume that changes the number, and the engine column's note. (End to end on 2/1/4 gloo
ranks: tests/launch/rundir/test_world_resize.py.)"""

from __future__ import annotations

from normlab.launch.report.table import ranks_note
from normlab.launch.training.build_run import ranks_history


def test_history_grows_only_when_the_number_of_ranks_changes() -> None:
    now = {"world_size": 2}
    assert ranks_history(None, None, 0, now) == ([[0, 2]], None)
    same, notice = ranks_history([[0, 2]], 2, 4, now)
    assert same == [[0, 2]] and notice is None
    grown, notice = ranks_history([[0, 4]], 4, 6, now)
    assert grown == [[0, 4], [6, 2]]
    assert notice == "resumed on 2 rank(s) from step 6 (written on 4)"
    # a checkpoint from before the history was kept: its own world size starts it
    older, notice = ranks_history(None, 1, 8, now)
    assert older == [[0, 1], [8, 2]] and notice is not None


def test_note_in_the_engine_column() -> None:
    assert ranks_note(None) == "" and ranks_note([[0, 2]]) == ""
    assert ranks_note([[0, 2], [4, 1]]) == ", ranks 2 -> 1 at step 4"
    assert ranks_note([[0, 2], [4, 1], [9, 4]]) == ", ranks 2 -> 1 at step 4, 4 at step 9"
    assert ranks_note([["x", 2], [4]]) == ""  # a damaged summary: no note
