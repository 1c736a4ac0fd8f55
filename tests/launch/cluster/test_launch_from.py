"""`normlab launch --from STEP` (the resume a damaged-checkpoint message offers for a multi-process
run): the checkpoint is looked up once before torchrun starts, and forwarded to every rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.commands.train import resolve
from normlab.launch.rundir.directory import write_config

ARGS = ["launch", "pre", "--nproc-per-node", "2", "engine.name=fsdp", "--from", "4", "--dry-run"]


def test_launch_checks_and_forwards_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(ARGS) == 2
    err = capsys.readouterr().err
    assert "no checkpoint '4' in runs/pre/checkpoints (found: none)" in err and err.count("\n") == 1
    (tmp_path / "runs" / "pre" / "checkpoints" / "step_00000004").mkdir(parents=True)
    cfg = resolve("pre", ["engine.name=fsdp"])  # a run directory is refused without its config
    write_config(Path(cfg.run_dir or "runs/pre"), cfg, replaced=False)
    assert main(ARGS) == 0
    assert capsys.readouterr().out.strip().endswith("--run-dir runs/pre --from 4")
