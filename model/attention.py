"""Causal self-attention with grouped-query heads, RoPE and optional QK-Norm (SCIENCE.md 4).

The exact and the lse-bounded max-logit kernels QK-Clip reads live in attention_lse.py; they run
from hooks on `Attention.qk_tap` and `Attention.core` (launch/instruments/attention.py,
launch/instruments/qk_clip.py), never from the model itself.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention_cores import build_core
from .attention_lse import attention_with_lse_bounds, causal_max_logits
from .config import ModelConfig
from .gating import build_gate
from .norms import RMSNorm
from .parametrization import query_mult
from .placements import const_scale
from .rope import apply_rope, rope_tables


class HeadQKNorm(RMSNorm):
    """QK-Norm on the `head` axis (Qwen3, Gemma 3): each head's d_head vector, one shared gain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H, D)
        return super().forward(x)


class FlatQKNorm(RMSNorm):
    """QK-Norm on the `flat` axis (OLMo 2): the concatenated H * d_head vector, before the split."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H, D)
        return super().forward(x.flatten(-2)).view_as(x)


class QKTap(nn.Module):
    """Identity on the query and key heads (B, H, T, D) exactly as the logits q k^T / sqrt(d_head)
    see them: after QK-Norm, µP's q multiplier and RoPE. Forward hooks on it measure the per-head
    max logit (QK-Clip, the attention_logits instrument; SCIENCE.md 7)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


def build_qk_norm(cfg: ModelConfig, n_heads: int) -> nn.Module:
    if cfg.qk_norm == "head":
        return HeadQKNorm(cfg.head_dim, eps=cfg.norm_eps)
    if cfg.qk_norm == "flat":
        return FlatQKNorm(n_heads * cfg.head_dim, eps=cfg.norm_eps)
    return nn.Identity()


class Attention(nn.Module):
    """softmax(q k^T / sqrt(d_head)) v over causal positions, via `core` (attention_cores.py:
    scaled_dot_product_attention unless sinks or a soft-cap need the eager form).

    Two hook points let instruments observe the logits from outside (SCIENCE.md 7): `qk_tap`
    passes the logits' q and k through (a forward hook computes the exact per-head max with
    `causal_max_logits`), and `core` is called without bounds (a forward pre-hook that sets
    `bounds=True` makes it return the fused kernel's (lower, upper) lse bounds on that max, which
    a forward hook on the core reads from its output). Without hooks neither is computed.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.bias)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.q_norm = build_qk_norm(cfg, cfg.n_heads)
        # µP α_attn / d_head as a factor on q over SDPA's 1/sqrt(d_head) (SCIENCE.md 21.1)
        self.q_mult = const_scale(query_mult(cfg))
        self.k_norm = build_qk_norm(cfg, cfg.n_kv_heads)
        # HybridNorm's N_v: per KV head over d_head, like `head` QK-Norm (SCIENCE.md 17)
        v_norm = HeadQKNorm(cfg.head_dim, eps=cfg.norm_eps) if cfg.has_v_norm else None
        self.v_norm = v_norm or nn.Identity()
        self.core = build_core(cfg.n_heads, cfg.attn_sinks, cfg.attn_softcap)  # softmax(S+M) V
        self.gate = build_gate(cfg.attn_gate, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.bias)
        self.dropout_p = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.qk_tap = QKTap()
        self._rope_args = (cfg.max_seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.reset_rope()

    def reset_rope(self) -> None:
        """(Re)build the RoPE tables, e.g. after materialising a model built on the meta device."""
        cos, sin = rope_tables(*self._rope_args)
        device = self.q_proj.weight.device
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_mult(self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)))
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim))
        v = self.v_norm(self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim))
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        q, k, v = (
            apply_rope(q.transpose(1, 2), cos, sin),
            apply_rope(k.transpose(1, 2), cos, sin),
            v.transpose(1, 2),
        )  # (B, H, T, D)
        q, k = self.qk_tap(q, k)  # the hook point of the max-logit instruments and QK-Clip
        dropout_p = self.dropout_p if self.training else 0.0
        y, _ = self.core(q, k, v, dropout_p)  # (B, H, T, D); bounds only when a pre-hook asks
        y = self.gate(x, y)  # O ⊙ σ(X W_g), or O
        return self.resid_dropout(self.o_proj(y.transpose(1, 2).reshape(B, T, -1)))


__all__ = [
    "Attention",
    "FlatQKNorm",
    "HeadQKNorm",
    "QKTap",
    "attention_with_lse_bounds",
    "build_qk_norm",
    "causal_max_logits",
]
