"""µP and CompleteP (SCIENCE.md 21): the base shape trains bit-identically to sp; the mup package
(an independent implementation) gives the same per-parameter lr, weight decay, init scale and
logits; CompleteP's Table 1 cell by cell; placements 21.3 leaves undefined are refused."""

from __future__ import annotations

import math

import pytest
import torch
from normlab.launch.config import OptimSection
from normlab.launch.optim import build_optimizer, param_groups
from normlab.model import ModelConfig, Transformer, lm_loss
from normlab.model.attention import causal_max_logits
from normlab.model.init import canonical_name, init_plan
from normlab.model.parametrization import config_notes
from normlab.model.placements import ConstScale

SHAPE = dict(n_heads=2, vocab_size=61, max_seq_len=16, init="normal")
ETA, LAM, EPS = 3e-3, 0.1, 1e-8
ADAMW = OptimSection(lr=ETA, weight_decay=LAM, eps=EPS)


def build(seed: int = 0, **kw) -> Transformer:
    values = dict(n_layers=2, d_model=32, d_ff=64) | SHAPE | kw
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**values))


def train(model: Transformer, opt_cfg: OptimSection, steps: int = 3) -> list[float]:
    opt = build_optimizer(model, opt_cfg)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.config.vocab_size, (2, 13), generator=gen)
    out = []
    for _ in range(steps):
        loss, _ = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


BASE = {
    "mup": dict(parametrization="mup", base_d_model=32),
    "completep": dict(parametrization="completep", base_d_model=32, base_n_layers=2),
    "completep_half": dict(
        parametrization="completep", base_d_model=32, base_n_layers=2, completep_alpha=0.5
    ),
}


@pytest.mark.parametrize("optim", ["adamw", "muon"])
@pytest.mark.parametrize("kind", list(BASE))
def test_base_shape_trains_bit_identically_to_sp(kind: str, optim: str) -> None:
    cfg = OptimSection(name=optim, lr=ETA, weight_decay=LAM, muon_ns_dtype="fp32")
    sp, other = build(bias=True), build(bias=True, **BASE[kind])
    assert train(sp, cfg) == train(other, cfg)
    for (name, a), (_, b) in zip(sp.named_parameters(), other.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def _per_param(opt: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, tuple]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]: (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]
    }


@pytest.mark.parametrize("tie", [False, True])
def test_groups_init_and_logits_match_the_mup_package(tie: bool) -> None:
    mup = pytest.importorskip("mup")
    wide = dict(d_model=128, d_ff=256, tie_embeddings=tie, bias=True)
    model = build(**wide, parametrization="mup", base_d_model=32, output_mult=2.0)
    # the mup package's view of the same model: MuReadout heads, base shapes from d 32 and 64
    ref = _mup_view(mup, build(**wide), tie, output_mult=2.0)
    base = _mup_view(mup, build(d_model=32, d_ff=64, tie_embeddings=tie, bias=True), tie)
    delta = _mup_view(mup, build(d_model=64, d_ff=128, tie_embeddings=tie, bias=True), tie)
    mup.set_base_shapes(ref, base, delta=delta, rescale_params=False)
    mu_opt = mup.MuAdamW(param_groups(ref, LAM), lr=ETA)
    ours = build_optimizer(model, ADAMW)
    got, want = _per_param(ours, model), _per_param(mu_opt, ref)
    assert got.keys() == want.keys()
    for name, (lr, wd) in want.items():
        assert got[name] == pytest.approx((lr, wd), rel=1e-12), name
    # init: mup.init.normal_ draws std σ·width_mult^-1/2 on matrix-like, σ on vector-like
    plan = init_plan(model, model.config)
    for name, p in ref.named_parameters():
        if p.ndim < 2:
            continue
        expected = _with(p)
        torch.manual_seed(3)
        mup.init.normal_(expected, std=0.02)
        torch.manual_seed(3)
        got = torch.empty_like(p).normal_(0.0, plan[canonical_name(name)].std)
        assert torch.equal(got, expected), name
    # logits: the whole mup-package model (MuReadout: output_mult * x / width_mult) on our weights
    ref.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 61, (2, 9))
    torch.testing.assert_close(model(tokens), ref(tokens), rtol=1e-6, atol=1e-7)


def _mup_view(mup, model: Transformer, tie: bool, output_mult: float = 1.0) -> Transformer:
    d, v = model.config.d_model, model.config.vocab_size
    if tie:
        model.head = mup.MuSharedReadout(model.embed.weight, bias=False, output_mult=output_mult)
    else:
        model.head = mup.MuReadout(d, v, bias=False, output_mult=output_mult)
    return model


def _with(p: torch.Tensor) -> torch.Tensor:
    t = torch.empty_like(p)
    t.infshape = p.infshape
    return t


# CompleteP Table 1 (SCIENCE.md 21.2), α ∈ {0.5, 1}, as (lr, wd, eps) factors per cell, written
# from the table, not from model/parametrization.py: m_N = 64/32 = 2, m_L = 8/2 = 4.
M_N, M_L = 2.0, 4.0


def _table(alpha: float) -> dict[str, tuple[float, float, float]]:
    return {
        "hidden": (M_N**-1 * M_L ** (alpha - 1), LAM * M_N, EPS * M_N**-1 * M_L**-alpha),
        "hidden bias": (M_L ** (alpha - 1), 0.0, EPS * M_N**-1 * M_L**-alpha),
        "block norm": (M_L ** (alpha - 1), 0.0, EPS * M_N**-1 * M_L**-alpha),
        "embed": (1.0, 0.0, EPS),  # normlab never decays embeddings (sp's rule, kept by µP)
        "final norm": (1.0, 0.0, EPS),
        "head": (1.0, LAM, EPS),
    }


def _cell(name: str) -> str:
    if name.startswith("blocks."):
        return (
            "hidden bias"
            if name.endswith("proj.bias")
            else ("block norm" if "norm" in name else "hidden")
        )
    return {"embed.weight": "embed", "final_norm.weight": "final norm"}.get(name, "head")


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_completep_table_cell_by_cell(alpha: float) -> None:
    model = build(
        n_layers=8,
        d_model=64,
        d_ff=128,
        bias=True,
        qk_norm="head",
        parametrization="completep",
        base_d_model=32,
        base_n_layers=2,
        completep_alpha=alpha,
    )
    table = _table(alpha)
    opt = build_optimizer(model, ADAMW)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            lr, wd, eps = table[_cell(names[id(p)])]
            got = (group["lr"] / ETA, group["weight_decay"], group["eps"])
            assert got == pytest.approx((lr, wd, eps), rel=1e-12), names[id(p)]
    # init: hidden σ²/m_N, the rest σ² (gains 1)
    for name, draw in init_plan(model, model.config).items():
        cell = _cell(name)
        want = 0.02 / math.sqrt(M_N) if cell == "hidden" else 0.02
        if cell in ("hidden", "embed", "head"):
            assert draw.std == pytest.approx(want, rel=1e-12), name
    # forward: x + m_L^-α F(N(x)) on both sub-layers; head input × 1/m_N
    wrappers = [b.attn for b in model.blocks] + [b.mlp for b in model.blocks]
    assert all(w.scale.c == pytest.approx(M_L**-alpha) for w in wrappers)
    assert model.head_mult.c == pytest.approx(1 / M_N)
    x = torch.randn(2, 5, 64)
    block = model.blocks[3].attn
    torch.testing.assert_close(block(x), x + M_L**-alpha * block.branch(block.norm_in(x)))


@pytest.mark.parametrize(("scale", "factor"), [("match_rms_adamw", 2.0**-1), ("original", 1.0)])
def test_muon_hidden_lr_follows_the_spectral_rule(scale: str, factor: float) -> None:
    """21.4: Keller Jordan's scale needs no width factor; Moonlight's falls as m_N^-1/2 (m_N 4)."""
    model = build(d_model=128, d_ff=256, parametrization="mup", base_d_model=32)
    opt = build_optimizer(
        model, OptimSection(name="muon", lr=ETA, weight_decay=LAM, muon_scale=scale)
    )
    (muon,) = [g for g in opt.param_groups if g["use_muon"]]
    assert muon["lr"] == pytest.approx(ETA * factor) and muon["weight_decay"] == pytest.approx(
        LAM / factor
    )
    adam_hidden = [g for g in opt.param_groups if g["group"].endswith("/head")]
    assert adam_hidden[0]["lr"] == ETA  # the head stays on AdamW at the base lr


def test_attention_scale_is_alpha_over_d_head() -> None:
    """S = α_attn q·k / d_head: with attn_mult the recorded exact max logit follows it."""
    kw = dict(d_model=64, d_ff=128, parametrization="mup", base_d_model=32)
    plain, scaled = build(**kw), build(**kw, attn_mult=8.0)  # d_head 32: default α = sqrt(32)
    tokens = torch.randint(0, 61, (1, 9))
    maxima = []  # block 0's exact max logit, from a hook on its q/k tap (as QK-Clip reads it)
    for m in (plain, scaled):
        tap = m.blocks[0].attn.branch.qk_tap
        tap.register_forward_hook(lambda t, a, out: maxima.append(causal_max_logits(*out)))
        m(tokens)
    ratio = maxima[1] / maxima[0]
    torch.testing.assert_close(ratio, torch.full_like(ratio, 8.0 / math.sqrt(32)))


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        (
            dict(parametrization="completep", base_d_model=32, base_n_layers=2, placement="post"),
            "model.placement",
        ),
        (
            dict(parametrization="completep", base_d_model=32, base_n_layers=2, ln_scaling=True),
            "model.placement 'ln_scaling' is itself a depth rule",
        ),
        (
            dict(
                parametrization="completep",
                base_d_model=32,
                base_n_layers=2,
                residual_scale="layerscale",
            ),
            "model.residual_scale",
        ),
        (
            dict(parametrization="completep", base_d_model=32, base_n_layers=2, norm="dyt"),
            "model.norm",
        ),
        (dict(parametrization="mup", base_d_model=32, init="gpt2"), "model.init"),
        (dict(parametrization="mup"), "model.base_d_model"),
        (dict(parametrization="completep", base_d_model=32), "model.base_n_layers"),
        (dict(base_d_model=32), "model.base_d_model"),
        (
            dict(
                parametrization="completep", base_d_model=32, base_n_layers=2, completep_alpha=0.7
            ),
            "model.completep_alpha",
        ),
    ],
)
def test_undefined_combinations_are_refused_naming_the_key(kw: dict, key: str) -> None:
    values = dict(n_layers=2, d_model=32, d_ff=64) | SHAPE | {"init": None} | kw
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as err:
        ModelConfig(**values)
    assert "\n" not in str(err.value)


def test_mup_is_allowed_on_every_placement_with_a_transfer_init() -> None:
    for placement in ("post", "peri", "olmo2", "mix", "keel"):
        cfg = ModelConfig(
            n_layers=2,
            d_model=64,
            n_heads=2,
            parametrization="mup",
            base_d_model=32,
            placement=placement,
        )
        assert cfg.init == "normal"
    model = build(
        n_layers=4, placement="peri", parametrization="completep", base_d_model=32, base_n_layers=2
    )
    assert isinstance(model.blocks[0].attn.scale, ConstScale)  # m_L^-α after N_out


@pytest.mark.parametrize(
    ("placement", "qk_norm"), [("pre", "none"), ("pre", "head"), ("olmo2", "flat")]
)
def test_hf_export_folds_the_multipliers_exactly(placement: str, qk_norm: str) -> None:
    """α_in, α_out / m_N, m_L^-α and α_attn folded into HF weights: the same logits."""
    pytest.importorskip("transformers")
    from normlab.model.hf import to_hf

    model = build(
        n_layers=4, d_model=64, d_ff=128, n_heads=4, placement=placement, qk_norm=qk_norm,
        init="olmo2" if placement == "olmo2" else "normal", parametrization="completep",
        base_d_model=32, base_n_layers=2, input_mult=1.5, output_mult=3.0, attn_mult=3.0,
    )  # fmt: skip
    tokens = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        theirs = to_hf(model)(tokens).logits
        torch.testing.assert_close(theirs, model(tokens), rtol=1e-4, atol=1e-5)


def test_hf_export_refuses_tied_multipliers_in_one_line() -> None:
    from normlab.model.hf_fold import refuse_parametrization

    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=2, parametrization="mup", base_d_model=32,
                      tie_embeddings=True)  # fmt: skip
    with pytest.raises(ValueError, match="model.tie_embeddings") as err:
        refuse_parametrization(cfg)
    assert "\n" not in str(err.value)


def test_validate_note_and_compare_label_name_the_parametrization() -> None:
    from normlab.launch.report.table import placement_label

    cfg = ModelConfig(
        n_layers=8, d_model=128, n_heads=4, parametrization="completep", base_d_model=32,
        base_n_layers=2,
    )  # fmt: skip
    assert cfg.notes() == []  # the placement's own notes: none here
    (note,) = config_notes(cfg)
    assert "m_N = 4" in note and "m_L = 4" in note and "residual branches x 0.25" in note
    assert "hidden AdamW lr x 0.25" in note and "head input x 0.25" in note
    assert placement_label({"model": cfg.to_dict()}) == "pre+completep"
    assert placement_label({"model": {"placement": "pre", "parametrization": "sp"}}) == "pre"
