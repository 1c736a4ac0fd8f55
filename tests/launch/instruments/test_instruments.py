"""Instruments against hand computations: block RMS, block gradient norms and update ratios,
per-head max logits from an explicit q k^T, QK gains, and no host sync on unlogged steps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from normlab.launch.config import load_config
from normlab.launch.errors import ConfigError
from normlab.launch.instruments import ActivationStats, AttentionLogits, GradientStats, QKGains
from normlab.launch.instruments.common import block_key, parse_block_key
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.trainer import Trainer
from normlab.model.rope import apply_rope

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


def hooked(att) -> bool:  # noqa: ANN001
    """Whether anything hooks the attention's max-logit points (its q/k tap, its core)."""
    tap, core = att.qk_tap, att.core
    return bool(tap._forward_hooks or core._forward_pre_hooks or core._forward_hooks)


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
    assert not any(hooked(b.attn.branch) for b in model.blocks)  # disarmed after the log step


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


SYNCS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__", "numpy")
EVERY_OBSERVER = [
    "activations",
    "gradients",
    "attention_logits",
    "qk_gains",
    "spike_score",
    "update_spikes",
]


def host_syncs(
    run_dir: Path, overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> list[tuple[int | None, str, str]]:
    """Run a training and record every Tensor->host conversion called from normlab's launch/
    code as (step being trained or None, conversion, calling file). Conversions inside torch
    itself, such as AdamW reading its CPU step counter, are not ours and are not counted."""
    trainer = Trainer(load_config(REPO / "recipes" / "pre.yaml", overrides))
    state: dict = {"step": None, "calls": []}
    launch_dir = str(REPO / "launch")
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _orig=original, _name=name, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            import sys

            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(launch_dir):
                state["calls"].append((state["step"], _name, Path(caller).name))
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
    return state["calls"]


def _sync_overrides(data: Path, run: Path, **kw: object) -> list[str]:
    return tiny_overrides(
        data,
        run,
        training__steps=8,
        training__log_every=4,
        training__eval_every=0,
        checkpoint__every=0,
        model__qk_norm="head",
        **kw,
    ) + [f"instruments.{name}=true" for name in EVERY_OBSERVER]


def test_no_host_sync_on_unlogged_steps(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every observer on: unlogged steps make no device->host copy from launch/ code."""
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    calls = host_syncs(tmp_path / "run", _sync_overrides(tiny_data, tmp_path / "run"), monkeypatch)
    in_steps = {s for s, _, _ in calls if s is not None}
    assert in_steps <= {4, 8}, calls
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [4, 8]
    assert {"resid_rms/01", "grad_norm/00", "max_logit/01/h1", "qk_gain/00/q"} <= rows[-1].keys()


def test_only_the_spike_policy_syncs_on_unlogged_steps(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every observer, the spike policy, z-loss and fp16 autocast with its clamps on: an unlogged
    step makes exactly one host copy, the policy's (loss and gradient norm, for its decision)."""
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    overrides = _sync_overrides(
        tiny_data, tmp_path / "run", optim__z_loss=1e-4, precision__dtype="fp16"
    ) + ["instruments.spike_policy=true"]
    calls = host_syncs(tmp_path / "run", overrides, monkeypatch)
    for step in (1, 2, 3, 5, 6, 7):
        assert [(n, f) for s, n, f in calls if s == step] == [("tolist", "policy.py")], calls
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert {"z_loss", "fp16_clamps", "skipped_steps", "scaler_skips"} <= rows[-1].keys()


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
    assert not any(hooked(b.attn.branch) for b in model.blocks)  # disarmed after the log step
    with pytest.raises(ConfigError, match="mode must be one of"):
        AttentionLogits({"mode": "approx"})


@pytest.mark.parametrize("placement", ["post", "deepnorm", "mix"])
def test_pre_norm_rms_of_post_blocks_equals_manual_sum(placement: str) -> None:
    """A post-norm block's output is normalised (RMS ~1); the logged pre_norm_rms/i is the sum
    alpha * x + F(x) entering the MLP sub-layer's closing norm, written out by hand here."""
    model = tiny_model(placement=placement, n_layers=4, mix_ratio=0.5)
    tr = fake_trainer(model)
    cb = ActivationStats()
    cb.on_train_start(tr)
    metrics = train_step(tr, [cb], 1, TOKENS)
    post_blocks = {"post": 4, "deepnorm": 4, "mix": 2}[placement]
    alpha = (2 * 4) ** 0.25 if placement == "deepnorm" else 1.0
    with torch.no_grad():
        x = model.embed(TOKENS[:, :-1])
        for i, block in enumerate(model.blocks):
            x = block.attn(x)
            h = alpha * x + block.mlp.branch(x)
            x = block.mlp(x)
            key = block_key("pre_norm_rms", i)
            if i < post_blocks:
                assert float(metrics[key]) == pytest.approx(rms(h), rel=1e-5)
                assert float(metrics[block_key("resid_rms", i)]) == pytest.approx(rms(x), rel=1e-5)
            else:
                assert key not in metrics  # a Pre-LN block's output is the stream itself
    if placement == "deepnorm":  # alpha x + F(x) before the norm: ~alpha = 1.68 here, not 1
        assert float(metrics[block_key("pre_norm_rms", 3)]) > 1.5 * rms(x)


LSE_CASES = [{}, {"n_kv_heads": 2}, {"dropout": 0.1}]


@pytest.mark.parametrize("kw", LSE_CASES)
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_lse_bound_mode_leaves_training_bit_identical(kw: dict, dtype: torch.dtype | None) -> None:
    """On a log step the lse_bound mode runs the kernel SDPA would have chosen (or SDPA itself
    where that kernel keeps no lse): outputs and gradients equal the plain path bit for bit."""
    results = []
    for record in (False, True):
        model = tiny_model(**kw)
        tr, cb = fake_trainer(model), AttentionLogits({"mode": "lse_bound"})
        if record:
            cb.on_train_start(tr)  # step 1 is a log step: the hooks ask every core for bounds
            assert all(hooked(b.attn.branch) for b in model.blocks)
        torch.manual_seed(3)  # the same dropout masks
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(TOKENS[:, :-1])
        out.float().square().mean().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
        if record:
            metrics: dict = {}
            cb.on_step_end(tr, 1, metrics)
            for h in range(model.config.n_heads):
                lower = metrics[block_key("max_logit_lower", 0, f"h{h}")]
                assert bool(lower <= metrics[block_key("max_logit_upper", 0, f"h{h}")])
    (out_a, grads_a), (out_b, grads_b) = results
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
