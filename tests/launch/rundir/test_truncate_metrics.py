"""Resuming truncates metrics.jsonl through the one metrics reader (rundir/runfiles.py): rows after
the checkpoint's step and a last line cut short are dropped, every other line is kept byte for
byte (non-finite values written as 'nan' strings included), and damage anywhere else (a row that
is not JSON, a step that is not an integer >= 0, bytes that are not UTF-8) is refused naming the
line, with the file left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from normlab.launch.rundir.metrics import truncate_jsonl
from normlab.launch.rundir.runfiles import DamagedFile

ROWS = [
    '{"step": 0, "loss": 9.1}',
    '{"step": 10, "loss": "nan", "lr": 0.001}',
    '{"step": 10, "eval_loss": 8.5}',
    '{"step": 20, "loss": 7.9}',
    '{"step": 30, "loss": 7.1}',
]


def test_rows_after_the_step_and_a_cut_line_go_the_rest_stays_as_written(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(ROWS) + '\n{"step": 40, "lo')
    truncate_jsonl(path, 20)
    assert path.read_text() == "\n".join(ROWS[:4]) + "\n"
    truncate_jsonl(path, 10)
    assert path.read_text() == "\n".join(ROWS[:3]) + "\n"


def test_only_a_cut_line_leaves_an_empty_file_and_no_file_stays_none(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "lo')
    truncate_jsonl(path, 0)
    assert path.read_text() == ""
    truncate_jsonl(tmp_path / "absent.jsonl", 5)
    assert not (tmp_path / "absent.jsonl").exists()


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (b"not json at all", "line 2 is not JSON"),
        (b'{"step": -4, "loss": 1.0}', "line 2 has step -4"),
        (b'{"step": 2.5, "loss": 1.0}', "line 2 has step 2.5"),
        (b'{"step": 3, "step": 4}', "line 2 gives key 'step' twice"),
        (b'{"step": 3, "loss": -1.0}', "expected a loss >= 0"),
        (b"\xff\xfe\xfd", "not UTF-8 text on line 2"),
    ],
)
def test_damage_before_the_end_is_refused_and_nothing_is_rewritten(
    tmp_path: Path, bad: bytes, what: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    data = ROWS[0].encode() + b"\n" + bad + b"\n" + "\n".join(ROWS[1:]).encode() + b"\n"
    path.write_bytes(data)
    with pytest.raises(DamagedFile) as err:
        truncate_jsonl(path, 10)
    assert what in str(err.value) and "\n" not in str(err.value)
    assert path.read_bytes() == data
