"""Norm-side stabilizers (SCIENCE.md 15-18) against a hand-written reference of each equation:
LayerScale / SkipInit on pre, peri, olmo2 and mix; DyT and Derf; HybridNorm and HybridNorm*;
Keel. The reference below is written from the equations over the model's state_dict (float64,
random weights), and the logits and every gradient are compared. Then the inits, the refusals,
the parameter count, and the LayerScale fold into HF Llama / Qwen3 / OLMo 2 on export.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from normlab.model import ModelConfig, Transformer, count_params
from normlab.model.config import cait_epsilon
from normlab.model.placements import sublayer_kind
from normlab.model.rope import apply_rope, rope_tables

V, D, H, T, EPS = 40, 32, 4, 9, 1e-6


# --- the reference, from the equations ------------------------------------------------------
def _norm(p: dict, name: str, x: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """RMSNorm g x / rms(x); DyT g tanh(a x) + b; Derf g erf(a x + s) + b."""
    if cfg.norm == "dyt":
        return p[f"{name}.weight"] * torch.tanh(p[f"{name}.alpha"] * x) + p[f"{name}.bias"]
    if cfg.norm == "derf":
        y = torch.erf(p[f"{name}.alpha"] * x + p[f"{name}.shift"])
        return p[f"{name}.weight"] * y + p[f"{name}.bias"]
    return _rms(x, p[f"{name}.weight"])


def _rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS)


def _attn(p: dict, pre: str, x: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    B, n, hd, kvh = x.shape[0], x.shape[1], cfg.head_dim, cfg.n_kv_heads
    q = (x @ p[f"{pre}.q_proj.weight"].T).view(B, n, H, hd)
    k = (x @ p[f"{pre}.k_proj.weight"].T).view(B, n, kvh, hd)
    v = (x @ p[f"{pre}.v_proj.weight"].T).view(B, n, kvh, hd)
    if cfg.qk_norm == "head":  # N_q, N_k (and HybridNorm's N_v) over d_head, before RoPE
        q, k = _rms(q, p[f"{pre}.q_norm.weight"]), _rms(k, p[f"{pre}.k_norm.weight"])
    if f"{pre}.v_norm.weight" in p:
        v = _rms(v, p[f"{pre}.v_norm.weight"])
    cos, sin = (t[:n].double() for t in rope_tables(cfg.max_seq_len, hd, cfg.rope_theta))
    q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)
    k, v = k.repeat_interleave(H // kvh, 1), v.transpose(1, 2).repeat_interleave(H // kvh, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    y = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, n, -1)
    return y @ p[f"{pre}.o_proj.weight"].T


def _mlp(p: dict, pre: str, x: torch.Tensor) -> torch.Tensor:
    gate, up = x @ p[f"{pre}.gate_proj.weight"].T, x @ p[f"{pre}.up_proj.weight"].T
    return (F.silu(gate) * up) @ p[f"{pre}.down_proj.weight"].T


def _sublayer(p, i, sub, branch, x, cfg, kind):  # noqa: ANN001, ANN202
    w = f"blocks.{i}.{sub}"
    lam = p.get(f"{w}.scale.weight", 1.0)  # λ (LayerScale) or α (SkipInit); 1 without
    F_ = lambda h: branch(p, f"{w}.branch", h)  # noqa: E731
    N = lambda name, h: _norm(p, f"{w}.{name}", h, cfg)  # noqa: E731
    if kind == "pre":
        return x + lam * F_(N("norm_in", x))
    if kind == "peri":
        return x + lam * N("norm_out", F_(N("norm_in", x)))
    if kind == "olmo2":
        return x + lam * N("norm_out", F_(x))
    if kind == "post":
        return N("norm", x + F_(x))
    if kind == "hybrid" and sub == "attn":  # y = x + MHA_QKV(x)
        return x + F_(x)
    if kind == "hybrid":  # z = N(y); z + FFN(z)
        z = N("norm", x)
        return z + F_(z)
    if kind == "keel":  # N_out(α x + F(N_in(x)))
        return N("norm", cfg.keel_alpha_value * x + F_(N("norm_in", x)))
    raise AssertionError(kind)


def reference(p: dict, cfg: ModelConfig, tokens: torch.Tensor) -> torch.Tensor:
    x = p["embed.weight"][tokens]
    if "embed_scale.scale" in p:
        x = x * p["embed_scale.scale"]
    for i in range(cfg.n_layers):
        kind = sublayer_kind(cfg, i + 1)
        x = _sublayer(p, i, "attn", lambda q, pre, h: _attn(q, pre, h, cfg), x, cfg, kind)
        x = _sublayer(p, i, "mlp", _mlp, x, cfg, kind)
    if cfg.has_final_norm:
        x = _norm(p, "final_norm", x, cfg)
    return x @ p["head.weight"].T


# --- cases ----------------------------------------------------------------------------------
CASES = {
    "pre_layerscale": dict(residual_scale="layerscale"),
    "pre_scalar_gqa": dict(residual_scale="scalar", n_kv_heads=2),
    "peri_layerscale": dict(placement="peri", residual_scale="layerscale"),
    "olmo2_layerscale": dict(placement="olmo2", residual_scale="layerscale", qk_norm="head"),
    "mix_layerscale": dict(placement="mix", mix_ratio=0.5, residual_scale="layerscale"),
    "dyt": dict(norm="dyt"),
    "derf": dict(norm="derf"),
    "dyt_layerscale_qknorm_gqa": dict(
        norm="dyt", residual_scale="layerscale", qk_norm="head", n_kv_heads=2
    ),
    "hybrid_gqa": dict(placement="hybrid", qk_norm="head", n_kv_heads=2),
    "hybrid_star": dict(placement="hybrid_star", qk_norm="head", init="megatron_small"),
    "keel": dict(placement="keel"),
    "keel_blocks": dict(placement="keel", keel_alpha="blocks"),
    "keel_float": dict(placement="keel", keel_alpha=3.0),
}


def _config(**kw) -> ModelConfig:
    base = dict(n_layers=2, d_model=D, n_heads=H, d_ff=48, vocab_size=V, max_seq_len=16)
    return ModelConfig(**(base | kw))


def _randomised(cfg: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(cfg).double()
    with torch.no_grad():
        for p in model.parameters():  # away from the init: gains, α, λ, s around 1
            p.copy_(1 + 0.3 * torch.randn_like(p) if p.ndim == 1 else 0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_every_gradient_equal_the_equations(case: str) -> None:
    cfg = _config(**CASES[case])
    model = _randomised(cfg)
    tokens = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    ref_p = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    out, ref = model(tokens), reference(ref_p, cfg, tokens)
    assert (out - ref).abs().max().item() < 1e-10 * max(1.0, ref.abs().max().item())
    w = torch.linspace(-1, 1, ref.numel(), dtype=ref.dtype).view_as(ref)  # a fixed cotangent
    (out * w).sum().backward()
    (ref * w).sum().backward()
    for name, p in model.named_parameters():
        g, g_ref = p.grad, ref_p[name].grad
        assert g_ref is not None and g_ref.abs().max() > 0, name
        assert (g - g_ref).abs().max().item() < 1e-9 * g_ref.abs().max().item(), name


@pytest.mark.parametrize("case", sorted(CASES))
def test_analytic_parameter_count(case: str) -> None:
    cfg = _config(**CASES[case])
    assert count_params(cfg) == Transformer(cfg).num_params()


# --- inits ----------------------------------------------------------------------------------
def test_inits_are_the_references() -> None:
    m = Transformer(_config(norm="derf", residual_scale="layerscale",
                            dyt_alpha0={"attn": 0.8, "ffn": 0.2, "final": 0.15}))
    s = dict(m.named_parameters())
    assert torch.all(s["blocks.0.attn.scale.weight"] == 0.1)  # CaiT, depth <= 18
    assert s["blocks.1.mlp.scale.weight"].shape == (D,)
    assert s["blocks.0.attn.norm_in.alpha"].item() == pytest.approx(0.8)
    assert s["blocks.1.mlp.norm_in.alpha"].item() == pytest.approx(0.2)
    assert s["final_norm.alpha"].item() == pytest.approx(0.15)
    assert s["final_norm.shift"].item() == 0 and torch.all(s["final_norm.bias"] == 0)
    assert s["embed_scale.scale"].item() == pytest.approx(math.sqrt(D))
    assert [cait_epsilon(n) for n in (12, 18, 24, 36)] == [0.1, 0.1, 1e-5, 1e-6]
    partial = ModelConfig(norm="dyt", dyt_alpha0={"attn": 0.8}).dyt_alpha0
    assert partial == {"attn": 0.8, "ffn": 0.5, "final": 0.5}
    skip = dict(Transformer(_config(residual_scale="scalar")).named_parameters())
    assert skip["blocks.0.attn.scale.weight"].shape == (1,) and skip[
        "blocks.0.attn.scale.weight"].item() == 0.0  # SkipInit / ReZero: 0


def test_megatron_small_init() -> None:
    cfg = ModelConfig(n_layers=4, d_model=256, n_heads=4, d_ff=1024, vocab_size=512,
                      placement="hybrid", qk_norm="head", init="megatron_small")
    s = dict(Transformer(cfg).named_parameters())
    std = math.sqrt(2 / (5 * 256))
    trunc = std * 0.98654  # the std of N(0, std^2) cut at +-3 std
    for name, expect in (("blocks.0.mlp.branch.up_proj.weight", trunc),
                         ("embed.weight", trunc),
                         ("blocks.2.attn.branch.o_proj.weight", trunc / math.sqrt(8)),
                         ("blocks.3.mlp.branch.down_proj.weight", trunc / math.sqrt(8))):
        w = s[name]
        assert w.std().item() == pytest.approx(expect, rel=0.02), name
        assert w.abs().max().item() <= 3 * expect / 0.98654 + 1e-7, name
    assert torch.all(s["blocks.0.attn.branch.v_norm.weight"] == 1)


# --- refusals -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(residual_scale="layerscale", placement="post"), "model.residual_scale"),
        (dict(residual_scale="scalar", placement="deepnorm"), "model.residual_scale"),
        (dict(residual_scale="layerscale", ln_scaling=True), "ln_scaling"),
        (dict(residual_scale_init=0.1), "model.residual_scale_init"),
        (dict(norm="dyt", placement="peri"), "model.norm 'dyt'"),
        (dict(norm="derf", norm_backend="triton"), "model.norm_backend"),
        (dict(norm="dyt", dyt_alpha0={"attn": 0.5, "mlp": 0.2}), "model.dyt_alpha0"),
        (dict(norm="dyt", dyt_alpha0={"attn": 0.5, "ffn": -1, "final": 1}), "model.dyt_alpha0"),
        (dict(dyt_alpha0={"attn": 0.8, "ffn": 0.2, "final": 0.2}), "model.dyt_alpha0"),
        (dict(placement="hybrid"), "model.qk_norm 'head'"),
        (dict(placement="hybrid_star", qk_norm="flat"), "model.qk_norm 'head'"),
        (dict(placement="keel", keel_alpha=0.0), "model.keel_alpha"),
        (dict(keel_alpha="blocks"), "model.keel_alpha"),
        (dict(placement="keel", keel_alpha="layers"), "model.keel_alpha"),
        (dict(init="megatron_small", placement="deepnorm"), "deepnorm"),
    ],
)
def test_impossible_combinations_are_one_line(kw: dict, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        _config(**kw)
    assert needle in str(err.value) and "\n" not in str(err.value)


# --- HF export: LayerScale folds into the exported weights ----------------------------------
@pytest.mark.parametrize(
    "kw, family",
    [
        (dict(residual_scale="layerscale"), "llama"),
        (dict(residual_scale="scalar", qk_norm="head", n_kv_heads=2), "qwen3"),
        (dict(residual_scale="layerscale", placement="olmo2", qk_norm="flat"), "olmo2"),
    ],
)
def test_layerscale_folds_into_hf_and_round_trips(kw: dict, family: str) -> None:
    pytest.importorskip("transformers")
    from normlab.model.hf import from_hf, hf_family, to_hf

    cfg = _config(**kw)
    assert hf_family(cfg) == family
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale.weight"):
                p.uniform_(0.2, 3.0)  # far from 1: an unfolded export would differ
    tokens = torch.randint(0, V, (2, T))
    hf = to_hf(model)
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
        back = from_hf(hf)(tokens)  # one-way: the import holds λ = 1 in the weights
    assert (ours - theirs).abs().max().item() < 1e-5
    assert (ours - back).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "kw",
    [dict(norm="dyt"), dict(norm="derf"), dict(placement="hybrid", qk_norm="head"),
     dict(placement="hybrid_star", qk_norm="head"), dict(placement="keel"),
     dict(placement="peri", residual_scale="layerscale")],
)
def test_hf_family_refuses_in_one_line(kw: dict) -> None:
    from normlab.model.hf import hf_family

    with pytest.raises(ValueError) as err:
        hf_family(_config(**kw))
    assert "\n" not in str(err.value)


# --- optimizers -----------------------------------------------------------------------------
NEW_1D = ("scale.weight", ".alpha", ".shift", "embed_scale.scale", "v_norm.weight")


@pytest.mark.parametrize("case", ["dyt_layerscale_qknorm_gqa", "derf", "hybrid_star", "keel"])
def test_new_parameters_go_to_adamw_without_decay(case: str) -> None:
    """λ, α, s, the embedding scalar and N_v are 1-D: AdamW, no weight decay, under AdamW and
    Muon alike (SCIENCE.md 15-17); the matrices stay with Muon."""
    from normlab.launch.optim import param_groups
    from normlab.launch.optim.muon import split_for_muon

    model = Transformer(_config(**CASES[case]))
    names = {id(p): n for n, p in model.named_parameters()}
    for groups in (param_groups(model, 0.1), split_for_muon(model, 0.1)):
        where = {names[id(p)]: g["group"] for g in groups for p in g["params"]}
        assert set(where) == set(names.values())
        for name, group in where.items():
            if name.endswith(NEW_1D) or model.get_parameter(name).ndim == 1:
                assert group == "no_decay", name
    assert where["blocks.0.attn.branch.q_proj.weight"] == "muon"


@pytest.mark.parametrize("recipe", ["hybrid", "dyt", "layerscale"])
def test_muonclip_and_z_loss_train_with_them(recipe: str, tiny_data, tmp_path) -> None:
    """Muon + QK-Clip (tau low enough to clip: with QK-norm it scales the q/k gains) and z-loss
    on each: the run finishes with finite losses."""
    import json

    from normlab.launch.config import load_config
    from normlab.launch.training.trainer import Trainer

    from tests.conftest import REPO, tiny_overrides

    over = tiny_overrides(tiny_data, tmp_path, **{"training.steps": 4})
    over += ["optim.name=muon", "optim.muon_scale=match_rms_adamw", "optim.muon_ns_dtype=fp32",
             "optim.qk_clip={tau: 1.0, alpha: 0.5}", "optim.z_loss=1e-4",
             "training.threads=1", "model.qk_norm=head"]
    assert Trainer(load_config(REPO / "recipes" / f"{recipe}.yaml", over)).run() == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    assert sum(r.get("qk_clip_events", 0) for r in rows) > 0  # tau 1 binds: the clip acts
    assert any("z_loss" in r for r in rows)


# --- normlab export -------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["dyt", "hybrid", "keel"])
def test_export_refuses_in_one_line_unless_native_only(
    recipe: str, tiny_data, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    from normlab.launch.cli import main
    from normlab.launch.config import load_config
    from normlab.launch.training.trainer import Trainer

    from tests.conftest import REPO, tiny_overrides

    run = tmp_path / "run"
    over = tiny_overrides(tiny_data, run, training__steps=2, checkpoint__every=2)
    over += ["training.eval_every=0", "instruments={}", "training.threads=1"]
    assert Trainer(load_config(REPO / "recipes" / f"{recipe}.yaml", over)).run() == 0
    capsys.readouterr()
    code = main(["export", str(run), "--out", str(tmp_path / "hf")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no HF family has" in err and "--no-hf" in err
    assert not (tmp_path / "hf").exists()  # refused before anything is written
    assert main(["export", str(run), "--out", str(tmp_path / "native"), "--no-hf"]) == 0
    assert (tmp_path / "native" / "normlab").is_dir()


def test_validate_notes_the_double_shrink_and_refuses_in_one_line(capsys) -> None:
    from normlab.launch.cli import main

    assert _config(residual_scale="layerscale").notes()[0].startswith("model.residual_scale")
    assert _config(residual_scale="layerscale", init="normal").notes() == []
    assert main(["validate", "--quiet", "layerscale"]) == 0
    assert "both shrink the branch" in capsys.readouterr().out
    assert main(["validate", "--quiet", "dyt", "model.placement=post"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.norm 'dyt'" in err


@pytest.mark.parametrize("init", ["gpt2", "normal", "olmo2", "xavier", "megatron_small"])
@pytest.mark.parametrize("case", ["dyt_layerscale_qknorm_gqa", "derf", "hybrid_gqa", "keel"])
def test_every_init_scheme_keeps_the_constant_inits(init: str, case: str) -> None:
    model = Transformer(_config(**CASES[case], init=init))
    for name, p in model.named_parameters():
        if name.endswith("scale.weight"):
            assert torch.all(p == 0.1), name  # CaiT's ε at 2 blocks
        elif name.endswith(".alpha"):
            assert torch.all(p == 0.5), name
        elif name.endswith(".shift") or name.endswith(".bias"):
            assert torch.all(p == 0), name
        elif name == "embed_scale.scale":
            assert p.item() == pytest.approx(math.sqrt(D))
        elif p.ndim == 1:
            assert torch.all(p == 1), name  # norm and DyT gains
