"""fp16 on FSDP2 (issue 11, item 1): shards compute in fp16 (MixedPrecisionPolicy) with fp32
master weights and fp32 gradient reduction, and torch's ShardedGradScaler skips an update whose
gradients hold inf on any rank's shard. The fp16 clamps then act on fp16 values: an overflowing
MLP branch gives finite logits with the clamp counted in its block; a 2-rank fp16 run trains like
the fp32 run, with its scaler state in the checkpoint."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch
from normlab.launch.config import load_config
from normlab.launch.instruments import ClampHooks
from normlab.launch.optim import build_optimizer
from normlab.launch.registry import ENGINES, resolve

from tests.dist_helpers import check_ok, launch, losses, normlab, prepare_tiny, write_recipe

pytestmark = pytest.mark.distributed
TOKENS = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fp16")
    return write_recipe(root, prepare_tiny(root), 8, 4)


def fp16_engine(recipe: Path):  # noqa: ANN201
    cfg = load_config(recipe, ["engine.name=fsdp", "precision.dtype=fp16"])
    engine = resolve(ENGINES, "fsdp").for_run(cfg)
    engine.setup(cfg.model_config(), partial(build_optimizer, cfg=cfg.optim))
    return engine


def local(engine) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return {n: p.to_local().detach().clone() for n, p in engine.model.named_parameters()}


def test_overflowing_branch_is_clamped_and_counted(recipe: Path) -> None:
    engine = fp16_engine(recipe)
    try:
        mlp = engine.model.blocks[1].mlp.branch
        with torch.no_grad():  # block 1's MLP output passes 65504 in fp16
            mlp.gate_proj.weight.mul_(100)
            mlp.up_proj.weight.mul_(100)
            mlp.down_proj.weight.mul_(3000)
        with torch.no_grad():
            logits = engine.model(TOKENS[:, :-1])
        assert logits.dtype == torch.float16 and not torch.isfinite(logits).all()  # unclamped
        hooks = ClampHooks(engine.model)
        with torch.no_grad():
            logits = engine.model(TOKENS[:, :-1])
        assert torch.isfinite(logits).all()
        counts = hooks.counts.tolist()
        assert counts[1] >= 1 and counts[0] == 0.0  # counted in the block that overflowed
        hooks.remove()
    finally:
        engine.shutdown()


def test_scaler_skips_an_update_with_inf_gradients(recipe: Path) -> None:
    """An inf in one gradient shard: weights and Adam state untouched, the scale halves (as
    torch.amp.GradScaler does on one process); the next finite step updates."""
    engine = fp16_engine(recipe)
    try:
        scale = engine._scaler.get_scale()
        before = local(engine)
        engine.zero_grad()
        engine.forward_backward(TOKENS[:, :-1], TOKENS[:, 1:])
        next(iter(engine.model.parameters())).grad.to_local().view(-1)[0] = math.inf
        norm, skipped = engine.clip_and_step(1.0)
        assert not skipped and not math.isfinite(float(norm))  # the scaler's skip, not a veto
        assert all(torch.equal(before[k], v) for k, v in local(engine).items())
        assert engine._scaler.get_scale() == scale / 2 and not engine.optimizer.state
        engine.zero_grad()
        engine.forward_backward(TOKENS[:, :-1], TOKENS[:, 1:])
        norm, _ = engine.clip_and_step(1.0)
        assert math.isfinite(float(norm)) and engine._scaler.get_scale() == scale / 2
        assert not torch.equal(before["head.weight"], local(engine)["head.weight"])
    finally:
        engine.shutdown()


def test_two_ranks_fp16_train_like_fp32(recipe: Path, tmp_path: Path) -> None:
    """8 steps of 2-rank fp16 against one fp32 process: fp16 rounding only (~1e-3 of the loss),
    no scaler skip (grad norms finite), 0 clamps, the scaler's state saved with the run."""
    ref, run = tmp_path / "fp32", tmp_path / "fp16"
    check_ok(normlab("train", str(recipe), "--run-dir", str(ref)))
    check_ok(
        launch(recipe, run, 2, "engine.name=fsdp", "precision.dtype=fp16", "data.batch_size=2")
    )
    want, got = losses(ref), losses(run)
    assert sorted(got) == sorted(want)
    assert max(abs(got[s] - want[s]) for s in want) < 2e-2
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    assert all(math.isfinite(r["grad_norm"]) for r in train)
    assert train[-1]["fp16_clamps"] == 0.0
    meta = json.loads((run / "checkpoints" / "step_00000008" / "engine.json").read_text())
    assert meta["scaler"]["scale"] == 65536.0 and meta["scaler"]["_growth_tracker"] == 8
