"""Thin nn.Modules over the Triton norm functions, with the torch norms' parameters and methods.

State-dict keys (`weight`, `bias`) and `eps` match model/norms.py, so a checkpoint moves between
backends unchanged. Every module offers the placement patterns of SCIENCE.md §1 as fused kernels:
forward N(x); add_norm N(alpha*x + f) (post, deepnorm); add_then_norm (N(x + f), x + f) (pre);
norm_add x + N(f) (peri output norm).
"""

import torch
from normlab.model.kernels import functions as fn
from torch import nn


class _TritonNorm(nn.Module):
    rms: bool = False

    def __init__(self, dim: int, eps: float, bias: bool) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fn.norm(x, self.weight, self.bias, self.eps, self.rms)

    def add_norm(self, x: torch.Tensor, f: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """N(alpha * x + f) in one kernel each way."""
        return fn.add_norm(x, f, self.weight, self.bias, self.eps, self.rms, alpha)

    def add_then_norm(self, x: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N(x + f), x + f): the new residual and its normalised copy in one kernel."""
        return fn.add_then_norm(x, f, self.weight, self.bias, self.eps, self.rms)

    def norm_add(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """x + N(f) in one kernel each way."""
        return fn.norm_add(x, f, self.weight, self.bias, self.eps, self.rms)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}, backend=triton"


class TritonLayerNorm(_TritonNorm):
    """LayerNorm (Ba et al. 2016) with gain and optional bias; eps inside the root."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(dim, eps, bias)


class TritonRMSNorm(_TritonNorm):
    """RMSNorm (Zhang and Sennrich 2019): y = g * x / sqrt(mean(x^2) + eps), no bias."""

    rms = True

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps, bias=False)
