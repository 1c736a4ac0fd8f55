"""The recipe is the source of truth on resume with DeepSpeed too (issue 13, item 1): DeepSpeed's
load_checkpoint restores the saved param groups, and after `--force optim.lr=...` the resumed
steps must still run at the new rate (logged from the optimizer's param groups) and the curve
must leave the unchanged run's (which ZeRO on one rank matches to 1e-5, as in test_distributed).
One rank, ZeRO stage 2, CPU (gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_helpers import LOSS_TOL, check_ok, normlab, prepare_tiny, write_recipe

from launch.extras import installed
from launch.training.metrics import read_jsonl

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.skipif(not installed("deepspeed"), reason="needs the 'distributed' extra"),
]
DS = ("engine.name=deepspeed", "engine.zero_stage=2")


def rows(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}


def test_new_lr_applies_after_force_on_deepspeed(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, prepare_tiny(tmp_path), steps=8, every=4)
    const = "schedule.kind=constant"  # the same multiplier whatever training.steps says
    reference = tmp_path / "single"  # the unchanged recipe, 8 steps straight (one process)
    check_ok(normlab("train", str(recipe), "--run-dir", str(reference), const))
    run = tmp_path / "zero2"
    check_ok(normlab("train", str(recipe), "--run-dir", str(run), *DS, const, "training.steps=4"))
    proc = normlab("train", str(run), "training.steps=8", "optim.lr=1e-3", "--force")
    check_ok(proc)
    assert "lr: 0.003 -> 0.001" in proc.stdout  # what the checkpoint's groups held, replaced

    old, new = rows(reference), rows(run)
    assert [new[s]["lr"] for s in range(5, 9)] == [1e-3] * 4  # read off the param groups
    assert [old[s]["lr"] for s in range(5, 9)] == [3e-3] * 4
    assert all(abs(old[s]["loss"] - new[s]["loss"]) < LOSS_TOL for s in range(1, 6))
    assert all(abs(old[s]["loss"] - new[s]["loss"]) > 100 * LOSS_TOL for s in range(6, 9))
