"""LayerNorm and RMSNorm (SCIENCE.md section 10) behind one backend seam.

Every norm also offers the three fused patterns the placements need. Here they are the plain
PyTorch reference; the triton backend (model/kernels) overrides them with fused kernels, so a
placement's `forward` reads the same whichever backend runs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .kernels import resolve_backend


class FusedPatterns:
    """Reference forms of the residual patterns; `self(x)` is the norm N."""

    def add_norm(self, x: torch.Tensor, f: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """N(alpha * x + f): Post-LN (alpha = 1) and DeepNorm."""
        return self(x + f if alpha == 1.0 else alpha * x + f)

    def add_then_norm(self, x: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N(x + f), x + f): Pre-LN's residual add followed by the next norm."""
        h = x + f
        return self(h), h

    def norm_add(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """x + N(f): Peri-LN's output norm and OLMo 2's reordered norm, then the add."""
        return x + self(f)


class LayerNorm(nn.Module, FusedPatterns):
    """y = g * (x - mean) / sqrt(var + eps) + b, statistics in fp32."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class RMSNorm(nn.Module, FusedPatterns):
    """y = g * x / sqrt(mean(x^2) + eps)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def build_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    """The configured norm (kind, eps, backend) over the last `dim` features."""
    backend = resolve_backend(cfg.norm_backend)  # raises naming why triton cannot run here
    if backend == "triton":
        from .kernels.modules import TritonLayerNorm, TritonRMSNorm

        if cfg.norm == "layernorm":
            return TritonLayerNorm(dim, eps=cfg.norm_eps)
        return TritonRMSNorm(dim, eps=cfg.norm_eps)
    if cfg.norm == "layernorm":
        return LayerNorm(dim, eps=cfg.norm_eps)
    return RMSNorm(dim, eps=cfg.norm_eps)
