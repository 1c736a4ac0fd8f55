"""`normlab quickstart` trains each named recipe and prints one summary row per recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.cli import main
from tests.conftest import tiny_overrides


def test_quickstart_trains_each_recipe_and_prints_a_table(
    tiny_data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "160")
    over = [o for o in tiny_overrides(tiny_data, tmp_path) if not o.startswith("run_dir=")]
    out = tmp_path / "qs"
    argv = ["quickstart", "--recipes", "post_nowarmup,peri", "--steps", "4", "--out", str(out)]
    assert main([*argv, *over]) == 0
    text = capsys.readouterr().out
    for name in ("post_nowarmup", "peri"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 4
        row = next(line for line in text.splitlines() if name in line and "completed" in line)
        assert f"{summary['final_loss']:.4f}" in row and f"{summary['eval_loss']:.4f}" in row
    assert "normlab quickstart" in text
