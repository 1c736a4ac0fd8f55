"""A study run again to rewrite its report (every run reused in seconds) keeps what training took:
study.json adds this invocation to the earlier ones of the same study, per run and in all, and
study.md says over how many invocations; another study's file, or a damaged one, starts anew."""

from __future__ import annotations

import json
from pathlib import Path

from normlab.launch.study.report import time_line
from normlab.launch.study.run import with_earlier_time


def timings(seconds: float) -> list[dict]:
    return [{"run_dir": f"/s/runs/r{i}", "seconds": seconds, "signal": 0} for i in range(2)]


def test_a_rewrite_adds_to_the_earlier_invocations(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    first = timings(100.0)
    record = with_earlier_time(path, "lr12", 200.0, first)
    assert record == {"study": "lr12", "total_s": 200.0, "wall_s": 200.0, "invocations": 1}
    assert [t["seconds_total"] for t in first] == [100.0, 100.0]
    path.write_text(json.dumps({**record, "runs": first}))
    again = timings(0.7)
    record = with_earlier_time(path, "lr12", 14.0, again)
    assert (record["wall_s"], record["invocations"], record["total_s"]) == (214.0, 2, 14.0)
    assert [t["seconds_total"] for t in again] == [100.7, 100.7]
    said = time_line(2, record["wall_s"], 2, record["invocations"], 14.0)
    assert said == (
        "2 runs in 214 s (2 at a time), over 2 invocations of the command (the last 14 s)."
    )
    assert time_line(2, 200.0, 2) == "2 runs in 200 s (2 at a time)."


def test_an_older_file_without_the_totals_counts_as_one_invocation(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"study": "lr12", "total_s": 2020.0, "runs": timings(150.0)}))
    now = timings(0.7)
    record = with_earlier_time(path, "lr12", 14.0, now)
    assert (record["wall_s"], record["invocations"]) == (2034.0, 2)
    assert now[0]["seconds_total"] == 150.7


def test_another_study_or_a_damaged_file_starts_anew(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"study": "depth", "total_s": 900.0, "runs": timings(9.0)}))
    assert with_earlier_time(path, "lr12", 5.0, timings(1.0))["wall_s"] == 5.0
    path.write_text("{not json")
    record = with_earlier_time(path, "lr12", 5.0, timings(1.0))
    assert (record["wall_s"], record["invocations"]) == (5.0, 1)
    path.write_text("[1, 2]")
    assert with_earlier_time(path, "lr12", 5.0, timings(1.0))["invocations"] == 1
