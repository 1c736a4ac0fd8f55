"""Norm placements as residual wrappers around one sub-layer F (SCIENCE.md section 1).

Each wrapper's `forward` is its equation. `branch` is the attention or MLP module, so forward hooks
on `<wrapper>.branch` observe the branch output F(.) and hooks on the wrapper the updated stream.
The residual scales, HybridNorm and Keel (SCIENCE.md 15, 17, 18) are wrappers of the same kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .config import ModelConfig, sublayer_kind  # noqa: F401 (sublayer_kind: re-exported)
from .parametrization import residual_mult

MakeNorm = Callable[[], nn.Module]


class ResidualTap(nn.Module):
    """Identity on the two parts of a residual sum alpha * x + f that a norm is about to close.

    The fused add_norm never materialises the sum; instruments hook this module to observe it
    (its RMS is what grows in a post-norm stack, whose outputs are normalised).
    """

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, f


class PostNorm(nn.Module):
    """Post-LN (Vaswani et al. 2017): x = N(x + F(x))."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm) -> None:
        super().__init__()
        self.branch, self.norm = branch, make_norm()
        self.pre_norm = ResidualTap()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, f = self.pre_norm(x, self.branch(x))  # the tap: x + F(x) before N
        return self.norm.add_norm(x, f)


class DeepNorm(nn.Module):
    """DeepNorm (Wang et al. 2022): x = N(alpha * x + F(x)), alpha = (2M)^(1/4)."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm, alpha: float) -> None:
        super().__init__()
        self.branch, self.norm, self.alpha = branch, make_norm(), alpha
        self.pre_norm = ResidualTap(alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, f = self.pre_norm(x, self.branch(x))  # the tap: alpha * x + F(x) before N
        return self.norm.add_norm(x, f, self.alpha)


class PreNorm(nn.Module):
    """Pre-LN (GPT-2, Xiong et al. 2020): x = x + F(N(x))."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm) -> None:
        super().__init__()
        self.branch, self.norm_in = branch, make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(self.norm_in(x))


class ScaledPreNorm(nn.Module):
    """LayerNorm Scaling (Sun et al. 2025): x = x + F(N(x) / sqrt(l)), l the 1-based block index."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm, layer: int) -> None:
        super().__init__()
        self.branch, self.norm_in = branch, make_norm()
        self.scale = 1.0 / math.sqrt(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(self.norm_in(x) * self.scale)


class PeriNorm(nn.Module):
    """Peri-LN (Kim et al. 2025; Sandwich-LN): x = x + N_out(F(N_in(x))); N_out's gain learnable."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm) -> None:
        super().__init__()
        self.branch, self.norm_in, self.norm_out = branch, make_norm(), make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_out.norm_add(x, self.branch(self.norm_in(x)))


class ReorderedNorm(nn.Module):
    """OLMo 2's reordered norm (Swin v2 res-post-norm): x = x + N(F(x)), no input norm."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm) -> None:
        super().__init__()
        self.branch, self.norm_out = branch, make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_out.norm_add(x, self.branch(x))


class BranchScale(nn.Module):
    """λ ⊙ f: LayerScale's diag(λ), λ in R^d (CaiT), or SkipInit's one scalar (size 1)."""

    def __init__(self, size: int, init: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), float(init)))
        self.init_values = {"weight": float(init)}  # read by model/init.py

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.weight.to(f.dtype) * f


class ConstScale(nn.Module):
    """c · f with c a fixed multiplier of the parametrization (CompleteP's m_L^-α, µP's α_out/m_N;
    SCIENCE.md 21), not learned."""

    def __init__(self, c: float) -> None:
        super().__init__()
        self.c = float(c)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return f * self.c

    def extra_repr(self) -> str:
        return f"c={self.c:g}"


def const_scale(c: float) -> nn.Module:
    """ConstScale(c), or the identity where c is exactly 1 (sp, the base shape)."""
    return ConstScale(c) if c != 1.0 else nn.Identity()


class ScaledResidual(nn.Module):
    """A sub-layer with a residual scale s: x = x + s ⊙ N_out(F(N_in(x))), s a learned λ
    (LayerScale, SkipInit: BranchScale) or CompleteP's constant m_L^-α (ConstScale).

    N_in / N_out are the identity where the placement has none: Pre-LN has no N_out, OLMo 2 no
    N_in, Peri-LN both (its scale after N_out: a scale before a norm is a no-op)."""

    def __init__(
        self,
        branch: nn.Module,
        scale: nn.Module,
        norm_in: nn.Module | None = None,
        norm_out: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.branch = branch
        self.norm_in = nn.Identity() if norm_in is None else norm_in
        self.norm_out = nn.Identity() if norm_out is None else norm_out
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale(self.norm_out(self.branch(self.norm_in(x))))


class PlainResidual(nn.Module):
    """HybridNorm's attention sub-layer: x = x + F(x), no input norm (F normalises q, k, v)."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm) -> None:
        super().__init__()
        self.branch = branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


class NormedResidual(nn.Module):
    """HybridNorm's FFN sub-layer (Post-Norm, residual after the norm): z = N(x); x = z + F(z)."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm) -> None:
        super().__init__()
        self.branch, self.norm = branch, make_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.norm(x)
        return z + self.branch(z)


class Keel(nn.Module):
    """Keel (Chen & Wei 2026), a Post-LN with a Highway-style residual and an inner norm:
    x = N_out(alpha * x + F(N_in(x))), alpha a constant (2L sub-layers by default)."""

    def __init__(self, branch: nn.Module, make_norm: MakeNorm, alpha: float) -> None:
        super().__init__()
        self.branch, self.norm_in, self.norm, self.alpha = branch, make_norm(), make_norm(), alpha
        self.pre_norm = ResidualTap(alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, f = self.pre_norm(x, self.branch(self.norm_in(x)))  # the tap: alpha * x + F before N
        return self.norm.add_norm(x, f, self.alpha)


def deepnorm_constants(n_layers: int) -> tuple[float, float]:
    """DeepNet decoder-only constants for M blocks: alpha = (2M)^(1/4), beta = (8M)^(-1/4)."""
    return (2 * n_layers) ** 0.25, (8 * n_layers) ** -0.25


Build = Callable[[ModelConfig, int, str, nn.Module, MakeNorm], nn.Module]


def _simple(cls: type[nn.Module]) -> Build:
    return lambda cfg, layer, role, branch, make_norm: cls(branch, make_norm)


def _scalable(cls: type[nn.Module], norm_in: bool, norm_out: bool) -> Build:
    """`cls`, or ScaledResidual x + s ⊙ N_out(F(N_in(x))) with the placement's norms (`norm_in`,
    `norm_out`: whether it has each): a learned residual scale (model.residual_scale) or
    CompleteP's constant m_L^-α; the two are never combined."""

    def build(
        cfg: ModelConfig, layer: int, role: str, branch: nn.Module, mk: MakeNorm
    ) -> nn.Module:
        scale: nn.Module
        mult = residual_mult(cfg)
        if cfg.residual_scale != "none":
            size = cfg.d_model if cfg.residual_scale == "layerscale" else 1
            scale = BranchScale(size, cfg.residual_scale_init)  # type: ignore[arg-type]
        elif mult != 1.0:
            scale = ConstScale(mult)
        else:
            return cls(branch, mk)
        return ScaledResidual(branch, scale, mk() if norm_in else None, mk() if norm_out else None)

    return build


# The wrapper of each sub-layer kind (model.config.sublayer_kind): the placement table.
WRAPPERS: dict[str, Build] = {
    "post": _simple(PostNorm),
    "pre": _scalable(PreNorm, norm_in=True, norm_out=False),
    "peri": _scalable(PeriNorm, norm_in=True, norm_out=True),
    "olmo2": _scalable(ReorderedNorm, norm_in=False, norm_out=True),
    "ln_scaling": lambda cfg, layer, role, b, mk: ScaledPreNorm(b, mk, layer=layer),
    "deepnorm": lambda cfg, layer, role, b, mk: DeepNorm(
        b, mk, alpha=deepnorm_constants(cfg.n_layers)[0]
    ),
    "keel": lambda cfg, layer, role, b, mk: Keel(b, mk, alpha=cfg.keel_alpha_value),
    "hybrid": lambda cfg, layer, role, b, mk: (PlainResidual if role == "attn" else NormedResidual)(
        b, mk
    ),
}
# The kinds whose sub-layer takes a residual scale (as ScaledResidual): config.SCALED_KINDS.
SCALED_WRAPPERS = frozenset({"pre", "peri", "olmo2"})


def wrap_sublayer(
    cfg: ModelConfig, layer: int, role: str, branch: nn.Module, make_norm: MakeNorm
) -> nn.Module:
    """The residual wrapper of sub-layer `role` ('attn' or 'ffn') of block `layer` (1-based)."""
    return WRAPPERS[sublayer_kind(cfg, layer)](cfg, layer, role, branch, make_norm)
