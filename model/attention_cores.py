"""The softmax step of attention, one module per kernel: y = softmax(S + M) V and its variants.

Each core takes q (B, H, T, D) and k, v (B, H_kv, T, D) after QK-norm and RoPE and returns the
output (B, H, T, D) and, when asked (`bounds=True`: Attention never asks, the attention_logits
instrument's forward pre-hook does), per-head (lower, upper) bounds on the raw max logit S_max
(SCIENCE.md 7), else None. `kernel` names what runs, for benchmarks and the resolved config.

- SDPACore: fused `scaled_dot_product_attention` (the default path, unchanged).
- EagerCore: S = q k^T / sqrt(d_h) materialised in fp32, an optional soft-cap c·tanh(S/c) BEFORE
  the causal mask (Gemma 2, SCIENCE.md 14; a masked -inf must never be capped to -c), fp32
  softmax. SDPA has no score modifier, so a capped model cannot use it.
- SinkCore: EagerCore with a learned per-query-head logit s_h joining the softmax denominator and
  carrying no value (gpt-oss, SCIENCE.md 13): p_ij = exp(S_ij + M_ij) / (exp(s_h) + Σ_j exp(...)).
  Concatenation, then the sink column is dropped: autograd sees the whole softmax, so the q/k
  gradients are exact (a rescale by a non-differentiable fused-kernel lse would not be).

On the eager cores S is in memory anyway, so the S_max "bounds" are the exact maximum (before the
cap: QK-Clip bounds the growth of W_q W_k, which the cap hides).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from normlab.model.dtypes import at_least_fp32_dtype
from torch import nn

from .attention_lse import attention_with_lse_bounds

Bounds = tuple[torch.Tensor, torch.Tensor]


def softcap(z: torch.Tensor, cap: float) -> torch.Tensor:
    """c · tanh(z / c): maps into (-c, c) with slope 1 at 0 (Gemma 2)."""
    return cap * torch.tanh(z / cap)


class SoftCap(nn.Module):
    """z' = c · tanh(z / c), as a module (the final-logit cap, the attention score modifier)."""

    def __init__(self, cap: float) -> None:
        super().__init__()
        self.cap = cap

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return softcap(z, self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap}"


def attention_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """S = q k^T / sqrt(d_h) (B, H, T, T) in at least fp32, keys repeated for GQA."""
    acc = at_least_fp32_dtype(q.dtype)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])


def future_mask(t: int, device: torch.device) -> torch.Tensor:
    """True where key j > query i: what the causal mask M removes."""
    return torch.ones(t, t, dtype=torch.bool, device=device).triu(1)


class SDPACore(nn.Module):
    """softmax(S + M) V by the fused SDPA kernel; with bounds, the kernel's lse gives them."""

    kernel = "sdpa"
    cap: float | None = None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout_p: float,
        bounds: bool = False,
    ) -> tuple[torch.Tensor, Bounds | None]:
        if bounds:
            return attention_with_lse_bounds(q, k, v, dropout_p)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=k.shape[1] != q.shape[1]
        )
        return y, None

    def weights(self, s: torch.Tensor) -> torch.Tensor:
        """The attention probabilities P (B, H, T, T) of logits S (for instruments)."""
        return torch.softmax(s.masked_fill(future_mask(s.shape[-1], s.device), float("-inf")), -1)


class EagerCore(nn.Module):
    """y = softmax(score_mod(S) + M) V, S = q k^T / sqrt(d_h), in fp32 (the reference path)."""

    kernel = "eager"

    def __init__(self, n_heads: int, cap: float | None) -> None:
        super().__init__()
        self.cap = cap
        self.score_mod = SoftCap(cap) if cap is not None else nn.Identity()

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax over keys of the masked logits (B, H, T, T)."""
        return torch.softmax(logits, dim=-1)

    def weights(self, s: torch.Tensor, future: torch.Tensor | None = None) -> torch.Tensor:
        """P = softmax(score_mod(S) + M): cap first, then mask (a capped -inf would take mass)."""
        future = future_mask(s.shape[-1], s.device) if future is None else future
        return self.probabilities(self.score_mod(s).masked_fill(future, float("-inf")))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout_p: float,
        bounds: bool = False,
    ) -> tuple[torch.Tensor, Bounds | None]:
        s = attention_logits(q, k)  # S (B, H, T, T)
        future = future_mask(s.shape[-1], s.device)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        y = (F.dropout(self.weights(s, future), dropout_p) @ v.to(s.dtype)).to(v.dtype)
        if not bounds:
            return y, None
        s_max = s.detach().masked_fill(future, float("-inf")).amax(dim=(0, 2, 3))  # before the cap
        return y, (s_max, s_max)


class SinkCore(EagerCore):
    """EagerCore whose softmax has one more column per query head: the learned sink logit s_h
    (not scaled by 1/sqrt(d_h), zero init: off-by-one attention at init; SCIENCE.md 13)."""

    def __init__(self, n_heads: int, cap: float | None) -> None:
        super().__init__(n_heads, cap)
        self.sinks = nn.Parameter(torch.zeros(n_heads))

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        B, H, T, _ = logits.shape
        sink = self.sinks.to(logits.dtype).view(1, H, 1, 1).expand(B, H, T, 1)
        return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]


def build_core(n_heads: int, sinks: bool, cap: float | None) -> nn.Module:
    """The kernel a configuration needs: SDPA unless a sink or a score cap asks for more."""
    if sinks:
        return SinkCore(n_heads, cap)
    if cap is not None:
        return EagerCore(n_heads, cap)
    return SDPACore()
