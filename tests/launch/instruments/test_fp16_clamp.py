"""fp16 clamping (SCIENCE.md 9): a deep Pre-LN model whose residual stream passes 65504 gives
inf/NaN in fp16 without the hooks and finite outputs with them, and the counter counts; T5's clamp
value; automatic installation in fp16 only, with a switch to force either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from normlab.launch.config import load_config
from normlab.launch.errors import ConfigError
from normlab.launch.instruments import ClampHooks, FP16Clamp, clamp_fp16
from normlab.launch.instruments.common import FP16_CLAMPS, block_key
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.trainer import Trainer

from tests.conftest import REPO, tiny_overrides
from tests.instrument_helpers import fake_trainer, tiny_model

FP16_MAX = 65504.0


def test_clamp_value_follows_t5() -> None:
    x = torch.tensor([1.0, -70000.0, 65504.0, 3.0]).half()  # -70000 rounds to -inf in fp16
    y, fired = clamp_fp16(x)
    assert bool(fired) and y.dtype == torch.float16
    assert y.tolist() == [1.0, -64512.0, 64512.0, 3.0]  # finfo.max - 1000 -> 64512 in fp16
    z, fired = clamp_fp16(torch.tensor([65504.0, -65504.0, 2.0]).half())
    assert not bool(fired) and z.tolist() == [65504.0, -65504.0, 2.0]  # no inf: unchanged
    nan, _ = clamp_fp16(torch.tensor([float("nan"), 1.0]).half())
    assert torch.isnan(nan[0])  # a NaN already made cannot be repaired


def overflowing_pre_ln() -> tuple[torch.nn.Module, torch.Tensor]:
    """12 Pre-LN blocks whose MLPs add ~20,000 per block: the stream passes 65504 at block 8."""
    model = tiny_model(n_layers=12, d_model=64, n_heads=4, d_ff=128, placement="pre")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in model.blocks:
            mlp = block.mlp.branch
            for w in (mlp.gate_proj.weight, mlp.up_proj.weight):
                w.copy_(torch.randn(w.shape, generator=g))
            mlp.down_proj.weight.copy_(14 * torch.randn(mlp.down_proj.weight.shape, generator=g))
    return model, torch.randint(0, 97, (2, 12), generator=g)


def stream_max(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[list[float], torch.Tensor]:
    seen: list[float] = []
    handles = [
        b.register_forward_hook(lambda m, a, o: seen.append(float(o.float().abs().max())))
        for b in model.blocks
    ]
    with torch.no_grad():
        logits = model(tokens)
    for h in handles:
        h.remove()
    return seen, logits


def test_deep_pre_ln_overflow_in_fp16_is_clamped_and_counted() -> None:
    model, tokens = overflowing_pre_ln()
    ref, ref_logits = stream_max(model, tokens)
    assert max(ref) > 75000 and torch.isfinite(ref_logits).all()  # fp32: large but finite
    first_over = next(i for i, v in enumerate(ref) if v > FP16_MAX)
    model = model.half()
    raw, logits = stream_max(model, tokens)
    assert raw[first_over] == float("inf")
    assert not torch.isfinite(logits).all()  # no hooks: inf, then NaN downstream
    hooks = ClampHooks(model)
    clamped, logits = stream_max(model, tokens)
    assert torch.isfinite(logits).all()
    assert max(clamped) == 64512.0
    counts = hooks.counts.tolist()
    assert counts[:first_over] == [0.0] * first_over and all(c >= 1 for c in counts[first_over:-1])
    stream_max(model, tokens)
    assert hooks.counts.tolist() == [2 * c for c in counts]  # counts accumulate per forward
    hooks.remove()
    assert not torch.isfinite(stream_max(model, tokens)[1]).all()


@pytest.mark.parametrize(
    ("mode", "dtype", "half_params", "active"),
    [
        ("auto", "fp16", False, True),
        ("auto", "fp32", True, True),
        ("auto", "fp32", False, False),
        ("auto", "bf16", False, False),
        ("on", "fp32", False, True),
        ("off", "fp16", False, False),
    ],
)
def test_installed_automatically_in_fp16_only(
    mode: str, dtype: str, half_params: bool, active: bool
) -> None:
    model = tiny_model()
    if half_params:
        model = model.half()
    cb = FP16Clamp({"mode": mode})
    assert cb.active_for(fake_trainer(model, dtype=dtype)) == active


def test_callback_logs_counts_and_keeps_them_across_resume() -> None:
    model, tokens = overflowing_pre_ln()
    model = model.half()
    tr = fake_trainer(model, log_every=2, dtype="fp16")
    tr.console = type("C", (), {"print": lambda self, *a, **k: None})()
    cb = FP16Clamp()
    cb.on_train_start(tr)
    with torch.no_grad():
        model(tokens)
    metrics: dict = {}
    cb.on_step_end(tr, 2, metrics)
    total = float(metrics[FP16_CLAMPS])
    assert total >= 5 and float(metrics[block_key(FP16_CLAMPS, 0)]) == 0.0
    resumed = FP16Clamp()
    resumed.load_state_dict(cb.state_dict())
    cb.on_train_end(tr, "completed")
    resumed.on_train_start(tr)
    resumed.on_step_end(tr, 4, metrics)
    assert float(metrics[FP16_CLAMPS]) == total


def test_bad_mode_is_config_error() -> None:
    with pytest.raises(ConfigError, match="fp16_clamp.mode"):
        FP16Clamp({"mode": "sometimes"})


def test_fp16_training_run_installs_and_logs(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    cfg = load_config(
        REPO / "recipes" / "pre.yaml",
        tiny_overrides(tiny_data, run, training__steps=4, precision__dtype="fp16"),
    )
    assert cfg.instruments["fp16_clamp"] == {"mode": "auto"}  # the default every recipe gets
    assert Trainer(cfg).run() == 0
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert rows[-1][FP16_CLAMPS] == 0.0 and block_key(FP16_CLAMPS, 1) in rows[-1]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    fp32 = tmp_path / "fp32"
    cfg32 = load_config(REPO / "recipes" / "pre.yaml", tiny_overrides(tiny_data, fp32))
    assert Trainer(cfg32).run() == 0
    assert FP16_CLAMPS not in read_jsonl(fp32 / "metrics.jsonl")[0]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_each_overflow_counts_once_with_activation_checkpointing(checkpointing: bool) -> None:
    """The backward's recomputation of a checkpointed block re-fires its hooks up to the last
    tensor it saved (7 instead of 4 in block 1 before the fix); the counts after forward +
    backward equal those of the forward alone, with and without checkpointing (and the
    recomputed forward is still clamped: no NaN gradient)."""
    from normlab.launch.engines.recompute import apply_activation_checkpointing

    model, tokens = overflowing_pre_ln()
    with torch.no_grad():  # block 1 also overflows inside its MLP, in tensors saved for backward
        model.blocks[1].mlp.branch.up_proj.weight.mul_(3000)
    model = model.half()
    forward_only = ClampHooks(model)
    with torch.no_grad():
        model(tokens)
    expected = forward_only.counts.tolist()
    forward_only.remove()
    assert expected[1] >= 3  # up_proj, the product into down_proj, the branch output...
    if checkpointing:
        apply_activation_checkpointing(model)
    hooks = ClampHooks(model)
    model(tokens).float().logsumexp(-1).mean().backward()
    assert hooks.counts.tolist() == expected
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(not torch.isnan(g).any() for g in grads)
