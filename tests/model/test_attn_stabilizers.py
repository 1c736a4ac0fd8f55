"""Attention stabilizers (SCIENCE.md 12-14) against their references: gated attention against
transformers' Qwen3-Next, learned sinks against gpt-oss and GraniteSWA, both soft-caps against
Gemma 2 (cap before the mask), the sink gradients in float64 against a from-scratch softmax.

Module-level tests copy weights into the HF attention module; model-level tests go through
`normlab export`'s conversion (model/hf.py) both ways. Outputs and every gradient are compared.
"""

from __future__ import annotations

import math

import pytest
import torch
from normlab.model import ModelConfig, Transformer
from normlab.model.attention import Attention
from normlab.model.attention_cores import EagerCore, SDPACore, SinkCore

transformers = pytest.importorskip("transformers")

D_MODEL, HEADS, KV, HEAD_DIM, T = 64, 4, 2, 16, 11


def _attention(**kw) -> Attention:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=D_MODEL, n_heads=HEADS, n_kv_heads=KV, vocab_size=32,
                      max_seq_len=32, **kw)
    att = Attention(cfg)
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0, 0.3)  # weights (and sinks, norm gains) away from their init
    return att


def _causal_mask(t: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((t, t), float("-inf"), dtype=dtype).triu(1)[None, None]


def _grads(module: torch.nn.Module, x: torch.Tensor, out: torch.Tensor) -> dict[str, torch.Tensor]:
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)  # a fixed cotangent
    grads = torch.autograd.grad((out * w).sum(), [x, *module.parameters()])
    names = [n for n, _ in module.named_parameters()]
    return {"x": grads[0], **dict(zip(names, grads[1:], strict=True))}


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    assert a.shape == b.shape
    err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
    assert err < tol, f"relative max difference {err:.2e} >= {tol}"


# --- the cores ----------------------------------------------------------------------------
def test_eager_core_equals_sdpa_in_float64_with_gqa() -> None:
    torch.manual_seed(1)
    q = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 9, 8, dtype=torch.float64) for _ in range(2))
    ref, _ = SDPACore()(q, k, v, 0.0, False)
    out, bounds = EagerCore(4, None)(q, k, v, 0.0, True)
    assert (out - ref).abs().max() < 1e-14
    s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.equal(bounds[0], s.amax(dim=(0, 2, 3))) and torch.equal(bounds[0], bounds[1])


def _sink_reference(q, k, v, sinks):
    """p_ij = exp(S_ij) / (exp(s_h) + sum_j' exp(S_ij')) over j <= i, from scratch (no softmax)."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    future = torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).triu(1)
    m = torch.maximum(s.masked_fill(future, float("-inf")).amax(-1, keepdim=True),
                      sinks.view(1, -1, 1, 1))  # a shift for exp's range; cancels exactly
    e = torch.exp(s - m).masked_fill(future, 0.0)
    denom = torch.exp(sinks.view(1, -1, 1, 1) - m) + e.sum(-1, keepdim=True)
    return (e / denom) @ v


def test_sink_gradients_in_float64_match_a_from_scratch_softmax() -> None:
    """SCIENCE.md 13: a rescale by a non-differentiable lse gets q/k gradients wrong by ~1; the
    concatenated softmax must match the from-scratch formula in value and every gradient."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 3, 8, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    core = SinkCore(3, None).double()
    with torch.no_grad():
        core.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0]))
    out, _ = core(q, k, v, 0.0, False)
    ref = _sink_reference(q, k, v, core.sinks)
    assert (out - ref).abs().max() < 1e-14
    w = torch.randn_like(out)
    ours = torch.autograd.grad((out * w).sum(), [q, k, v, core.sinks])
    theirs = torch.autograd.grad((ref * w).sum(), [q, k, v, core.sinks])
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max() < 1e-13
    assert torch.autograd.gradcheck(lambda *t: core(*t, 0.0, False)[0], (q, k, v))


def test_sinks_take_mass_softcap_caps_before_the_mask() -> None:
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) * 4 for _ in range(3))
    core = SinkCore(2, None).double()
    with torch.no_grad():
        core.sinks.fill_(200.0)  # the sink takes all the mass: the head attends to nothing
    assert core(q, k, v, 0.0, False)[0].abs().max() < 1e-15
    capped, bounds = EagerCore(2, 0.5)(q, k, v, 0.0, True)
    # cap then mask: position 0 attends only to itself even though -inf would cap to -0.5
    assert torch.allclose(capped[:, :, 0], v[:, :, 0])
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    assert bounds[0].max() > 0.5 and torch.allclose(bounds[0], s.masked_fill(
        torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf")).amax(dim=(0, 2, 3)))


# --- module-level references ---------------------------------------------------------------
def _hf_rope(module_cls, config, x):
    position_ids = torch.arange(x.shape[1])[None]
    return module_cls(config)(x, position_ids)


def test_softcap_attention_equals_gemma2_attention() -> None:
    from transformers.models.gemma2 import modeling_gemma2 as g2

    att = _attention(attn_softcap=2.0)  # a small cap so it bites
    config = transformers.Gemma2Config(
        hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HEAD_DIM,
        query_pre_attn_scalar=HEAD_DIM, attn_logit_softcapping=2.0, attention_bias=False,
        layer_types=["full_attention"], num_hidden_layers=1, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "eager"
    hf = g2.Gemma2Attention(config, 0)
    hf.load_state_dict({k: v for k, v in att.state_dict().items() if "proj" in k})
    x = (torch.randn(2, T, D_MODEL) * 3).requires_grad_()
    ours = att(x)
    theirs = hf(x, _hf_rope(g2.Gemma2RotaryEmbedding, config, x), _causal_mask(T, x.dtype))[0]
    _close(ours, theirs, 2e-6)
    a, b = _grads(att, x, ours), _grads(hf, x, theirs)
    for name in ("x", "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"):
        _close(a[name], b[name], 2e-5)


def test_sinks_equal_gpt_oss_attention() -> None:
    from transformers.models.gpt_oss import modeling_gpt_oss as go

    att = _attention(attn_sinks=True)
    config = transformers.GptOssConfig(
        hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HEAD_DIM,
        attention_bias=False, layer_types=["full_attention"], num_hidden_layers=1,
        max_position_embeddings=32, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "eager"
    hf = go.GptOssAttention(config, 0)
    state = {k: v for k, v in att.state_dict().items() if "proj" in k}
    hf.load_state_dict({**state, "sinks": att.core.sinks.detach()})
    x = (torch.randn(2, T, D_MODEL) * 2).requires_grad_()
    ours = att(x)
    theirs = hf(x, _hf_rope(go.GptOssRotaryEmbedding, config, x), _causal_mask(T, x.dtype))[0]
    _close(ours, theirs, 2e-6)
    a, b = _grads(att, x, ours), _grads(hf, x, theirs)
    _close(a["core.sinks"], b["sinks"], 2e-5)
    for name in ("x", "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"):
        _close(a[name], b[name], 2e-5)


# --- model-level: export and import ---------------------------------------------------------
def _model(**kw) -> Transformer:
    torch.manual_seed(4)
    cfg = ModelConfig(n_layers=2, d_model=D_MODEL, n_heads=HEADS, n_kv_heads=KV, d_ff=96,
                      vocab_size=50, max_seq_len=32, **kw)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.normal_(1.0 if "norm" in name else 0.0, 0.3)  # gains and sinks off their init
            else:
                p.mul_(3.0)  # larger weights: the gate and sinks matter
    return model


def _model_grads(model, logits):
    w = torch.linspace(-1, 1, logits.numel()).view_as(logits)
    return dict(zip([n for n, _ in model.named_parameters()],
                    torch.autograd.grad((logits * w).sum(), list(model.parameters())), strict=True))


@pytest.mark.parametrize(
    ("kw", "family"),
    [
        (dict(qk_norm="head", attn_gate="elementwise"), "Qwen3NextForCausalLM"),
        (dict(qk_norm="head", attn_gate="headwise"), "Qwen3NextForCausalLM"),
        (dict(attn_sinks=True), "GraniteSWAForCausalLM"),
    ],
)
def test_export_and_import_match_hf_logits_and_gradients(kw, family) -> None:
    from normlab.model.hf import from_hf, to_hf

    model = _model(**kw)
    hf = to_hf(model)
    assert type(hf).__name__ == family
    tokens = torch.randint(0, 50, (2, T))
    ours, theirs = model(tokens), hf(tokens).logits
    _close(ours, theirs, 1e-5)
    if kw.get("attn_gate") == "elementwise":  # gradients of the same weights, fp32
        g_ours, g_hf = _model_grads(model, ours), _model_grads(hf, theirs)
        _close(g_ours["blocks.1.attn.branch.core.sinks" if "attn_sinks" in kw else
                      "blocks.0.mlp.branch.down_proj.weight"],
               g_hf["model.layers.0.mlp.down_proj.weight"], 1e-4)
        q = g_hf["model.layers.0.self_attn.q_proj.weight"].view(HEADS, 2 * HEAD_DIM, -1)
        _close(g_ours["blocks.0.attn.branch.gate.g_proj.weight"],
               q[:, HEAD_DIM:].reshape(HEADS * HEAD_DIM, -1), 1e-4)
        _close(g_ours["blocks.0.attn.branch.q_proj.weight"],
               q[:, :HEAD_DIM].reshape(HEADS * HEAD_DIM, -1), 1e-4)
    back = from_hf(hf)
    _close(back(tokens), ours.detach(), 1e-5)
    if kw.get("attn_gate") != "headwise":  # headwise comes back as its elementwise equal
        for k, v in model.state_dict().items():
            assert torch.allclose(back.state_dict()[k], v, atol=1e-6), k


def test_sink_gradients_through_granite_swa() -> None:
    from normlab.model.hf import to_hf

    model = _model(attn_sinks=True)
    hf = to_hf(model)
    tokens = torch.randint(0, 50, (2, T))
    ours, theirs = model(tokens), hf(tokens).logits
    g_ours, g_hf = _model_grads(model, ours), _model_grads(hf, theirs)
    for i in range(2):
        _close(g_ours[f"blocks.{i}.attn.branch.core.sinks"],
               g_hf[f"model.layers.{i}.self_attn.sinks"], 1e-4)
        _close(g_ours[f"blocks.{i}.attn.branch.q_proj.weight"],
               g_hf[f"model.layers.{i}.self_attn.q_proj.weight"], 1e-4)


def test_final_softcap_is_gemma2s_and_the_loss_sees_it() -> None:
    from normlab.model import lm_loss

    capped = _model(final_softcap=0.5)
    plain = Transformer(ModelConfig(**{**capped.config.to_dict(), "final_softcap": None}))
    plain.load_state_dict(capped.state_dict())
    tokens = torch.randint(0, 50, (2, T))
    z = plain(tokens)
    # Gemma2ForCausalLM.forward: logits / cap, tanh, * cap
    assert torch.allclose(capped(tokens), torch.tanh(z / 0.5) * 0.5, atol=1e-6)
    assert capped(tokens).abs().max() < 0.5 < z.abs().max()
    assert lm_loss(capped(tokens), tokens) != lm_loss(z, tokens)


# --- configuration ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(attn_gate="sigmoid"), "model.attn_gate must be one of 'none', 'headwise', "),
        (dict(attn_softcap=-1.0), "model.attn_softcap must be a cap > 0"),
        (dict(final_softcap=0.0), "model.final_softcap must be a cap > 0"),
        (dict(attn_sinks="yes"), "model.attn_sinks must be of type bool"),
    ],
)
def test_bad_values_name_the_key(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kw)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(attn_gate="elementwise"), "qwen3_next, which needs placement=pre and qk_norm=head"),
        (dict(attn_sinks=True, qk_norm="head"), "granite_swa, which needs placement=pre"),
        (dict(attn_softcap=50.0), "no exact HF family for soft-capped logits"),
        (dict(attn_gate="headwise", attn_sinks=True, qk_norm="head"), "both a gated attention"),
    ],
)
def test_export_refuses_what_no_family_has(kw, message) -> None:
    from normlab.model.hf import hf_family

    with pytest.raises(ValueError, match=message):
        hf_family(ModelConfig(**kw))


def test_kernel_named_and_parameters_grouped() -> None:
    """SDPA on the default path; eager for caps and sinks. W_g is a 2-D hidden weight (Muon when
    Muon is on), the sinks 1-D (AdamW, no weight decay) -- normlab's ndim rule."""
    assert _attention().core.kernel == "sdpa"
    assert _attention(attn_softcap=50.0).core.kernel == "eager"
    assert _attention(attn_sinks=True).core.kernel == "eager"
    gated = _attention(attn_gate="headwise", attn_sinks=True)
    shapes = {n: p.ndim for n, p in gated.named_parameters()}
    assert shapes["gate.g_proj.weight"] == 2 and shapes["core.sinks"] == 1
    assert gated.gate.g_proj.weight.shape == (HEADS, D_MODEL)


@pytest.mark.parametrize(
    "kw",
    [dict(attn_gate="headwise", bias=True), dict(attn_gate="elementwise"),
     dict(attn_sinks=True, n_kv_heads=2), dict(attn_softcap=50.0, final_softcap=30.0)],
)
def test_analytic_parameter_count(kw) -> None:
    from normlab.model import count_params

    cfg = ModelConfig(n_layers=2, d_model=D_MODEL, n_heads=HEADS, vocab_size=50, **kw)
    assert count_params(cfg) == Transformer(cfg).num_params()
