"""A study.json with the study's name but values of the wrong type (a hand edit, another tool, a
damaged write) is unreadable: the study's time counts from here, with one warning line naming
the file and the keys, never a TypeError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from normlab.launch.study.run import with_earlier_time

RUNS = [{"run_dir": "/s/runs/r0", "seconds": 100.0, "seconds_total": 100.0}]


def _timings() -> list[dict]:
    return [{"run_dir": "/s/runs/r0", "seconds": 2.5, "signal": 0}]


@pytest.mark.parametrize(
    ("record", "keys"),
    [
        ({"wall_s": "200", "invocations": 1, "runs": RUNS}, "wall_s"),
        ({"total_s": [1], "runs": RUNS}, "total_s"),
        ({"wall_s": 200.0, "invocations": "two", "runs": RUNS}, "invocations"),
        ({"wall_s": 200.0, "invocations": True, "runs": RUNS}, "invocations"),
        ({"wall_s": 200.0, "runs": 5}, "runs"),
        ({"wall_s": 200.0, "runs": [{"run_dir": ["x"], "seconds": 1.0}]}, "runs"),
        ({"wall_s": 200.0, "runs": [{"run_dir": "/s/runs/r0", "seconds_total": "9"}]}, "runs"),
        ({"wall_s": None, "invocations": 1.5, "runs": [3]}, "wall_s, invocations, runs"),
    ],
)
def test_wrong_types_count_from_here_with_a_warning(
    tmp_path: Path, record: dict, keys: str
) -> None:
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"study": "lr12", **record}))
    lines: list[str] = []
    now = _timings()
    got = with_earlier_time(path, "lr12", 14.0, now, lines.append)
    assert got == {"study": "lr12", "total_s": 14.0, "wall_s": 14.0, "invocations": 1}
    assert now[0]["seconds_total"] == 2.5  # nothing earlier added
    assert lines == [
        f"study: {path} is unreadable ({keys} of the wrong type); the study's time counts from here"
    ]


def test_a_good_file_adds_up_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"study": "lr12", "wall_s": 200.0, "invocations": 1, "runs": RUNS}))
    lines: list[str] = []
    now = _timings()
    got = with_earlier_time(path, "lr12", 14.0, now, lines.append)
    assert (got["wall_s"], got["invocations"], now[0]["seconds_total"]) == (214.0, 2, 102.5)
    assert lines == []


def test_not_json_warns_and_another_study_does_not(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text("{not json")
    lines: list[str] = []
    assert with_earlier_time(path, "lr12", 5.0, _timings(), lines.append)["invocations"] == 1
    assert len(lines) == 1 and lines[0].startswith(f"study: {path} is unreadable (")
    path.write_text(json.dumps({"study": "depth", "wall_s": "x"}))
    assert with_earlier_time(path, "lr12", 5.0, _timings(), lines.append)["wall_s"] == 5.0
    assert len(lines) == 1
