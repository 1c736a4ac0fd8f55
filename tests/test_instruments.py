"""Instruments against hand computations: block RMS, block gradient norms and update ratios,
per-head max logits from an explicit q k^T, QK gains, and no host sync on unlogged steps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from launch.config import load_config
from launch.errors import ConfigError
from launch.instruments import ActivationStats, AttentionLogits, GradientStats, QKGains
from launch.instruments.common import block_key, parse_block_key
from launch.training.metrics import read_jsonl
from launch.training.trainer import Trainer
from model.rope import apply_rope
from tests.conftest import REPO, tiny_overrides
from tests.instrument_helpers import fake_trainer, tiny_model, train_step

TOKENS = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(1))


def rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt())


def test_block_keys_round_trip() -> None:
    assert block_key("resid_rms", 3) == "resid_rms/03"
    assert parse_block_key("max_logit/11/h2") == ("max_logit", 11, "h2")
    assert parse_block_key("grad_norm") is None


@pytest.mark.parametrize("placement", ["pre", "post", "peri"])
def test_activation_rms_equals_manual_forward(placement: str) -> None:
    model = tiny_model(placement=placement)
    tr = fake_trainer(model)
    cb = ActivationStats()
    cb.on_train_start(tr)
    model.eval()  # an evaluation while armed (log_every 1: eval step then log step) is ignored
    with torch.no_grad():
        model(TOKENS.flip(0))
    model.train()
    metrics = train_step(tr, [cb], 1, TOKENS)
    with torch.no_grad():  # the same forward written out: the stream and each branch output
        x = model.embed(TOKENS[:, :-1])
        for i, block in enumerate(model.blocks):
            seen = {}
            for name in ("attn", "mlp"):
                wrapper = getattr(block, name)
                h = wrapper.norm_in(x) if hasattr(wrapper, "norm_in") else x
                seen[name] = wrapper.branch(h)
                x = wrapper(x)
            assert float(metrics[block_key("resid_rms", i)]) == pytest.approx(rms(x), rel=1e-5)
            assert float(metrics[block_key("attn_out_rms", i)]) == pytest.approx(
                rms(seen["attn"]), rel=1e-5
            )
            assert float(metrics[block_key("mlp_out_rms", i)]) == pytest.approx(
                rms(seen["mlp"]), rel=1e-5
            )


def test_activation_hooks_only_on_log_steps() -> None:
    model = tiny_model()
    tr = fake_trainer(model, log_every=3)
    cb = ActivationStats()
    cb.on_train_start(tr)
    hooked = []
    for step in range(1, 7):
        hooked.append(bool(model.blocks[0]._forward_hooks))
        metrics = train_step(tr, [cb], step, TOKENS)
        assert (block_key("resid_rms", 0) in metrics) == (step % 3 == 0)
    assert hooked == [False, False, True, False, False, True]


def test_grad_norms_and_update_ratios_equal_manual() -> None:
    model = tiny_model()
    tr = fake_trainer(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cb = GradientStats()
    cb.on_train_start(tr)
    before = [[p.detach().clone() for p in b.parameters()] for b in model.blocks]
    grads: list[list[torch.Tensor]] = []

    class Grab:
        def on_after_backward(self, trainer, step):  # noqa: ANN001, ANN202
            grads[:] = [[p.grad.clone() for p in b.parameters()] for b in model.blocks]

        def on_step_end(self, trainer, step, metrics):  # noqa: ANN001, ANN202
            pass

    # max_norm 0.01 clips hard: the logged norms are the ones before clipping
    metrics = train_step(tr, [Grab(), cb], 1, TOKENS, opt=opt, max_norm=0.01)
    for i, block in enumerate(model.blocks):
        want = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads[i]))
        assert float(metrics[block_key("grad_norm", i)]) == pytest.approx(want, rel=1e-4)
        du = sum(
            float((p.detach() - b).double().pow(2).sum())
            for p, b in zip(block.parameters(), before[i], strict=True)
        )
        w = sum(float(b.double().pow(2).sum()) for b in before[i])
        assert float(metrics[block_key("update_ratio", i)]) == pytest.approx(
            math.sqrt(du / w), rel=1e-4
        )


def explicit_max_logits(model, tokens: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """(L, H) max of q k^T / sqrt(d) over batch and j <= i, with the full T x T matrix."""
    out = []
    inputs = []
    handles = [
        b.attn.branch.register_forward_hook(lambda m, a, o: inputs.append(a[0]))
        for b in model.blocks
    ]
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    for block, x in zip(model.blocks, inputs, strict=True):
        att = block.attn.branch
        x = x.detach()
        B, T, _ = x.shape
        q = att.q_norm(att.q_proj(x).view(B, T, att.n_heads, att.head_dim)).transpose(1, 2)
        k = att.k_norm(att.k_proj(x).view(B, T, att.n_kv_heads, att.head_dim)).transpose(1, 2)
        cos, sin = att.rope_cos[:T], att.rope_sin[:T]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = k.repeat_interleave(att.n_heads // att.n_kv_heads, dim=1)
        q, k = q.detach(), k.detach()
        s = (q @ k.transpose(-1, -2)) / math.sqrt(att.head_dim)  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        out.append(s.masked_fill(~causal, -math.inf).amax(dim=(0, 2, 3)))
    return torch.stack(out)


@pytest.mark.parametrize("kw", [{}, {"n_kv_heads": 2, "qk_norm": "head"}])
def test_max_logits_equal_explicit_qk(kw: dict) -> None:
    model = tiny_model(**kw)
    with torch.no_grad():  # larger q/k weights make the maxima distinct per head
        for b in model.blocks:
            b.attn.branch.q_proj.weight.mul_(8)
    tr = fake_trainer(model, log_every=2)
    tr.step = 1  # resuming after step 1: step 2 is logged, step 3 is not
    cb = AttentionLogits()
    cb.on_train_start(tr)
    model.eval()
    with torch.no_grad():  # ignored: an evaluation pass while armed
        model(TOKENS[:, :-1] * 2 % 97)
    model.train()
    want = explicit_max_logits(model, TOKENS[:, :-1])
    metrics = train_step(tr, [cb], 2, TOKENS)
    for i in range(want.shape[0]):
        for h in range(want.shape[1]):
            got = float(metrics[block_key("max_logit", i, f"h{h}")])
            assert got == pytest.approx(float(want[i, h]), rel=1e-5)
    assert float(metrics["max_logit"]) == pytest.approx(float(want.max()), rel=1e-5)
    assert "max" in tr.engine.reduced
    assert not model.blocks[0].attn.branch.record_max_logits  # disarmed after the log step


def test_qk_gain_norms() -> None:
    model = tiny_model(qk_norm="flat")
    with torch.no_grad():
        model.blocks[1].attn.branch.k_norm.weight.fill_(3.0)
    tr = fake_trainer(model)
    cb = QKGains()
    cb.on_train_start(tr)
    metrics: dict = {"loss": torch.tensor(1.0), "grad_norm": torch.tensor(1.0)}
    cb.on_step_end(tr, 1, metrics)
    kv_dim = model.blocks[1].attn.branch.k_norm.weight.numel()
    assert float(metrics[block_key("qk_gain", 1, "k")]) == pytest.approx(3.0 * math.sqrt(kv_dim))
    assert float(metrics[block_key("qk_gain", 0, "q")]) == pytest.approx(math.sqrt(32))


SYNCS = ("item", "tolist", "__float__", "__int__", "__bool__", "numpy")


def test_no_host_sync_on_unlogged_steps(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Tensor->host conversion called from normlab's launch/ code is recorded with the step
    being trained; unlogged steps must have none. (Conversions inside torch itself, such as
    AdamW reading its CPU step counter, are not ours and are not counted.)"""
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    every = "activations=true gradients=true attention_logits=true qk_gains=true spike_score=true"
    overrides = tiny_overrides(
        tiny_data,
        tmp_path / "run",
        training__steps=8,
        training__log_every=4,
        training__eval_every=0,
        checkpoint__every=0,
        model__qk_norm="head",
    ) + [f"instruments.{kv}" for kv in every.split()]
    trainer = Trainer(load_config(REPO / "recipes" / "pre.yaml", overrides))
    state: dict = {"step": None, "calls": []}
    launch_dir = str(REPO / "launch")
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _orig=original, _name=name, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            import sys

            if sys._getframe(1).f_code.co_filename.startswith(launch_dir):
                state["calls"].append((state["step"], _name))
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    train_step_orig = trainer._train_step

    def traced(step: int):  # noqa: ANN202
        state["step"] = step
        try:
            return train_step_orig(step)
        finally:
            state["step"] = None

    monkeypatch.setattr(trainer, "_train_step", traced)
    assert trainer.run() == 0
    in_steps = {s for s, _ in state["calls"] if s is not None}
    assert in_steps <= {4, 8}, state["calls"]
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [4, 8]
    assert {"resid_rms/01", "grad_norm/00", "max_logit/01/h1", "qk_gain/00/q"} <= rows[-1].keys()


def test_lse_bound_mode_brackets_the_exact_max_logits() -> None:
    model = tiny_model()
    with torch.no_grad():
        for b in model.blocks:
            b.attn.branch.q_proj.weight.mul_(8)
    tr = fake_trainer(model, log_every=2)
    tr.step = 1
    cb = AttentionLogits({"mode": "lse_bound"})
    cb.on_train_start(tr)
    want = explicit_max_logits(model, TOKENS[:, :-1])
    metrics = train_step(tr, [cb], 2, TOKENS)
    seq = TOKENS.shape[1] - 1
    for i in range(want.shape[0]):
        for h in range(want.shape[1]):
            lower = float(metrics[block_key("max_logit_lower", i, f"h{h}")])
            upper = float(metrics[block_key("max_logit_upper", i, f"h{h}")])
            assert lower - 1e-4 <= float(want[i, h]) <= upper + 1e-4
            assert upper - lower <= math.log(seq) + 1e-4
    assert "max_logit" not in metrics  # the bound is never reported as the exact value
    assert not model.blocks[0].attn.branch.record_lse_bound  # disarmed after the log step
    with pytest.raises(ConfigError, match="mode must be one of"):
        AttentionLogits({"mode": "approx"})
