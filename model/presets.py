"""Model-size presets a recipe picks with `model.preset` (explicit fields override them).

Shapes follow the usual Llama/OLMo family at each size: d_ff is the SwiGLU width, about 8/3 d
rounded to a multiple of 64 (11008 at 7B, as Llama 2).
"""

from __future__ import annotations

from typing import Any

from .config import SCALED_KINDS, sublayer_kind

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_layers=4, d_model=128, n_heads=4, d_ff=384, max_seq_len=256, vocab_size=4096),
    "125m": dict(
        n_layers=12, d_model=768, n_heads=12, d_ff=2048, max_seq_len=2048, vocab_size=32000
    ),
    "350m": dict(
        n_layers=24, d_model=1024, n_heads=16, d_ff=2752, max_seq_len=2048, vocab_size=32000
    ),
    "1b": dict(
        n_layers=16, d_model=2048, n_heads=16, d_ff=8192, max_seq_len=4096, vocab_size=32000
    ),
    "7b": dict(
        n_layers=32, d_model=4096, n_heads=32, d_ff=11008, max_seq_len=4096, vocab_size=32000
    ),
}


def norm_params(cfg: Any) -> int:
    """Parameters of one residual-stream norm: gain (and LayerNorm's bias); DyT g, b, alpha;
    Derf g, b, alpha, s."""
    d = cfg.d_model
    return {"layernorm": 2 * d, "rmsnorm": d, "dyt": 2 * d + 1, "derf": 2 * d + 2}[cfg.norm]


# norms of one block by its wrapper kind (model.config.sublayer_kind)
NORMS_PER_BLOCK = {
    "post": 2, "pre": 2, "ln_scaling": 2, "peri": 4, "olmo2": 2, "deepnorm": 2, "hybrid": 1,
    "keel": 4,
}


def count_params(cfg: Any) -> int:
    """Analytic parameter count of a ModelConfig (checks the built model in tests)."""
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    n_mats = 3 if cfg.mlp == "swiglu" else 2
    qk = {"none": 0, "head": 2 * cfg.head_dim, "flat": d + kv}[cfg.qk_norm]
    qk += cfg.head_dim if cfg.has_v_norm else 0
    bias = (2 * d + 2 * kv + cfg.d_ff * (n_mats - 1) + d) if cfg.bias else 0
    block = 2 * d * d + 2 * d * kv + n_mats * d * cfg.d_ff + qk + bias
    gate = {"none": 0, "headwise": cfg.n_heads, "elementwise": d}[cfg.attn_gate]  # W_g columns
    block += gate * (d + int(cfg.bias)) + (cfg.n_heads if cfg.attn_sinks else 0)
    scale = {"none": 0, "layerscale": 2 * d, "scalar": 2}[cfg.residual_scale]  # λ per sub-layer
    total = 0
    for layer in range(1, cfg.n_layers + 1):
        kind = sublayer_kind(cfg, layer)
        total += block + NORMS_PER_BLOCK[kind] * norm_params(cfg)
        total += scale if kind in SCALED_KINDS else 0
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    embed += 1 if cfg.norm in ("dyt", "derf") else 0  # the embedding scalar
    extra_norms = int(cfg.has_final_norm) + int(cfg.embed_norm)
    return total + embed + extra_norms * norm_params(cfg)
