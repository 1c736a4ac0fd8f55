"""The recipe is the source of truth on resume with DeepSpeed too (issue 13, item 1): DeepSpeed's
load_checkpoint restores the saved param groups, and after `--force optim.lr=...` the resumed
steps must still run at the new rate (logged from the optimizer's param groups) and the curve
must leave the unchanged run's. One rank, ZeRO stage 2, CPU (gloo)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dist_helpers import check_ok, normlab, prepare_tiny, write_recipe

from launch.config import load_config
from launch.extras import installed
from launch.training.metrics import read_jsonl
from launch.training.schedule import build_schedule

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not installed("deepspeed"), reason="needs the 'distributed' extra"),
]
DS = ("engine.name=deepspeed", "engine.zero_stage=2")


def rows(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}


def test_new_lr_applies_after_force_on_deepspeed(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, prepare_tiny(tmp_path), steps=8, every=4)
    same, changed = tmp_path / "same", tmp_path / "changed"
    check_ok(normlab("train", str(recipe), "--run-dir", str(same), *DS, "training.steps=4"))
    shutil.copytree(same, changed)
    check_ok(normlab("train", str(same), "training.steps=8", "--force"))
    proc = normlab("train", str(changed), "training.steps=8", "optim.lr=1e-3", "--force")
    check_ok(proc)
    assert "lr: 0.003 -> 0.001" in proc.stdout  # what the checkpoint's groups held, replaced

    cfg = load_config(changed / "config.yaml")
    lr_at = build_schedule(cfg.schedule, cfg.training.steps, cfg.model_config().d_model)
    old, new = rows(same), rows(changed)
    for step in range(5, 9):
        assert new[step]["lr"] == pytest.approx(1e-3 * lr_at(step), rel=1e-12)
        assert old[step]["lr"] == pytest.approx(3e-3 * lr_at(step), rel=1e-12)
    assert [old[s]["loss"] for s in range(1, 6)] == [new[s]["loss"] for s in range(1, 6)]
    assert all(old[s]["loss"] != new[s]["loss"] for s in range(6, 9))
