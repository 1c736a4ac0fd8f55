"""The norm-side stabilizers at the HF boundary (SCIENCE.md 15-18).

No HF decoder family has a residual scale, DyT/Derf, HybridNorm or Keel. A residual scale is the
last linear map on its branch, so it folds exactly into a weight that is exported: Pre-LN's
o_proj / down_proj rows (diag(λ) W), OLMo 2's post-sub-layer norm gains (λ ⊙ g). The export is
one-way: importing gives λ = 1 (no scale). The others are refused with one line.
"""

from __future__ import annotations

import torch

from .config import POINTWISE_NORMS, ModelConfig
from .parametrization import input_mult, output_mult, query_mult, residual_mult

# placement -> {our sub-layer: the HF weight its λ folds into}
FOLDS = {
    "pre": {"attn": "self_attn.o_proj.weight", "mlp": "mlp.down_proj.weight"},
    "olmo2": {
        "attn": "post_attention_layernorm.weight",
        "mlp": "post_feedforward_layernorm.weight",
    },
}


def unexportable(cfg: ModelConfig) -> str | None:
    """Why no HF family can hold `cfg`'s norm-free layers or placement (None: nothing here)."""
    if cfg.norm in POINTWISE_NORMS:
        return f"no HF family has {cfg.norm} (model.norm; SCIENCE.md 16): export refuses it"
    if cfg.placement in ("hybrid", "hybrid_star", "keel"):
        return f"no HF family has placement {cfg.placement!r} (SCIENCE.md 17-18): export refuses it"
    return None


def refuse_parametrization(cfg: ModelConfig) -> None:
    """ValueError (one line) where µP/CompleteP multipliers cannot fold into HF weights."""
    if cfg.parametrization == "sp":
        return
    tied = cfg.tie_embeddings and (input_mult(cfg) != 1.0 or output_mult(cfg) != 1.0)
    if tied:
        raise ValueError(
            f"model.parametrization {cfg.parametrization} with model.tie_embeddings: the input "
            "and output multipliers cannot both fold into one shared matrix; export refuses it"
        )
    if cfg.attn_gate != "none" or cfg.attn_sinks:
        raise ValueError(
            f"model.parametrization {cfg.parametrization}: its multipliers are folded for the "
            "llama, qwen3 and olmo2 families only (model.attn_gate / model.attn_sinks set)"
        )


def fold_parametrization(cfg: ModelConfig, theirs: dict[str, torch.Tensor]) -> dict:
    """HF tensors with the µP/CompleteP multipliers folded in (SCIENCE.md 21): α_in into the
    embedding, α_out / m_N into the head, m_L^-α into what closes each branch (pre: o_proj and
    down_proj; olmo2: the post-sub-layer norm gains), α_attn / sqrt(d_head) into q (its
    projection, or its QK-norm gain). Exact: each is a scalar on a linear map's output."""
    if cfg.parametrization == "sp":
        return {}
    out: dict[str, torch.Tensor] = {}

    def scale(key: str, c: float) -> None:
        if c != 1.0:
            for k in (key, key.removesuffix(".weight") + ".bias"):
                if k in theirs:
                    out[k] = theirs[k] * c

    scale("model.embed_tokens.weight", input_mult(cfg))
    scale("lm_head.weight", output_mult(cfg))
    q_key = "self_attn.q_norm.weight" if cfg.qk_norm != "none" else "self_attn.q_proj.weight"
    for i in range(cfg.n_layers):
        for hf_key in FOLDS.get(cfg.placement, {}).values():
            scale(f"model.layers.{i}.{hf_key}", residual_mult(cfg))
        scale(f"model.layers.{i}.{q_key}", query_mult(cfg))
    return out


def refuse_norm_side(cfg: ModelConfig) -> None:
    """ValueError (one line) for what no HF family holds, residual scales off pre/olmo2 too."""
    reason = unexportable(cfg)
    if reason is not None:
        raise ValueError(reason)
    refuse_parametrization(cfg)
    if cfg.residual_scale != "none" and cfg.placement not in FOLDS:
        raise ValueError(
            f"model.residual_scale folds into an HF weight for placement pre or olmo2 only, "
            f"got placement {cfg.placement!r}"
        )


def fold_residual_scales(
    cfg: ModelConfig, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """HF tensors with each block's λ folded in (nothing without a residual scale). `theirs`
    holds the HF tensors before folding (Qwen3-Next's norm gains are stored as g - 1, but the
    pre fold touches only linear weights)."""
    if cfg.residual_scale == "none":
        return {}
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg.n_layers):
        for sub, hf_key in FOLDS[cfg.placement].items():
            lam = ours[f"blocks.{i}.{sub}.scale.weight"]
            w = theirs[f"model.layers.{i}.{hf_key}"]
            out[f"model.layers.{i}.{hf_key}"] = lam[:, None] * w if w.ndim == 2 else lam * w
    return out
