"""Initialisation schemes against SCIENCE.md section 2, and Xiong et al.'s Lemma 2 (section 3)."""

import math

import pytest
import torch
from normlab.model import ModelConfig, Transformer
from normlab.model.placements import deepnorm_constants


def build(**kw) -> Transformer:
    torch.manual_seed(0)
    base = dict(n_layers=6, d_model=256, n_heads=4, d_ff=512, vocab_size=512, max_seq_len=32)
    return Transformer(ModelConfig(**{**base, **kw}))


@pytest.mark.parametrize("depth", [12, 24, 48])
def test_deepnorm_alpha_beta(depth):
    alpha, beta = deepnorm_constants(depth)
    assert alpha == pytest.approx((2 * depth) ** 0.25) and beta == pytest.approx(
        (8 * depth) ** -0.25
    )
    model = build(placement="deepnorm", n_layers=depth, d_model=64, d_ff=128)
    assert model.config.init == "deepnorm"  # the placement's default
    assert all(b.attn.alpha == alpha and b.mlp.alpha == alpha for b in model.blocks)


def test_deepnorm_beta_on_exactly_the_named_weights():
    model = build(placement="deepnorm", n_layers=12)
    beta = deepnorm_constants(12)[1]
    for name, p in model.named_parameters():
        if p.dim() != 2 or not name.startswith("blocks."):
            continue
        fan_out, fan_in = p.shape
        xavier = math.sqrt(2.0 / (fan_in + fan_out))
        gain = (
            beta
            if name.split(".")[-2] in ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
            else 1.0
        )
        assert p.std().item() == pytest.approx(gain * xavier, rel=0.05), name


def test_gpt2_scales_residual_outputs_by_depth():
    model = build(placement="pre", n_layers=6)
    for name, p in model.named_parameters():
        if p.dim() != 2:
            continue
        residual = name.split(".")[-2] in ("o_proj", "down_proj")
        std = 0.02 / math.sqrt(12) if residual else 0.02
        assert p.std().item() == pytest.approx(std, rel=0.05), name
        assert p.mean().abs().item() < 3 * std / math.sqrt(p.numel()) + 1e-4


def test_olmo2_truncated_normal_without_depth_scaling():
    model = build(placement="olmo2", init="olmo2", qk_norm="flat")
    sigma = math.sqrt(
        1 - 2 * 3 * math.exp(-4.5) / math.sqrt(2 * math.pi) / 0.9973
    )  # std of N(0,1) cut at 3
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert p.abs().max().item() <= 0.06 + 1e-7, name
            assert p.std().item() == pytest.approx(0.02 * sigma, rel=0.05), name
        else:
            assert torch.all(p == 1), name  # norm gains


def test_xavier_analysis_setting():
    model = build(placement="post", init="xavier", mlp="relu", norm="layernorm", bias=True)
    block = model.blocks[0]
    assert torch.all(block.attn.branch.q_proj.weight == 0)
    assert torch.all(block.attn.branch.k_proj.weight == 0)
    assert torch.all(block.mlp.branch.up_proj.bias == 0)
    assert torch.all(block.attn.norm.weight == 1) and torch.all(block.attn.norm.bias == 0)


def squared_norms_by_depth(placement: str, d: int = 128, depth: int = 12, seeds: int = 12):
    """E||x_l||^2 / d at init in Xiong et al.'s setting, for inputs with E||x||^2 = d."""
    cfg = ModelConfig(
        n_layers=depth,
        d_model=d,
        n_heads=4,
        d_ff=d,
        mlp="relu",
        norm="layernorm",
        placement=placement,
        init="xavier",
        vocab_size=8,
        max_seq_len=64,
    )
    total = torch.zeros(depth)
    for seed in range(seeds):
        torch.manual_seed(seed)
        model, x = Transformer(cfg), torch.randn(8, 64, d)
        with torch.no_grad():
            for i, block in enumerate(model.blocks):
                if placement == "post":  # measured after the second add, before the closing norm
                    h = block.attn(x)
                    x_l = h + block.mlp.branch(h)
                    x = block.mlp.norm(x_l)
                else:
                    x = x_l = block(x)
                total[i] += (x_l**2).sum(-1).mean() / seeds
    return total / d


def test_xiong_lemma2_post_ln_constant():
    norms = squared_norms_by_depth("post")
    # 12 model draws: each layer's mean scatters with std ~0.04, so 12 layers reach ~0.1
    assert torch.allclose(norms, torch.full_like(norms, 1.5), atol=0.12), norms


def test_xiong_lemma2_pre_ln_linear_bounds():
    norms = squared_norms_by_depth("pre")
    layer = torch.arange(1, 13, dtype=torch.float32)
    assert torch.all(norms >= 1 + layer / 2) and torch.all(norms <= 1 + 1.5 * layer), norms
    assert torch.all(norms[1:] > norms[:-1])  # grows with depth


def test_normal_has_no_depth_factor_and_is_ln_scalings_default():
    model = build(placement="pre", ln_scaling=True, n_layers=12)
    assert model.config.init == "normal"  # the default under LayerNorm Scaling
    for name, p in model.named_parameters():
        if p.dim() == 2:  # every Linear and the embedding, residual outputs included
            assert p.mean().item() == pytest.approx(0.0, abs=2e-3), name
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
    assert build(placement="pre").config.init == "gpt2"  # plain Pre-LN keeps GPT-2's
    explicit = build(placement="pre", ln_scaling=True, init="gpt2")
    assert explicit.config.init == "gpt2"  # a recipe's own choice wins
    down = explicit.blocks[0].mlp.branch.down_proj.weight
    assert down.std().item() == pytest.approx(0.02 / math.sqrt(2 * 6), rel=0.05)
