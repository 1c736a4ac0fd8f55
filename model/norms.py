"""LayerNorm and RMSNorm (SCIENCE.md section 10) behind one backend seam; DyT and Derf (16).

Every norm also offers the three fused patterns the placements need. Here they are the plain
PyTorch reference; the triton backend (model/kernels) overrides them with fused kernels, so a
placement's `forward` reads the same whichever backend runs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from normlab.model.dtypes import at_least_fp32
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


class DyT(nn.Module, FusedPatterns):
    """DyT (Zhu et al. 2025): y = g * tanh(alpha * x) + b; alpha one learned scalar, in fp32."""

    def __init__(self, dim: int, alpha0: float) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.init_values = {"alpha": float(alpha0)}  # read by model/init.py

    def squash(self, x: torch.Tensor) -> torch.Tensor:
        """The point-wise f(alpha x) before the affine (what the saturation share counts)."""
        return torch.tanh(self.alpha * at_least_fp32(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight * self.squash(x) + self.bias).to(x.dtype)


class Derf(nn.Module, FusedPatterns):
    """Derf (Chen et al. 2025): y = g * erf(alpha * x + s) + b; alpha and s learned scalars."""

    def __init__(self, dim: int, alpha0: float) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.shift = nn.Parameter(torch.zeros(1))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.init_values = {"alpha": float(alpha0), "shift": 0.0}

    def squash(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erf(self.alpha * at_least_fp32(x) + self.shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight * self.squash(x) + self.bias).to(x.dtype)


class EmbedScale(nn.Module):
    """x * s with s one learned scalar, sqrt(d) at init: the DyT/Derf LM references' embedding."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), dim**0.5))
        self.init_values = {"scale": dim**0.5}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.to(x.dtype)


POINTWISE = {"dyt": DyT, "derf": Derf}


def build_norm(cfg: ModelConfig, dim: int, role: str = "attn") -> nn.Module:
    """The configured norm (kind, eps, backend) over the last `dim` features. `role` (attn, ffn,
    final) picks DyT/Derf's alpha0; the statistics norms ignore it."""
    if cfg.norm in POINTWISE:
        return POINTWISE[cfg.norm](dim, cfg.dyt_alpha0[role])
    backend = resolve_backend(cfg.norm_backend)  # raises naming why triton cannot run here
    if backend == "triton":
        from .kernels.modules import TritonLayerNorm, TritonRMSNorm

        if cfg.norm == "layernorm":
            return TritonLayerNorm(dim, eps=cfg.norm_eps)
        return TritonRMSNorm(dim, eps=cfg.norm_eps)
    if cfg.norm == "layernorm":
        return LayerNorm(dim, eps=cfg.norm_eps)
    return RMSNorm(dim, eps=cfg.norm_eps)
