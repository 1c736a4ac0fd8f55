"""µP and CompleteP (SCIENCE.md 21): the width and depth multipliers of one model config.

Everything is relative to the base shape (`model.base_d_model`, `model.base_n_layers`): with
`m_N = d / d_base` and `m_L = L / L_base`, each rule is a factor on the standard parametrization
(sp) the recipe would otherwise run, so at the base shape every factor is exactly 1 and mup and
completep train bit-identically to sp with the same init scheme.

    block:   x = x + m_L^-α · F(N(x))             (CompleteP; peri/olmo2: after N_out)
    head:    logits = head(N_f(x) · α_out / m_N)
    embed:   h = α_in · embed(tokens)
    attn:    S = α_attn · q k^T / d_head          (α_attn: sqrt(d_head) unless set)
    init:    hidden W ~ N(0, σ² / m_N)

The optimizer factors per parameter class live in `group_factors` (used by launch/optim).
No torch here: the config side (`validate`, `plan`) reads these too; the fixed multiplier module
is model.placements.ConstScale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import ModelConfig

# Parameter classes (SCIENCE.md 21.2): hidden = every matrix inside the blocks; block_vector =
# every other tensor inside the blocks (hidden biases, block norm and QK-norm gains, sinks);
# embed / head = the untied or tied token tables; outer_vector = the final norm and the rest.
CLASSES = ("hidden", "block_vector", "embed", "head", "outer_vector")


def width_mult(cfg: ModelConfig) -> float:
    """m_N = d / d_base (1 under sp)."""
    if cfg.parametrization == "sp":
        return 1.0
    assert cfg.base_d_model is not None  # ModelConfig requires it under mup and completep
    return cfg.d_model / cfg.base_d_model


def depth_mult(cfg: ModelConfig) -> float:
    """m_L = L / L_base, counting blocks (1 unless completep)."""
    if cfg.parametrization != "completep":
        return 1.0
    assert cfg.base_n_layers is not None  # ModelConfig requires it under completep
    return cfg.n_layers / cfg.base_n_layers


def depth_alpha(cfg: ModelConfig) -> float:
    """CompleteP's α: 1 (the paper's choice) or 0.5 (Depth-µP, the alternative it compares)."""
    return 1.0 if cfg.completep_alpha is None else float(cfg.completep_alpha)


def residual_mult(cfg: ModelConfig) -> float:
    """m_L^-α on every branch output (1 unless completep)."""
    return depth_mult(cfg) ** -depth_alpha(cfg) if cfg.parametrization == "completep" else 1.0


def input_mult(cfg: ModelConfig) -> float:
    """α_in on the token embedding (tunable, default 1)."""
    return 1.0 if cfg.input_mult is None else cfg.input_mult


def output_mult(cfg: ModelConfig) -> float:
    """α_out / m_N on the head input (MuReadout's `output_mult * x / width_mult`)."""
    return (1.0 if cfg.output_mult is None else cfg.output_mult) / width_mult(cfg)


def attn_scale(cfg: ModelConfig) -> float:
    """The attention logit scale: 1/sqrt(d_head) under sp, α_attn / d_head otherwise, α_attn
    defaulting to sqrt(d_head) (equal to SP at a fixed d_head; set it to sqrt(d_head_base) when
    the width grows d_head)."""
    if cfg.parametrization == "sp":
        return 1.0 / math.sqrt(cfg.head_dim)
    alpha = math.sqrt(cfg.head_dim) if cfg.attn_mult is None else cfg.attn_mult
    return alpha / cfg.head_dim


def query_mult(cfg: ModelConfig) -> float:
    """The factor on q that turns SDPA's 1/sqrt(d_head) into `attn_scale` (1 at the defaults)."""
    if cfg.parametrization == "sp" or cfg.attn_mult is None:
        return 1.0
    return attn_scale(cfg) * math.sqrt(cfg.head_dim)


def hidden_init_factor(cfg: ModelConfig) -> float:
    """The factor on the init std of hidden matrices: m_N^-1/2."""
    return width_mult(cfg) ** -0.5


@dataclass(frozen=True)
class Factors:
    """Multipliers on the sp group's learning rate, weight decay and AdamW epsilon."""

    lr: float = 1.0
    weight_decay: float = 1.0
    eps: float = 1.0


def group_factors(
    cfg: ModelConfig, klass: str, muon: bool = False, muon_scale: str = ""
) -> Factors:
    """The per-class factors of SCIENCE.md 21.2 (AdamW) and 21.4 (Muon on hidden matrices).

    Weight decay is coupled (PyTorch AdamW, `θ -= lr·λ·θ`): hidden matrices get `λ·m_N`, so the
    per-step decay `lr·λ` does not change with width; on Muon the same rule gives `λ / lr_factor`.
    """
    if cfg.parametrization == "sp":
        return Factors()
    m_n, m_l, alpha = width_mult(cfg), depth_mult(cfg), depth_alpha(cfg)
    depth_lr = m_l ** (alpha - 1.0) if cfg.parametrization == "completep" else 1.0
    depth_eps = m_l**-alpha if cfg.parametrization == "completep" else 1.0
    if klass == "hidden" and muon:
        # Keller Jordan's scale sqrt(max(1, fan_out/fan_in)) is spectral-µP already; Moonlight's
        # 0.2·sqrt(max(A, B)) grows like sqrt(m_N), so its lr falls as m_N^-1/2 (SCIENCE.md 21.4)
        width_lr = m_n**-0.5 if muon_scale == "match_rms_adamw" else 1.0
        return Factors(lr=width_lr * depth_lr, weight_decay=1.0 / width_lr)
    if klass == "hidden":
        return Factors(lr=depth_lr / m_n, weight_decay=m_n, eps=depth_eps / m_n)
    if klass == "block_vector":
        return Factors(lr=depth_lr, eps=depth_eps / m_n)
    return Factors()  # embed, head, outer_vector: the base values


def param_class(name: str, ndim: int) -> str:
    """The class of a parameter by its canonical name (model/init.py) and number of dims."""
    if name.startswith("blocks."):
        return "hidden" if ndim >= 2 else "block_vector"
    if name.startswith("embed."):
        return "embed"
    if name.startswith("head."):
        return "head"
    return "outer_vector"


def describe(cfg: ModelConfig) -> str:
    """One line of what the parametrization does at this shape (printed by `normlab validate`)."""
    m_n, m_l = width_mult(cfg), depth_mult(cfg)
    hidden = group_factors(cfg, "hidden")
    parts = [
        f"parametrization {cfg.parametrization}: m_N = {m_n:g} (d {cfg.d_model} / base "
        f"{cfg.base_d_model})"
    ]
    if cfg.parametrization == "completep":
        parts[0] += f", m_L = {m_l:g} ({cfg.n_layers} / base {cfg.base_n_layers} blocks)"
        parts.append(f"residual branches x {residual_mult(cfg):g} (α = {depth_alpha(cfg):g})")
    parts += [
        f"hidden AdamW lr x {hidden.lr:g}, wd x {hidden.weight_decay:g}, eps x {hidden.eps:g}",
        f"hidden init std x {hidden_init_factor(cfg):g}",
        f"head input x {output_mult(cfg):g}",
        f"attention scale {attn_scale(cfg):g}",
    ]
    return "; ".join(parts) + " (SCIENCE.md 21)"


def config_notes(cfg: ModelConfig) -> list[str]:
    """What `normlab validate` prints about a valid model config: its own notes, then the
    parametrization's factors (`describe`) when it is not sp."""
    return [*cfg.notes(), *([describe(cfg)] if cfg.parametrization != "sp" else [])]
