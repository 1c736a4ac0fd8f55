"""Position-wise feed-forward sub-layers: SwiGLU (Shazeer 2020), GELU, ReLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

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
    return SwiGLU(cfg) if cfg.mlp == "swiglu" else PlainMLP(cfg)
