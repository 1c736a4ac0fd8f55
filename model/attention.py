"""Causal self-attention with grouped-query heads, RoPE and optional QK-Norm (SCIENCE.md 4)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend

from .config import ModelConfig
from .norms import RMSNorm
from .rope import apply_rope, rope_tables


class HeadQKNorm(RMSNorm):
    """QK-Norm on the `head` axis (Qwen3, Gemma 3): each head's d_head vector, one shared gain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H, D)
        return super().forward(x)


class FlatQKNorm(RMSNorm):
    """QK-Norm on the `flat` axis (OLMo 2): the concatenated H * d_head vector, before the split."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H, D)
        return super().forward(x.flatten(-2)).view_as(x)


def build_qk_norm(cfg: ModelConfig, n_heads: int) -> nn.Module:
    if cfg.qk_norm == "head":
        return HeadQKNorm(cfg.head_dim, eps=cfg.norm_eps)
    if cfg.qk_norm == "flat":
        return FlatQKNorm(n_heads * cfg.head_dim, eps=cfg.norm_eps)
    return nn.Identity()


class Attention(nn.Module):
    """softmax(q k^T / sqrt(d_head)) v over causal positions, via scaled_dot_product_attention.

    With `record_max_logits` set, also stores `max_logits` (n_heads,): the exact per-head maximum
    pre-softmax logit over the batch and all unmasked (i, j), as QK-Clip needs (SCIENCE.md 7).
    With `record_lse_bound` set, runs a fused kernel that also returns each row's log-sum-exp and
    stores `lse_bounds` (lower, upper), each (n_heads,): the cheap bound on that maximum.
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
        self.k_norm = build_qk_norm(cfg, cfg.n_kv_heads)
        self.dropout_p = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.record_max_logits = False
        self.max_logits: torch.Tensor | None = None
        self.record_lse_bound = False
        self.lse_bounds: tuple[torch.Tensor, torch.Tensor] | None = None
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
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim))
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        q, k, v = (
            apply_rope(q.transpose(1, 2), cos, sin),
            apply_rope(k.transpose(1, 2), cos, sin),
            v.transpose(1, 2),
        )  # (B, H, T, D)
        if self.record_max_logits:
            self.max_logits = causal_max_logits(q, k)
        dropout_p = self.dropout_p if self.training else 0.0
        if self.record_lse_bound:
            y, self.lse_bounds = attention_with_lse_bounds(q, k, v, dropout_p)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=k.shape[1] != q.shape[1]
            )
        return self.resid_dropout(self.o_proj(y.transpose(1, 2).reshape(B, T, -1)))


@torch.no_grad()
def causal_max_logits(q: torch.Tensor, k: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Per-head max of q_i . k_j / sqrt(d) over batch and j <= i, streamed over query chunks.

    q: (B, H, T, D), k: (B, H_kv, T, D). Returns (H,) in fp32; no T x T matrix is kept whole.
    """
    B, H, T, D = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1).float()
    best = torch.full((H,), float("-inf"), device=q.device)
    for start in range(0, T, chunk):
        qc = q[:, :, start : start + chunk].float()
        s = qc @ k.transpose(-1, -2) / math.sqrt(D)  # (B, H, c, T)
        rows = torch.arange(start, start + qc.shape[2], device=q.device)[:, None]
        s = s.masked_fill(torch.arange(T, device=q.device)[None, :] > rows, float("-inf"))
        best = torch.maximum(best, s.amax(dim=(0, 2, 3)))
    return best


def attention_with_lse_bounds(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Causal attention that also yields per-head bounds on the max logit (SCIENCE.md 7), with
    the output bit-identical to `F.scaled_dot_product_attention`'s.

    The fused kernels keep each row's lse_i = log sum_j exp(s_ij); with n_i = i + 1 unmasked keys,
    lse_i - log(n_i) <= max_j s_ij <= lse_i. The kernel SDPA itself would choose is called with
    SDPA's arguments (ATen's op directly: the public call does not return its lse), so training is
    unchanged. Where SDPA would take a path that keeps no lse (its math path: dropout on the CPU,
    for one), SDPA runs as usual and both bounds are the exact streamed maximum. Returns the
    output (B, H, T, D) and the (lower, upper) bounds (H,) maximised over batch and rows.
    """
    gqa = k.shape[1] != q.shape[1]
    fused = _fused_attention_lse(q, k, v, dropout_p, gqa)
    if fused is None:
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=gqa
        )
        exact = causal_max_logits(q, k)
        return y, (exact, exact)
    y, lse = fused  # lse (B, H, T) in fp32
    log_n = torch.arange(1, q.shape[2] + 1, device=q.device, dtype=torch.float32).log()
    lower = (lse.float() - log_n).amax(dim=(0, 2))
    return y, (lower.detach(), lse.float().amax(dim=(0, 2)).detach())


def _fused_attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, gqa: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(output, lse) from the fused kernel SDPA picks for these inputs, called as SDPA calls it;
    None when SDPA would pick a kernel this does not mirror."""
    aten = torch.ops.aten
    choice = _sdp_choice(q, k, v, dropout_p, gqa)
    if choice == _FLASH and q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, True)[:2]
    if choice == _FLASH and q.shape[-1] % 8 == 0:  # SDPA pads other sizes
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, True)[:2]
    if choice == _EFFICIENT and not gqa:
        return aten._scaled_dot_product_efficient_attention(q, k, v, None, True, dropout_p, True)[
            :2
        ]
    return None


_FLASH, _EFFICIENT = int(SDPBackend.FLASH_ATTENTION), int(SDPBackend.EFFICIENT_ATTENTION)


@torch.compiler.assume_constant_result
def _sdp_choice(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, gqa: bool
) -> int:
    """The kernel SDPA would pick: fixed by shapes, dtypes and device, so torch.compile takes it
    as a constant instead of breaking the graph of a compiled block at this call."""
    return int(torch._fused_sdp_choice(q, k, v, None, dropout_p, True, enable_gqa=gqa))
