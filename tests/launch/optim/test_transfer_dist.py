"""µP/CompleteP groups on FSDP2 and DeepSpeed ZeRO-3 (2 ranks, gloo): the sharded run
reproduces the single-process curve at a non-base shape (m_N = 2, m_L = 2), so the per-class lr,
weight decay and eps survive sharding (names and shapes, ZeRO-3's ds_shape, are kept)."""

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


ENGINES = {
    "fsdp": ("engine.name=fsdp",),
    # ZeRO-3 partitions parameters at build: the classes are read from ds_shape
    "zero3": ("engine.name=deepspeed", "engine.zero_stage=3"),
}


@pytest.mark.parametrize(
    "engine", [pytest.param("fsdp", marks=pytest.mark.slow), "zero3"]
)  # CI: ZeRO-3 (DeepSpeed builds its own param groups); `-m slow`: FSDP2 (torch's optimizer)
def test_two_ranks_reproduce_single_completep_curve(tmp_path: Path, engine: str) -> None:
    recipe = write_recipe(tmp_path, prepare_tiny(tmp_path), steps=6, every=6)
    single, sharded = tmp_path / "single", tmp_path / engine
    check_ok(normlab("train", str(recipe), *COMPLETEP, "--run-dir", str(single)))
    check_ok(launch(recipe, sharded, 2, *COMPLETEP, *ENGINES[engine], "data.batch_size=2"))
    assert_same_curve(sharded, losses(single))
