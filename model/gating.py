"""Gated attention (Qiu et al. 2025, arXiv 2505.06708; Qwen3-Next; SCIENCE.md section 12).

A sigmoid gate computed from the attention sub-layer's input X multiplies the SDPA output O before
the output projection: O' = O ⊙ σ(X W_g + b_g). One gate per query head (never per KV head); the
gate logits see neither QK-norm nor RoPE. The sigmoid runs in fp32 (OLMo-core, Megatron) and the
product is cast back to the activation dtype. W_g is its own Linear (`g_proj`) so Muon
orthogonalises it apart from W_q and QK-Clip never scales its rows.
"""

from __future__ import annotations

import torch
from normlab.model.dtypes import at_least_fp32
from torch import nn


class NoGate(nn.Module):
    """No gate: O' = O."""

    def forward(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return o


class HeadwiseGate(nn.Module):
    """O' = O ⊙ σ(X W_g + b_g), W_g (d, H): one scalar gate per query head and token."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        self.g_proj = nn.Linear(d_model, n_heads, bias=bias)

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """σ(X W_g + b_g) in fp32, shaped to broadcast against O (B, H, T, 1)."""
        return torch.sigmoid(at_least_fp32(self.g_proj(x))).transpose(1, 2).unsqueeze(-1)

    def forward(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        # x (B, T, d) the sub-layer input, o (B, H, T, D) the SDPA output
        return (at_least_fp32(o) * self.gate(x)).to(o.dtype)


class ElementwiseGate(HeadwiseGate):
    """O' = O ⊙ σ(X W_g + b_g), W_g (d, H·d_h): one gate per query head, token and channel."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int, bias: bool) -> None:
        nn.Module.__init__(self)
        self.n_heads, self.head_dim = n_heads, head_dim
        self.g_proj = nn.Linear(d_model, n_heads * head_dim, bias=bias)

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        g = at_least_fp32(self.g_proj(x)).view(B, T, self.n_heads, self.head_dim)
        return torch.sigmoid(g).transpose(1, 2)  # (B, H, T, D)


GATES: dict[str, type[nn.Module]] = {"headwise": HeadwiseGate, "elementwise": ElementwiseGate}


def build_gate(kind: str, d_model: int, n_heads: int, head_dim: int, bias: bool) -> nn.Module:
    if kind == "none":
        return NoGate()
    return GATES[kind](d_model, n_heads, head_dim, bias)
