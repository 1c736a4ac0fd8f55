"""Position-wise feed-forward sub-layers: SwiGLU (Shazeer 2020), Smooth-SwiGLU (Fishman et al.
2024), GELU, ReLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .config import ModelConfig


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


@torch.no_grad()
def channel_scale(h: torch.Tensor) -> torch.Tensor:
    """s_i = 2^-floor(log2 max_t |h_ti|) per channel i of h (..., F): each channel's absmax
    lands in [1, 2); 1 for an all-zero channel. The channel max follows Fishman et al. 2024
    ("channel max-scaling" [2nd]; the authors' public code, HabanaAI/Megatron-LM 13c28dea, hands
    the un-activated fc1 output to Intel Gaudi's Transformer Engine Linear with
    use_fp8_smooth_swiglu=True and computes s inside that library, whose source is not public:
    checked 2026-12-04). The power-of-two rounding is normlab's choice: multiplying and dividing
    by s is then exact, so the smoothed MLP equals SwiGLU bit for bit unquantised."""
    amax = h.detach().abs().reshape(-1, h.shape[-1]).amax(dim=0).float()  # (F,)
    exponent = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax))))
    return torch.exp2(-exponent).to(h.dtype)


class SmoothSwiGLU(SwiGLU):
    """Smooth-SwiGLU (Fishman et al. 2024, arXiv 2409.12517): W3 diag(s)^-1 Q(diag(s) h) with
    h = silu(gate(x)) * up(x) and a per-channel scale s (`channel_scale`), so the FP8 cast of the
    down projection's input sees channels of one magnitude. The inverse scale is folded into W3
    (its columns), which the down projection casts in turn; in exact arithmetic the output is
    SwiGLU's. Unconverted (no FP8), it is SwiGLU bit for bit."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (B, T, F)
        s = channel_scale(h)  # (F,)
        w3 = self.down_proj.weight / s  # (C, F): W3 diag(s)^-1
        return self.dropout(functional_call(self.down_proj, {"weight": w3}, (h * s,)))


class PlainMLP(nn.Module):
    """down(act(up(x))) with act GELU or ReLU."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.act = nn.GELU() if cfg.mlp == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down_proj(self.act(self.up_proj(x))))


def build_mlp(cfg: ModelConfig) -> nn.Module:
    if cfg.mlp == "swiglu":
        return SmoothSwiGLU(cfg) if cfg.smooth_swiglu else SwiGLU(cfg)
    return PlainMLP(cfg)
