"""normlab theory: Xiong et al.'s predictions at initialisation, checked as numbers.

The MLP gain against its hand formula (Monte Carlo), the block walk against the model's own forward
(hooks), Lemma 2's bounds and Theorem 1's depth ratios on small models, and the command's files and
bad-input exits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from normlab.launch.cli import main
from normlab.launch.theory.checks import FAILED, HELD, UNDECIDED, bootstrap, checks
from normlab.launch.theory.measure import (
    TheorySetup,
    down_proj_grads,
    ffn_gain,
    lemma2_prediction,
    measure,
    stream_energy,
)
from normlab.model import ModelConfig, Transformer
from normlab.model.init import init_weights
from normlab.model.mlp import build_mlp

SMALL = TheorySetup(d_model=64, seeds=4, depths=(2, 8), profile_depth=4, lemma_depth=6)


@pytest.mark.parametrize("mult", [1, 4])
def test_mlp_gain_matches_the_hand_formula(mult: int) -> None:
    """E||ReLU(x W1) W2||^2 / ||x||^2 = 2r / (1 + r)^2 under Xavier-normal weights."""
    torch.manual_seed(0)
    d = 256
    cfg = ModelConfig(d_model=d, d_ff=mult * d, mlp="relu", init="xavier", n_heads=4)
    energies = []
    for seed in range(8):  # weights are drawn per (seed, parameter name): a new seed each time
        mlp = build_mlp(cfg)
        holder = torch.nn.Module()
        holder.mlp = mlp
        init_weights(holder, cfg, seed)
        x = torch.randn(512, d)
        x = x / x.norm(dim=-1, keepdim=True) * math.sqrt(d)
        with torch.no_grad():
            energies.append(float(mlp(x).pow(2).sum(-1).mean()) / d)
    assert np.mean(energies) == pytest.approx(ffn_gain(mult), rel=0.05)
    assert ffn_gain(1) == 0.5 and ffn_gain(4) == pytest.approx(0.32)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_block_walk_matches_the_model(placement: str) -> None:
    """stream_energy's hand-written walk reads the same sums as hooks on the real forward."""
    model = Transformer(SMALL.model_config(placement, 3))
    tokens = torch.randint(0, SMALL.vocab_size, (2, 17))
    seen: list[float] = []

    def on_mlp(wrapper: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
        s = args[0] + wrapper.branch(args[0]) if placement == "post" else out
        seen.append(float(s.pow(2).sum(-1).mean()) / SMALL.d_model)

    for block in model.blocks:
        block.mlp.register_forward_hook(on_mlp)
    with torch.no_grad():
        model(tokens[:, :-1])
    assert stream_energy(model, tokens) == pytest.approx(seen, rel=1e-5)


def test_lemma2_bounds_hold_at_init() -> None:
    res = measure(SMALL)
    post, pre = res.lemma2["post"].mean(0), res.lemma2["pre"].mean(0)
    assert post == pytest.approx(np.full_like(post, 1.5), rel=0.10)  # (3/2) d at every layer
    for layer, value in enumerate(pre, start=1):
        lo, hi = lemma2_prediction("pre", layer, 1)
        assert (lo, hi) == (1 + layer / 2, 1 + 3 * layer / 2)
        assert lo <= value <= hi
    assert pre[-1] > 2.5 * pre[0]  # linear growth over 6 layers, Post-LN flat
    # Theorem 1: Post-LN independent of L; Pre-LN down by about sqrt(8/2) = 2 from L = 2 to 8.
    post_ratio = res.theorem1["post"].mean(0)[1] / res.theorem1["post"].mean(0)[0]
    pre_ratio = res.theorem1["pre"].mean(0)[1] / res.theorem1["pre"].mean(0)[0]
    assert post_ratio == pytest.approx(1.0, abs=0.2)
    assert pre_ratio == pytest.approx(0.5, rel=0.2)
    # 4 seeds of d 64 may leave an interval across a boundary, but never on the wrong side
    verdict = {c.claim.split(":")[0]: c.verdict for c in checks(res)}
    for name in ("Lemma 2, Post-LN", "Lemma 2, Pre-LN", "Theorem 1, Post-LN", "Theorem 1, Pre-LN"):
        assert verdict[name] in (HELD, UNDECIDED), (name, verdict[name])


def test_bootstrap_interval_of_a_mean_matches_the_normal_formula() -> None:
    """For the mean of n seeds the percentile interval is about mean +- 1.96 sd_pop / sqrt(n)."""
    values = np.random.default_rng(0).normal(1.0, 0.2, size=(400, 1))
    est, lo, hi, verdict = bootstrap(values, lambda m: float(m[0]), lambda v: v - 0.9)
    half = 1.96 * values.std() / np.sqrt(len(values))
    assert est == pytest.approx(values.mean())
    assert (lo, hi) == pytest.approx((est - half, est + half), abs=0.15 * half)
    assert verdict == HELD  # the whole interval is above 0.9


def test_too_few_seeds_decide_nothing() -> None:
    for n in (1, 2):
        values = np.stack([np.ones(n), np.full(n, 2.0)], axis=1)  # ratio 2, far above 1.2
        assert bootstrap(values, lambda g: float(g[-1] / g[0]), lambda v: v - 1.2)[3] == UNDECIDED
    three = np.stack([np.ones(3), np.full(3, 2.0)], axis=1)
    assert bootstrap(three, lambda g: float(g[-1] / g[0]), lambda v: v - 1.2)[3] == HELD


@pytest.mark.parametrize(
    "center, spread, expected",
    [
        (1.21, 0.15, UNDECIDED),  # the case: 1.21 against 1.2 with +-15 % per seed
        (1.21, 0.001, HELD),  # the same mean, seeds that agree
        (1.08, 0.02, FAILED),
        (1.20, 0.0, UNDECIDED),  # exactly on the boundary: the margin is 0, not above it
    ],
)
def test_bootstrap_verdict_needs_the_interval_to_clear_the_threshold(
    center: float, spread: float, expected: str
) -> None:
    """A last/first ratio over 6 seeds: the first layer 1, the last `center` +- `spread`."""
    last = center * (1 + spread * np.array([-1.0, 1.0, -0.5, 0.5, -0.8, 0.8]))
    values = np.stack([np.ones(6), last], axis=1)  # (seeds, layers)
    est, _, _, verdict = bootstrap(values, lambda g: float(g[-1] / g[0]), lambda v: v - 1.2)
    assert est == pytest.approx(center) and verdict == expected


def test_down_proj_grads_are_the_autograd_grads() -> None:
    model = Transformer(SMALL.model_config("pre", 2))
    tokens = torch.randint(0, SMALL.vocab_size, (2, 9))
    norms = down_proj_grads(model, tokens)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    grads = torch.autograd.grad(loss, [b.mlp.branch.down_proj.weight for b in model.blocks])
    assert norms == pytest.approx([float(g.norm()) for g in grads], rel=1e-5)


def test_command_writes_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "th"
    argv = ["theory", "--out", str(out), "--d-model", "32", "--seeds", "2"]
    assert main([*argv, "--depths", "2,4", "--layers", "3"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"theory.md", "theory.json", "lemma2_stream_energy.png"} <= names
    assert {"theorem1_last_mlp_grad.png", "figure3_grad_profile.png"} <= names
    data = json.loads((out / "theory.json").read_text())
    assert len(data["checks"]) == 6 and np.shape(data["lemma2"]["pre"]) == (2, 3)
    md = (out / "theory.md").read_text()
    assert "![lemma2_stream_energy](lemma2_stream_energy.png)" in md
    assert "Lemma 2, Post-LN" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--depths", "2,x"], "--depths must be comma-separated integers"),
        (["--depths", "4"], "depths must be >= 2 distinct values"),
        (["--seeds", "0"], "seeds must be >= 1"),
        (["--d-model", "30"], "must split into n_heads"),
    ],
)
def test_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    assert main(["theory", "--out", str(tmp_path / "th"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "th").exists()
