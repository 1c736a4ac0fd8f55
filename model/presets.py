"""Model-size presets a recipe picks with `model.preset` (explicit fields override them).

Shapes follow the usual Llama/OLMo family at each size: d_ff is the SwiGLU width, about 8/3 d
rounded to a multiple of 64 (11008 at 7B, as Llama 2).
"""

from __future__ import annotations

from typing import Any

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


def count_params(cfg: Any) -> int:
    """Analytic parameter count of a ModelConfig (checks the built model in tests)."""
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    n_mats = 3 if cfg.mlp == "swiglu" else 2
    norm_size = d * (2 if cfg.norm == "layernorm" else 1)
    norms_per_block = {"post": 2, "pre": 2, "peri": 4, "olmo2": 2, "deepnorm": 2, "mix": 2}
    qk = {"none": 0, "head": 2 * cfg.head_dim, "flat": d + kv}[cfg.qk_norm]
    bias = (2 * d + 2 * kv + cfg.d_ff * (n_mats - 1) + d) if cfg.bias else 0
    block = 2 * d * d + 2 * d * kv + n_mats * d * cfg.d_ff
    block += norms_per_block[cfg.placement] * norm_size + qk + bias
    gate = {"none": 0, "headwise": cfg.n_heads, "elementwise": d}[cfg.attn_gate]  # W_g columns
    block += gate * (d + int(cfg.bias)) + (cfg.n_heads if cfg.attn_sinks else 0)
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    extra_norms = int(cfg.has_final_norm) + int(cfg.embed_norm)
    return cfg.n_layers * block + embed + extra_norms * norm_size
