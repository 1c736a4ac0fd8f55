"""Weight conversion to and from HF transformers where the architecture exists there.

pre + rmsnorm + swiglu <-> LlamaForCausalLM; the same with `head` QK-Norm <-> Qwen3ForCausalLM;
olmo2 + rmsnorm + swiglu + `flat` QK-Norm <-> Olmo2ForCausalLM. transformers is imported lazily:
it is a test/export extra, not a training dependency.
"""

from __future__ import annotations

from typing import Any

import torch

from .config import ModelConfig
from .transformer import Transformer

# model_type -> (placement, qk_norm, our norm names -> HF layernorm names)
FAMILIES: dict[str, tuple[str, str, dict[str, str]]] = {
    "llama": (
        "pre",
        "none",
        {"attn.norm_in": "input_layernorm", "mlp.norm_in": "post_attention_layernorm"},
    ),
    "qwen3": (
        "pre",
        "head",
        {"attn.norm_in": "input_layernorm", "mlp.norm_in": "post_attention_layernorm"},
    ),
    "olmo2": (
        "olmo2",
        "flat",
        {"attn.norm_out": "post_attention_layernorm", "mlp.norm_out": "post_feedforward_layernorm"},
    ),
}
# model_type -> (config class, model class) in transformers
HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
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
    matches = [f for f, (pl, qk, _) in FAMILIES.items() if (cfg.placement, cfg.qk_norm) == (pl, qk)]
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
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False,
        hidden_act="silu",
        attention_dropout=0.0,
        bos_token_id=(token_ids or {}).get("bos"),
        eos_token_id=(token_ids or {}).get("eos"),
        pad_token_id=(token_ids or {}).get("pad"),
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
    ours = {
        key: theirs[hf_key]
        for key, hf_key in key_map(cfg, family).items()
        if hf_key in theirs or not cfg.tie_embeddings
    }
    model.load_state_dict(ours, strict=not cfg.tie_embeddings)
    return model.eval()


def _check_complete(missing: list[str], unexpected: list[str], tied: bool) -> None:
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"HF conversion incomplete: missing {missing}, unexpected {unexpected}")


@torch.no_grad()
def max_logit_difference(model: Transformer, hf: Any, tokens: torch.Tensor) -> float:
    """max |logits_normlab - logits_hf| on `tokens` (B, T)."""
    return (model(tokens) - hf(tokens).logits).abs().max().item()
