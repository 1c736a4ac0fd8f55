"""Optional dependencies are checked before anything starts: with the package made unimportable
(sys.modules[name] = None, as Python treats a module that is not installed), each command that
needs it stops with one line naming the pip extra, exit 2, and creates nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.config.loader import find_recipe
from normlab.launch.extras import installed

DS = ["engine.name=deepspeed", "engine.zero_stage=2"]


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def one_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "pre", *DS],
        ["train", "pre", *DS],
        ["launch", "pre", "--nproc-per-node", "2", *DS],
        ["launch", "pre", "--nproc-per-node", "2", *DS, "--dry-run"],
    ],
    ids=["validate", "train", "launch", "launch-dry-run"],
)
def test_missing_deepspeed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args
) -> None:
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    assert not installed("deepspeed")
    err = one_line(capsys, args)
    assert "engine.name=deepspeed needs DeepSpeed, which is not installed" in err
    assert "pip install 'normlab[distributed]'" in err
    assert not list(tmp_path.iterdir())


def test_missing_transformers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(find_recipe("pre"), [f"run_dir={run}"])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    monkeypatch.setitem(sys.modules, "transformers", None)
    err = one_line(capsys, ["export", str(run), "--out", str(tmp_path / "out")])
    assert "needs HF transformers, which is not installed: pip install 'normlab[hf]'" in err
    assert "--no-hf" in err and not (tmp_path / "out").exists()
