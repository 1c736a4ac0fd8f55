"""config.yaml stores absolute data and run paths (launch/config/paths.py): a run started from one
working directory with relative paths resumes and exports from another."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.config.paths import with_absolute_paths

from tests.conftest import tiny_overrides


def test_with_absolute_paths_resolves_only_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = {
        "run_dir": "runs/x",
        "data": {"dataset": "bundled", "sources": [{"name": "a", "path": "d/a", "weight": 1}]},
        "engine": {"deepspeed_config": None},
    }
    got = with_absolute_paths(data)
    assert got["run_dir"] == str(tmp_path / "runs" / "x") and got["data"]["dataset"] == "bundled"
    assert got["data"]["sources"][0]["path"] == str(tmp_path / "d" / "a")
    assert got["engine"]["deepspeed_config"] is None and data["run_dir"] == "runs/x"
    assert with_absolute_paths({"data": {"dataset": "~/x"}})["data"]["dataset"] == str(
        Path.home() / "x"
    )


def test_run_from_a_resumes_and_exports_from_b(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "data").symlink_to(tiny_data)
    monkeypatch.chdir(a)
    over = tiny_overrides(
        Path("data"), Path("runs") / "x", training__steps=4, checkpoint__every=2,
        training__eval_every=0,
    )  # fmt: skip
    over += ["instruments={}"]
    assert main(["train", "pre", *over]) == 0
    run = a / "runs" / "x"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["dataset"] == str(a / "data") and saved["run_dir"] == str(run)
    # as if the run had stopped after its step-2 checkpoint; resume it from another directory
    shutil.rmtree(run / "checkpoints" / "step_00000004")
    (run / "summary.json").unlink()
    monkeypatch.chdir(b)
    capsys.readouterr()
    assert main(["train", str(run), "--from", "step_00000002"]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "step_00000002" in out, out
    assert (run / "checkpoints" / "step_00000004").is_dir()
    assert main(["export", str(run), "--out", "exported", "--no-hf"]) == 0
    assert (b / "exported" / "tokenizer.model").is_file()
    native = yaml.safe_load((b / "exported" / "normlab" / "config.yaml").read_text())
    assert native["data"]["dataset"] == str(a / "data")
