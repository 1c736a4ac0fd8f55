"""A CompleteP run (m_N 2, m_L 2, per-class groups) resumes exactly from its checkpoint: the
groups' lr, weight decay and eps come back and the curve after resuming equals the one-go run."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.dist_helpers import (
    assert_same_curve,
    check_ok,
    losses,
    normlab,
    prepare_tiny,
    write_recipe,
)

COMPLETEP = (
    "model.parametrization=completep",
    "model.base_d_model=32",
    "model.base_n_layers=1",
    "optim.qk_clip.tau=5.0",  # QK-Clip on the scaled logits, too
)


def test_completep_resumes_exactly(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, prepare_tiny(tmp_path), steps=6, every=3)
    whole = tmp_path / "whole"
    check_ok(normlab("train", str(recipe), *COMPLETEP, "--run-dir", str(whole)))
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_00000006")
    (resumed / "checkpoints" / "latest").write_text("step_00000003\n")
    proc = normlab("train", str(recipe), *COMPLETEP, "--run-dir", str(resumed), "--force")
    check_ok(proc)
    assert "from step_00000003" in proc.stdout
    assert_same_curve(resumed, losses(whole), tol=0.0 + 1e-12)
