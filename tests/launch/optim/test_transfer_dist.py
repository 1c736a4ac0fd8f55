"""µP/CompleteP groups on the FSDP2 engine (2 ranks, gloo): the sharded run reproduces the
single-process curve at a non-base shape (m_N = 2, m_L = 2), so the per-class lr, weight decay
and eps survive sharding (DTensor parameters keep their names and shapes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dist_helpers import (
    assert_same_curve,
    check_ok,
    launch,
    losses,
    normlab,
    prepare_tiny,
    write_recipe,
)

pytestmark = pytest.mark.distributed
COMPLETEP = (
    "model.parametrization=completep",
    "model.base_d_model=32",
    "model.base_n_layers=1",
    "model.output_mult=2.0",
)


def test_fsdp_two_ranks_reproduce_single_completep_curve(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, prepare_tiny(tmp_path), steps=6, every=6)
    single, fsdp = tmp_path / "single", tmp_path / "fsdp"
    check_ok(normlab("train", str(recipe), *COMPLETEP, "--run-dir", str(single)))
    check_ok(launch(recipe, fsdp, 2, *COMPLETEP, "engine.name=fsdp", "data.batch_size=2"))
    assert_same_curve(fsdp, losses(single))
