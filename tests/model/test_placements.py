"""Each placement's block equals its SCIENCE.md section 1 equation written out by hand."""

import math

import pytest
import torch
import torch.nn.functional as F
from normlab.model import ModelConfig, Transformer
from normlab.model.attention import causal_max_logits
from normlab.model.placements import (
    SCALED_WRAPPERS,
    WRAPPERS,
    BranchScale,
    ConstScale,
    ScaledResidual,
    deepnorm_constants,
)
from torch import nn

D = 32


def make(placement: str, norm: str = "layernorm", **kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=4,
        d_model=D,
        n_heads=4,
        d_ff=64,
        vocab_size=50,
        max_seq_len=16,
        placement=placement,
        norm=norm,
        norm_eps=1e-5,
        **kw,
    )
    model = Transformer(cfg).double()
    for p in model.parameters():  # non-trivial gains and biases so a missing norm shows
        if p.dim() == 1:
            p.data.normal_(1.0, 0.3)
    return model


def N(x, norm):  # the norm written out, SCIENCE.md section 10
    g, b = norm.weight, getattr(norm, "bias", None)
    if b is not None:
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return g * (x - mu) / torch.sqrt(var + norm.eps) + b
    return g * x / torch.sqrt((x**2).mean(-1, keepdim=True) + norm.eps)


def F_attn(block):
    return block.attn.branch


def F_mlp(block):
    return block.mlp.branch


def by_hand(placement, block, x, layer):
    a, m = block.attn, block.mlp
    if placement == "post":
        x = N(x + F_attn(block)(x), a.norm)
        return N(x + F_mlp(block)(x), m.norm)
    if placement == "pre":
        x = x + F_attn(block)(N(x, a.norm_in))
        return x + F_mlp(block)(N(x, m.norm_in))
    if placement == "ln_scaling":
        s = 1 / math.sqrt(layer)
        x = x + F_attn(block)(N(x, a.norm_in) * s)
        return x + F_mlp(block)(N(x, m.norm_in) * s)
    if placement == "peri":
        x = x + N(F_attn(block)(N(x, a.norm_in)), a.norm_out)
        return x + N(F_mlp(block)(N(x, m.norm_in)), m.norm_out)
    if placement == "olmo2":
        x = x + N(F_attn(block)(x), a.norm_out)
        return x + N(F_mlp(block)(x), m.norm_out)  # the updated stream h, not the block input
    if placement == "deepnorm":
        alpha = (2 * 4) ** 0.25
        x = N(alpha * x + F_attn(block)(x), a.norm)
        return N(alpha * x + F_mlp(block)(x), m.norm)
    raise AssertionError(placement)


CASES = [
    ("post", {}),
    ("pre", {}),
    ("peri", {}),
    ("olmo2", {}),
    ("deepnorm", {}),
    ("ln_scaling", {"ln_scaling": True}),
]


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("name,extra", CASES)
def test_block_equals_equation(name, extra, norm):
    placement = "pre" if name == "ln_scaling" else name
    model = make(placement, norm, **extra)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    for layer, block in enumerate(model.blocks, start=1):
        expected = by_hand(name, block, x, layer)
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)
        x = expected


SCALES = {
    "layerscale": {"residual_scale": "layerscale"},
    "completep": {"parametrization": "completep", "base_d_model": 16, "base_n_layers": 2},
}


def scaled_by_hand(kind, wrapper, x, s):
    """x + s ⊙ N_out(F(N_in(x))) with the norms of the placement written out (SCIENCE.md 15, 21)."""
    F = wrapper.branch
    if kind == "pre":
        return x + s * F(N(x, wrapper.norm_in))
    if kind == "peri":
        return x + s * N(F(N(x, wrapper.norm_in)), wrapper.norm_out)
    if kind == "olmo2":
        return x + s * N(F(x), wrapper.norm_out)
    raise AssertionError(kind)


@pytest.mark.parametrize("scale", sorted(SCALES))
@pytest.mark.parametrize("kind", ["pre", "peri", "olmo2"])
def test_scaled_residual_equals_its_equation(kind, scale):
    """The one residual-scale wrapper, with a learned λ (LayerScale) and with CompleteP's
    constant m_L^-α = (4 / 2)^-1, against the equation computed directly."""
    model = make(kind, **SCALES[scale])  # make draws λ and every gain ~ N(1, 0.3)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    for block in model.blocks:
        for w in (block.attn, block.mlp):
            assert type(w) is ScaledResidual
            assert isinstance(w.norm_in, nn.Identity) == (kind == "olmo2")
            assert isinstance(w.norm_out, nn.Identity) == (kind == "pre")
            if scale == "layerscale":
                assert isinstance(w.scale, BranchScale) and w.scale.weight.shape == (D,)
                s = w.scale.weight.detach().clone()
            else:
                assert isinstance(w.scale, ConstScale)
                s = (4 / 2) ** -1.0
            expected = scaled_by_hand(kind, w, x, s)
            torch.testing.assert_close(w(x), expected, rtol=1e-12, atol=1e-12)
            x = expected


# blocks.0's state_dict keys of a LayerScale model (rmsnorm, swiglu), captured from the three
# ScaledBranch*Norm classes before they were folded into ScaledResidual: checkpoints and the HF
# key maps depend on them
_ATTN = [f"attn.branch.{p}_proj.weight" for p in "qkvo"]
_MLP = [f"mlp.branch.{p}_proj.weight" for p in ("gate", "up", "down")]
LAYERSCALE_KEYS = {
    "pre": [*_ATTN, "attn.norm_in.weight", "attn.scale.weight",
            *_MLP, "mlp.norm_in.weight", "mlp.scale.weight"],
    "peri": [*_ATTN, "attn.norm_in.weight", "attn.norm_out.weight", "attn.scale.weight",
             *_MLP, "mlp.norm_in.weight", "mlp.norm_out.weight", "mlp.scale.weight"],
    "olmo2": [*_ATTN, "attn.norm_out.weight", "attn.scale.weight",
              *_MLP, "mlp.norm_out.weight", "mlp.scale.weight"],
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(LAYERSCALE_KEYS))
def test_scaled_residual_keeps_the_state_dict_keys(kind):
    keys = list(make(kind, "rmsnorm", residual_scale="layerscale").state_dict())
    assert [k.removeprefix("blocks.0.") for k in keys if k.startswith("blocks.0.")] == (
        LAYERSCALE_KEYS[kind]
    )
    assert [k for k in keys if not k.startswith("blocks.")] == [
        "embed.weight", "final_norm.weight", "head.weight"
    ]  # fmt: skip


def test_scaled_wrappers_names_the_kinds_that_take_a_scale():
    """SCALED_WRAPPERS (= config.SCALED_KINDS, which count_params reads) is exactly the set of
    placement-table kinds whose builder wraps a LayerScale model's sub-layer in ScaledResidual."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=4, d_model=D, n_heads=4, d_ff=64, vocab_size=50, max_seq_len=16,
                      residual_scale="layerscale")  # fmt: skip

    def norm():
        return nn.LayerNorm(D)

    scaled = {
        kind
        for kind, build in WRAPPERS.items()
        if isinstance(build(cfg, 1, "ffn", nn.Linear(D, D), norm), ScaledResidual)
    }
    assert scaled == SCALED_WRAPPERS


@pytest.mark.parametrize("ratio,n_post", [(0.25, 1), (0.5, 2), (0.0, 0), (0.7, 2)])
def test_mix_switches_at_floor_ratio_times_depth(ratio, n_post):
    model = make("mix", mix_ratio=ratio)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    for layer, block in enumerate(model.blocks, start=1):
        expected = by_hand("post" if layer <= n_post else "pre", block, x, layer)
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)
        x = expected


@pytest.mark.parametrize(
    "placement,final",
    [
        ("post", False),
        ("pre", True),
        ("peri", True),
        ("olmo2", True),
        ("deepnorm", False),
        ("mix", True),
    ],
)
def test_final_norm_presence(placement, final):
    model = make(placement)
    assert (not isinstance(model.final_norm, torch.nn.Identity)) == final
    tokens = torch.randint(0, 50, (2, 6))
    x = model.embed(tokens)
    for block in model.blocks:
        x = block(x)
    x = N(x, model.final_norm) if final else x
    torch.testing.assert_close(model(tokens), x @ model.head.weight.T)


def test_peri_embedding_norm_switch():
    model = make("peri", embed_norm=True)
    tokens = torch.randint(0, 50, (1, 5))
    x = N(model.embed(tokens), model.embed_norm)
    for block in model.blocks:
        x = block(x)
    torch.testing.assert_close(model(tokens), N(x, model.final_norm) @ model.head.weight.T)
    assert isinstance(make("peri").embed_norm, torch.nn.Identity)  # off by default


def test_peri_output_gains_are_learnable():
    model = make("peri")
    assert all(b.attn.norm_out.weight.requires_grad for b in model.blocks)


@pytest.mark.parametrize("qk", ["head", "flat"])
def test_qk_norm_axis_before_rope(qk):
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=1,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        vocab_size=50,
        qk_norm=qk,
        max_seq_len=8,
    )
    attn = Transformer(cfg).double().blocks[0].attn.branch
    attn.q_norm.weight.data.normal_(1, 0.3)
    attn.k_norm.weight.data.normal_(1, 0.3)
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    def rms(t, g):  # over the last axis
        return g * t / torch.sqrt((t**2).mean(-1, keepdim=True) + cfg.norm_eps)

    if qk == "flat":  # whole H * d_head vector, before the split into heads
        q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
        q, k = q.view(2, 8, 4, 8), k.view(2, 8, 2, 8)
        assert attn.q_norm.weight.shape == (32,) and attn.k_norm.weight.shape == (16,)
    else:  # each head's d_head vector, one gain shared by the heads
        q, k = (
            rms(q.view(2, 8, 4, 8), attn.q_norm.weight),
            rms(k.view(2, 8, 2, 8), attn.k_norm.weight),
        )
        assert attn.q_norm.weight.shape == (8,)
    pos = torch.arange(8, dtype=torch.float64)
    inv = 1 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    ang = torch.cat([torch.outer(pos, inv)] * 2, -1)[None, :, None, :]
    rot = lambda t: t * ang.cos() + torch.cat([-t[..., 4:], t[..., :4]], -1) * ang.sin()
    q, k = rot(q).transpose(1, 2), rot(k).transpose(1, 2).repeat_interleave(2, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    s = s.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    y = F.softmax(s, -1) @ v.view(2, 8, 2, 8).transpose(1, 2).repeat_interleave(2, 1)
    expected = attn.o_proj(y.transpose(1, 2).reshape(2, 8, 32))
    torch.testing.assert_close(attn(x), expected, rtol=1e-9, atol=1e-9)
    seen = []  # the max logit measured on the tapped q, k, as QK-Clip's hook does
    attn.qk_tap.register_forward_hook(lambda m, a, out: seen.append(causal_max_logits(*out)))
    attn(x)
    torch.testing.assert_close(seen[0].double(), s.amax(dim=(0, 2, 3)), rtol=1e-5, atol=1e-5)


def test_hooks_observe_stream_and_branches():
    model = make("pre")
    seen = {}
    for name, module in model.named_modules():
        if name.endswith(".branch") or name.count(".") == 1 and name.startswith("blocks."):
            module.register_forward_hook(lambda m, i, o, name=name: seen.setdefault(name, o))
    tokens = torch.randint(0, 50, (1, 4))
    model(tokens)
    assert {"blocks.0", "blocks.3", "blocks.0.attn.branch", "blocks.3.mlp.branch"} <= set(seen)
    # Pre-LN: the stream after block 0 is the embedding plus both observed branch outputs
    expected = model.embed(tokens) + seen["blocks.0.attn.branch"] + seen["blocks.0.mlp.branch"]
    torch.testing.assert_close(seen["blocks.0"], expected)


def test_deepnorm_constants_named_in_science():
    for m, (alpha, beta) in {
        12: (2.2134, 0.3195),
        24: (2.6321, 0.2686),
        48: (3.1302, 0.2259),
    }.items():
        a, b = deepnorm_constants(m)
        assert a == pytest.approx(alpha, abs=1e-4) and b == pytest.approx(beta, abs=1e-4)


def test_lse_bounds_bracket_the_exact_max_logit_and_keep_gradients():
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=1,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        vocab_size=50,
        max_seq_len=16,
        init_std=0.3,
    )
    attn = Transformer(cfg).blocks[0].attn.branch
    x = torch.randn(3, 16, 32, requires_grad=True)
    reference = attn(x)
    (grad_ref,) = torch.autograd.grad(reference.square().sum(), x)
    seen = {}  # through the two hook points, as the attention_logits instrument reads them

    def exact(tap, args, out):
        seen["exact"] = causal_max_logits(*out)

    def bounds(core, args, out):
        seen["bounds"] = out[1]

    attn.qk_tap.register_forward_hook(exact)
    attn.core.register_forward_pre_hook(
        lambda m, a, kw: (a, {**kw, "bounds": True}), with_kwargs=True
    )
    attn.core.register_forward_hook(bounds)
    fused = attn(x)
    (grad_fused,) = torch.autograd.grad(fused.square().sum(), x)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_fused, grad_ref, rtol=1e-4, atol=1e-5)
    (lower, upper), exact = seen["bounds"], seen["exact"]
    assert torch.all(lower <= exact + 1e-5) and torch.all(exact <= upper + 1e-5)
    assert torch.all(upper - lower <= math.log(16) + 1e-5)  # the bound's width is at most log n


@pytest.mark.parametrize("kw", [{}, {"attn_sinks": True}, {"attn_softcap": 30.0}])
def test_attention_computes_no_max_logit_without_a_hook(kw, monkeypatch):
    """The max logit is the instruments' business (hooks on qk_tap and core): a training forward
    and backward with no hook never calls the exact max nor the lse-bound kernel; with QK-Clip's
    hook on the tap, the same forward does."""
    import normlab.launch.instruments.common as common
    import normlab.model.attention as attention
    import normlab.model.attention_cores as cores
    import normlab.model.attention_lse as lse

    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=50,
                                    max_seq_len=16, **kw))  # fmt: skip
    att = model.blocks[0].attn.branch
    assert not [a for a in vars(att) if a.startswith("record")]
    assert not hasattr(att, "max_logits") and not hasattr(att, "lse_bounds")
    assert not hasattr(model, "set_record_max_logits")

    def boom(*args, **kwargs):
        raise AssertionError("computed without a hook")

    for module in (attention, lse, common):
        monkeypatch.setattr(module, "causal_max_logits", boom)
    for module in (attention, cores):
        monkeypatch.setattr(module, "attention_with_lse_bounds", boom)
    tokens = torch.randint(0, 50, (2, 16))
    model.train()
    model(tokens).square().mean().backward()
    att.qk_tap.register_forward_hook(common.fold_max_logits(torch.zeros(4)))
    with pytest.raises(AssertionError, match="without a hook"):
        model(tokens)


def test_the_placement_table_covers_every_sublayer_kind() -> None:
    """model.placements.WRAPPERS has one builder per kind model.config.sublayer_kind returns."""
    import typing

    from normlab.model.config import ModelConfig, Placement, sublayer_kind
    from normlab.model.placements import WRAPPERS

    kinds = set()
    for placement in typing.get_args(Placement):
        for ln_scaling in (False, True) if placement == "pre" else (False,):
            qk = {"qk_norm": "head"} if placement.startswith("hybrid") else {}
            cfg = ModelConfig(placement=placement, ln_scaling=ln_scaling, n_layers=4, **qk)
            kinds |= {sublayer_kind(cfg, layer) for layer in range(1, 5)}
    assert kinds == set(WRAPPERS)
