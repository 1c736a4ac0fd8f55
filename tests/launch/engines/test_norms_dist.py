"""The norm-side stabilizers on the sharded engines (gloo, CPU): a LayerScale + DyT model on 2
ranks follows the single-process loss curve within 1e-5 (fp32) on FSDP2 and ZeRO-3, and the
norm_stabilizers instrument logs the same |λ| and α as one process. Their sharded init equals
one process's: tests/launch/engines/test_scale.py (dist_worker_init.norm_side_configs)."""

from __future__ import annotations

import json
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
HALF = "data.batch_size=2"  # per rank: 2 ranks x 2 = the single run's batch of 4
NORM_SIDE = [
    "model.norm=dyt",
    "model.residual_scale=layerscale",
    "model.qk_norm=head",
    "model.n_kv_heads=2",
    "instruments.norm_stabilizers=true",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("norms")
    data = prepare_tiny(root)
    out = {"root": root, "r8": write_recipe(root, data, 8, 4), "ref": root / "ref"}
    check_ok(normlab("train", str(out["r8"]), *NORM_SIDE, "--run-dir", str(out["ref"])))
    return out


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _stats(run: Path) -> dict[tuple[int, str], float]:
    """(step, key) -> value of the norm_stabilizers statistics."""
    kinds = ("saturation/", "residual_scale/", "pointwise_alpha/")
    return {(r["step"], k): v for r in _rows(run) for k, v in r.items() if k.startswith(kinds)}


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param(("engine.name=fsdp",), id="fsdp"),
        # the norms under ZeRO-3: `-m slow` (the norms are the same modules; CI runs ZeRO-3 in
        # test_distributed.py and the stabilizers' two-rank test)
        pytest.param(
            ("engine.name=deepspeed", "engine.zero_stage=3"), id="zero3", marks=pytest.mark.slow
        ),
    ],
)
def test_two_ranks_follow_one_process(tiny: dict[str, Path], engine: tuple[str, ...]) -> None:
    run = tiny["root"] / f"two_{engine[-1]}"
    check_ok(launch(tiny["r8"], run, 2, *engine, *NORM_SIDE, HALF))
    assert_same_curve(run, losses(tiny["ref"]))
    ref, got = _stats(tiny["ref"]), _stats(run)
    assert got.keys() == ref.keys() and any(k == "saturation/final" for _, k in got)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, abs=1e-5), key
