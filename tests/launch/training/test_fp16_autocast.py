"""fp16 clamps where autocast produces fp16 (issue 11): the linear layers and branch outputs. An
overflowing MLP branch gives non-finite logits under fp16 autocast without the clamps and finite
logits with them, counted in its block; a SwiGLU product that overflows is clamped before
`down_proj`; evaluation passes are clamped but not counted; a run that never overflows is
bit-identical with the clamps on and off; loss-scaler skips are counted apart from non-finite
losses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from normlab.launch.config import load_config
from normlab.launch.instruments import ClampHooks, SpikeScore
from normlab.launch.instruments.common import FP16_CLAMPS, NONFINITE, SCALER_SKIPS
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.trainer import Trainer

from tests.conftest import REPO, tiny_overrides
from tests.instrument_helpers import fake_trainer, tiny_model

TOKENS = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))


def overflowing_mlp(product: bool = False) -> torch.nn.Module:
    """Block 1's MLP branch outputs ~176,000 (fp32), past fp16's 65504; with `product` instead its
    SwiGLU product silu(gate) * up passes 65504 while each factor stays finite in fp16."""
    model = tiny_model(n_layers=4, d_model=64, n_heads=4, d_ff=128, placement="pre")
    mlp = model.blocks[1].mlp.branch
    with torch.no_grad():
        if product:
            mlp.gate_proj.weight.mul_(1000)
            mlp.up_proj.weight.mul_(1000)
        else:
            mlp.gate_proj.weight.mul_(100)
            mlp.up_proj.weight.mul_(100)
            mlp.down_proj.weight.mul_(3000)
    return model


def autocast_forward(model: torch.nn.Module) -> tuple[torch.Tensor, list[float]]:
    """fp16-autocast logits and the max |.| of each MLP branch output."""
    seen: list[float] = []
    handles = [
        b.mlp.branch.register_forward_hook(lambda m, a, o: seen.append(float(o.abs().max())))
        for b in model.blocks
    ]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        logits = model(TOKENS)
    for h in handles:
        h.remove()
    return logits, seen


def mlp_output_max_fp32(model: torch.nn.Module, product: bool) -> float:
    seen: list[float] = []
    target = model.blocks[1].mlp.branch
    module = target if not product else target.down_proj
    hook = (
        module.register_forward_hook(lambda m, a, o: seen.append(float(o.abs().max())))
        if not product
        else module.register_forward_pre_hook(lambda m, a: seen.append(float(a[0].abs().max())))
    )
    with torch.no_grad():
        model(TOKENS)
    hook.remove()
    return seen[0]


@pytest.mark.parametrize("product", [False, True])
def test_overflow_under_autocast_is_clamped_and_counted(product: bool) -> None:
    model = overflowing_mlp(product)
    assert mlp_output_max_fp32(model, product) > 1e5  # past fp16 in full precision
    logits, _ = autocast_forward(model)
    assert logits.dtype == torch.float16 and not torch.isfinite(logits).all()  # the defect
    hooks = ClampHooks(model)
    logits, branch_max = autocast_forward(model)
    assert torch.isfinite(logits).all()
    if not product:
        assert branch_max[1] == 64512.0  # T5's clamp value: finfo.max - 1000 after an inf
    counts = hooks.counts.tolist()
    assert counts[1] >= 1 and counts[0] == counts[2] == counts[3] == counts[4] == 0.0
    model.eval()  # evaluation passes are clamped as well, but not counted
    logits, _ = autocast_forward(model)
    assert torch.isfinite(logits).all() and hooks.counts.tolist() == counts
    hooks.remove()


def test_clamp_hooks_cover_linears_branches_and_head() -> None:
    model = tiny_model(n_layers=2)
    hooks = ClampHooks(model)
    hooked = {name for name, m in model.named_modules() if m._forward_hooks}
    linears = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linears <= hooked and "head" in hooked
    assert {"blocks.0.mlp.branch", "blocks.1.attn.branch", "blocks.0.attn", "blocks.1"} <= hooked
    pre_hooked = {name for name, m in model.named_modules() if m._forward_pre_hooks}
    assert pre_hooked == linears  # the inputs of every linear layer (the SwiGLU product)
    hooks.remove()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _fp16_run(data: Path, run: Path, mode: str, **kw: object) -> list[dict]:
    overrides = tiny_overrides(
        data, run, precision__dtype="fp16", checkpoint__every=0, training__steps=6, **kw
    ) + [f"instruments.fp16_clamp.mode={mode}"]
    assert Trainer(load_config(REPO / "recipes" / "pre.yaml", overrides)).run() == 0
    return [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]


def test_run_without_overflow_is_bit_identical_with_clamps_on_and_off(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    on = _fp16_run(tiny_data, tmp_path / "on", "on")
    off = _fp16_run(tiny_data, tmp_path / "off", "off")
    assert [r["loss"] for r in on] == [r["loss"] for r in off]
    assert [r["grad_norm"] for r in on] == [r["grad_norm"] for r in off]
    assert on[-1][FP16_CLAMPS] == 0.0 and FP16_CLAMPS not in off[-1]
    a = torch.load(tmp_path / "on" / "checkpoints" / "step_00000006" / "model.pt")
    b = torch.load(tmp_path / "off" / "checkpoints" / "step_00000006" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_scaler_skips_are_counted_apart_from_non_finite_losses() -> None:
    tr = fake_trainer(tiny_model(), log_every=4, steps=4, dtype="fp16")
    cb = SpikeScore({"window": 2})
    cb.on_train_start(tr)
    rows = [(3.0, 1.0), (3.0, math.inf), (math.nan, math.nan), (3.0, math.nan)]
    metrics: dict = {}
    for step, (loss, grad) in enumerate(rows, start=1):
        metrics = {"loss": torch.tensor(loss), "grad_norm": torch.tensor(grad)}
        cb.on_step_end(tr, step, metrics)
    assert metrics[SCALER_SKIPS] == 2.0 and metrics[NONFINITE] == 1.0
    tr32 = fake_trainer(tiny_model(), log_every=4, steps=4, dtype="fp32")
    cb32 = SpikeScore({"window": 2})
    cb32.on_train_start(tr32)
    for step, (loss, grad) in enumerate(rows, start=1):
        metrics = {"loss": torch.tensor(loss), "grad_norm": torch.tensor(grad)}
        cb32.on_step_end(tr32, step, metrics)
    assert metrics[SCALER_SKIPS] == 0.0 and metrics[NONFINITE] == 3.0


def test_fp16_run_counts_loss_scaler_skips(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An initial loss scale of 2^40 overflows the fp16 gradients: the scaler skips and halves
    until the scale fits; those steps are scaler skips, not non-finite steps."""
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    rows = _fp16_run(tiny_data, tmp_path / "run", "auto", precision__loss_scale_init=float(2**40))
    skips = sum(not math.isfinite(float(r["grad_norm"])) for r in rows)  # "inf" in JSONL
    assert skips >= 1 and rows[-1][SCALER_SKIPS] == skips and rows[-1][NONFINITE] == 0.0
