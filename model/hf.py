"""Weight conversion to and from HF transformers where the architecture exists there.

pre + rmsnorm + swiglu <-> LlamaForCausalLM; the same with `head` QK-Norm <-> Qwen3ForCausalLM;
olmo2 + rmsnorm + swiglu + `flat` QK-Norm <-> Olmo2ForCausalLM. Attention stabilizers
(SCIENCE.md 12-13): pre + `head` QK-Norm + a gate <-> Qwen3NextForCausalLM (all layers full
attention, dense MLP; the gate packed into q_proj per head, every norm gain stored as g - 1);
pre + no QK-Norm + sinks <-> GraniteSWAForCausalLM (all layers full attention, unit multipliers).
transformers is imported lazily: it is a test/export extra, not a training dependency.
"""

from __future__ import annotations

from typing import Any

import torch

from .config import ModelConfig
from .hf_fold import fold_parametrization, fold_residual_scales, refuse_norm_side
from .transformer import Transformer

# our norm names -> HF layernorm names of the Llama-style pre-norm block
PRE_NORMS = {"attn.norm_in": "input_layernorm", "mlp.norm_in": "post_attention_layernorm"}
# model_type -> (placement, qk_norm, our norm names -> HF layernorm names)
FAMILIES: dict[str, tuple[str, str, dict[str, str]]] = {
    "llama": ("pre", "none", PRE_NORMS),
    "qwen3": ("pre", "head", PRE_NORMS),
    "olmo2": (
        "olmo2",
        "flat",
        {"attn.norm_out": "post_attention_layernorm", "mlp.norm_out": "post_feedforward_layernorm"},
    ),
    "qwen3_next": ("pre", "head", PRE_NORMS),
    "granite_swa": ("pre", "none", PRE_NORMS),
}
# model_type -> the attention stabilizers it has: (gated, sinks); every other family has neither
STABILIZERS = {"qwen3_next": (True, False), "granite_swa": (False, True)}
# model_type -> (config class, model class) in transformers
HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM"),
}
LINEARS = {
    "attn.branch.q_proj": "self_attn.q_proj",
    "attn.branch.k_proj": "self_attn.k_proj",
    "attn.branch.v_proj": "self_attn.v_proj",
    "attn.branch.o_proj": "self_attn.o_proj",
    "mlp.branch.gate_proj": "mlp.gate_proj",
    "mlp.branch.up_proj": "mlp.up_proj",
    "mlp.branch.down_proj": "mlp.down_proj",
}
QK_NORMS = {"attn.branch.q_norm": "self_attn.q_norm", "attn.branch.k_norm": "self_attn.k_norm"}


def hf_family(cfg: ModelConfig) -> str:
    """The HF model_type whose architecture equals `cfg`, or ValueError naming what differs."""
    refuse_norm_side(cfg)  # DyT/Derf, HybridNorm, Keel; residual scales off pre/olmo2
    if cfg.attn_softcap is not None or cfg.final_softcap is not None:
        raise ValueError(
            "no exact HF family for soft-capped logits here: Gemma 2 also needs Peri-LN with "
            "(1 + w) gains, GeGLU-tanh and a scaled embedding (SCIENCE.md 14); set "
            "model.attn_softcap and model.final_softcap to null to export"
        )
    has = (cfg.attn_gate != "none", cfg.attn_sinks)
    if has == (True, True):
        raise ValueError("no HF family has both a gated attention and sinks (model.attn_gate, "
                         "model.attn_sinks); Qwen3-Next has the gate, GraniteSWA the sinks")
    matches = [
        f
        for f, (pl, qk, _) in FAMILIES.items()
        if (cfg.placement, cfg.qk_norm) == (pl, qk) and STABILIZERS.get(f, (False, False)) == has
    ]
    if not matches and has == (True, False):
        raise ValueError(
            "a gated model exports to HF qwen3_next, which needs placement=pre and "
            f"qk_norm=head (its attention always applies q_norm/k_norm); got "
            f"placement={cfg.placement!r}, qk_norm={cfg.qk_norm!r}"
        )
    if not matches and has == (False, True):
        raise ValueError(
            "a model with attention sinks exports to HF granite_swa, which needs placement=pre "
            f"and qk_norm=none; got placement={cfg.placement!r}, qk_norm={cfg.qk_norm!r}"
        )
    if not matches:
        raise ValueError(
            f"no HF transformers architecture for placement={cfg.placement!r}, "
            f"qk_norm={cfg.qk_norm!r}; convertible: pre+none (Llama), pre+head (Qwen3), "
            "olmo2+flat (OLMo 2)"
        )
    if (cfg.norm, cfg.mlp, cfg.ln_scaling, cfg.bias) != ("rmsnorm", "swiglu", False, False):
        raise ValueError(
            f"HF {matches[0]} needs norm=rmsnorm, mlp=swiglu, ln_scaling=false, bias=false; got "
            f"norm={cfg.norm}, mlp={cfg.mlp}, ln_scaling={cfg.ln_scaling}, bias={cfg.bias}"
        )
    return matches[0]


def key_map(cfg: ModelConfig, family: str) -> dict[str, str]:
    """normlab state_dict key -> HF state_dict key."""
    norms = FAMILIES[family][2]
    per_layer = {**LINEARS, **norms, **(QK_NORMS if cfg.qk_norm != "none" else {})}
    mapping = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight"}
    if cfg.has_final_norm:
        mapping["final_norm.weight"] = "model.norm.weight"
    for i in range(cfg.n_layers):
        for ours, theirs in per_layer.items():
            mapping[f"blocks.{i}.{ours}.weight"] = f"model.layers.{i}.{theirs}.weight"
    return mapping


def hf_config(cfg: ModelConfig, token_ids: dict[str, int | None] | None = None) -> Any:
    """The HF config of `cfg`. token_ids: the tokenizer's bos/eos/pad ids (None: no such token);
    never the family's defaults, which belong to another tokenizer (OLMo 2: eos 50279). The
    pad id is the tokenizer's own pad token only, never EOS: HF makes it the embedding's
    padding_idx, whose row gets no gradient when fine-tuning (a tokenizer without a pad token
    pads with EOS in the tokenizer and generation config instead)."""
    import transformers

    family = hf_family(cfg)
    config_cls = getattr(transformers, HF_CLASSES[family][0])
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    extra: dict[str, Any] = {}
    if family in STABILIZERS:  # every layer full attention, nothing the normlab block lacks
        extra["layer_types"] = ["full_attention"] * cfg.n_layers
    if family == "qwen3_next":  # dense MLP, RoPE on the whole head (defaults: 512 experts, 0.25)
        extra |= {"num_experts": 0, "partial_rotary_factor": 1.0}
        rope["partial_rotary_factor"] = 1.0
    if family == "granite_swa":  # its softmax scale is attention_multiplier (default 1.0)
        extra |= {"attention_multiplier": cfg.head_dim**-0.5, "embedding_multiplier": 1.0,
                  "residual_multiplier": 1.0, "logits_scaling": 1.0,
                  "sliding_window": cfg.max_seq_len}  # unused: no layer slides
    return config_cls(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False,
        hidden_act="silu",
        attention_dropout=0.0,
        bos_token_id=(token_ids or {}).get("bos"),
        eos_token_id=(token_ids or {}).get("eos"),
        pad_token_id=(token_ids or {}).get("pad"),
        **extra,
    )


def to_hf(model: Transformer, token_ids: dict[str, int | None] | None = None) -> Any:
    """A HF *ForCausalLM holding a copy of `model`'s weights (fp32 logits agree to ~1e-5).
    token_ids: bos/eos/pad of the tokenizer (see hf_config); generation pads with its pad
    token, else EOS."""
    import transformers

    cfg = model.config
    family = hf_family(cfg)
    model_cls = getattr(transformers, HF_CLASSES[family][1])
    hf = model_cls(hf_config(cfg, token_ids)).to(model.embed.weight.dtype)
    pad = hf.config.pad_token_id
    hf.generation_config.pad_token_id = hf.config.eos_token_id if pad is None else pad
    ours = model.state_dict()
    theirs = {hf_key: ours[key] for key, hf_key in key_map(cfg, family).items()}
    theirs |= stabilizer_weights(cfg, family, ours, theirs)
    theirs |= fold_residual_scales(cfg, ours, theirs)  # diag(λ) W_o, ...; one-way
    theirs |= fold_parametrization(cfg, theirs)  # µP/CompleteP multipliers; one-way
    missing, unexpected = hf.load_state_dict(theirs, strict=False)
    _check_complete(missing, unexpected, tied=cfg.tie_embeddings)
    return hf.eval()


def from_hf(hf: Any, **overrides: Any) -> Transformer:
    """A normlab Transformer with the weights of a HF Llama, Qwen3 or OLMo 2 model."""
    c = hf.config
    family = c.model_type
    if family not in FAMILIES:
        raise ValueError(f"cannot convert HF model_type {family!r}; allowed: {sorted(FAMILIES)}")
    placement, qk_norm, _ = FAMILIES[family]
    gated, sinks = STABILIZERS.get(family, (False, False))
    if gated:
        overrides.setdefault("attn_gate", "elementwise")
    if sinks:
        overrides.setdefault("attn_sinks", True)
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", 1e4)}
    cfg = ModelConfig(
        n_layers=c.num_hidden_layers,
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        d_ff=c.intermediate_size,
        vocab_size=c.vocab_size,
        max_seq_len=c.max_position_embeddings,
        mlp="swiglu",
        norm="rmsnorm",
        norm_eps=c.rms_norm_eps,
        placement=placement,
        qk_norm=qk_norm,
        tie_embeddings=bool(c.tie_word_embeddings),
        rope_theta=float(rope["rope_theta"]),
        **overrides,
    )
    if c.hidden_size // c.num_attention_heads != getattr(c, "head_dim", cfg.head_dim):
        raise ValueError(f"HF head_dim {c.head_dim} != hidden_size / num_attention_heads")
    model = Transformer(cfg).to(next(hf.parameters()).dtype)
    theirs = hf.state_dict()
    theirs = theirs | stabilizer_import(cfg, family, theirs)
    ours = {
        key: theirs[hf_key]
        for key, hf_key in key_map(cfg, family).items()
        if hf_key in theirs or not cfg.tie_embeddings
    }
    ours |= {k: v for k, v in theirs.items() if k.startswith("blocks.")}  # gate, sinks
    model.load_state_dict(ours, strict=not cfg.tie_embeddings)
    return model.eval()


def stabilizer_weights(
    cfg: ModelConfig, family: str, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """HF tensors that differ from a plain copy: Qwen3-Next's q_proj packs per query head
    [W_q^h (d_h rows); W_g^h (d_h rows)] and stores every RMSNorm gain as w = g - 1 (it computes
    x̂ (1 + w)); a headwise gate repeats each head's row d_h times. GraniteSWA adds the sinks."""
    out: dict[str, torch.Tensor] = {}
    H, D = cfg.n_heads, cfg.head_dim
    for i in range(cfg.n_layers):
        ours_i, theirs_i = f"blocks.{i}.attn.branch", f"model.layers.{i}.self_attn"
        if family == "qwen3_next":
            q = ours[f"{ours_i}.q_proj.weight"].view(H, D, -1)
            g = ours[f"{ours_i}.gate.g_proj.weight"]
            g = (g.repeat_interleave(D, dim=0) if g.shape[0] == H else g).view(H, D, -1)
            out[f"{theirs_i}.q_proj.weight"] = torch.cat([q, g], dim=1).reshape(2 * H * D, -1)
        if family == "granite_swa":
            out[f"{theirs_i}.sinks"] = ours[f"{ours_i}.core.sinks"]
    if family == "qwen3_next":
        out |= {k: v - 1 for k, v in theirs.items() if "norm" in k and k not in out}
    return out


def stabilizer_import(
    cfg: ModelConfig, family: str, theirs: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The inverse of stabilizer_weights on a HF state_dict: HF keys with normlab's values, plus
    the normlab-only keys (gate, sinks) under their normlab names."""
    out: dict[str, torch.Tensor] = {}
    H, D = cfg.n_heads, cfg.head_dim
    if family == "qwen3_next":
        out |= {k: v + 1 for k, v in theirs.items() if "norm" in k}
    for i in range(cfg.n_layers):
        ours_i, theirs_i = f"blocks.{i}.attn.branch", f"model.layers.{i}.self_attn"
        if family == "qwen3_next":
            packed = theirs[f"{theirs_i}.q_proj.weight"].view(H, 2 * D, -1)
            out[f"{theirs_i}.q_proj.weight"] = packed[:, :D].reshape(H * D, -1)
            out[f"{ours_i}.gate.g_proj.weight"] = packed[:, D:].reshape(H * D, -1)
        if family == "granite_swa":
            out[f"{ours_i}.core.sinks"] = theirs[f"{theirs_i}.sinks"]
    return out


def _check_complete(missing: list[str], unexpected: list[str], tied: bool) -> None:
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"HF conversion incomplete: missing {missing}, unexpected {unexpected}")
