"""Initialisation schemes (SCIENCE.md section 2), each matched to its placement."""

from __future__ import annotations

import math

from torch import nn

from .config import ModelConfig
from .placements import deepnorm_constants

# Weights that write into the residual stream: GPT-2 scales their std by 1/sqrt(2L).
RESIDUAL_OUTPUTS = ("o_proj", "down_proj")
# DeepNet initialises these with Xavier-normal gain beta (the rest of the block with gain 1).
DEEPNORM_BETA = ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    """Initialise every parameter of `model` in place by `cfg.init`; norm gains 1, biases 0."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            SCHEMES[cfg.init](name.rsplit(".", 1)[-1], module, cfg)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif hasattr(module, "reset_parameters") and not list(module.children()):
            module.reset_parameters()  # norms


def _gpt2(leaf: str, module: nn.Module, cfg: ModelConfig) -> None:
    std = cfg.init_std / math.sqrt(2 * cfg.n_layers) if leaf in RESIDUAL_OUTPUTS else cfg.init_std
    nn.init.normal_(module.weight, 0.0, std)


def _normal(leaf: str, module: nn.Module, cfg: ModelConfig) -> None:
    """Plain N(0, init_std) everywhere, no depth factor: what LayerNorm Scaling's authors use
    (depth-scaled init would cancel its 1/sqrt(l); SCIENCE.md section 2)."""
    nn.init.normal_(module.weight, 0.0, cfg.init_std)


def _olmo2(leaf: str, module: nn.Module, cfg: ModelConfig) -> None:
    std = cfg.init_std
    nn.init.trunc_normal_(module.weight, 0.0, std, a=-3 * std, b=3 * std)


def _deepnorm(leaf: str, module: nn.Module, cfg: ModelConfig) -> None:
    if isinstance(module, nn.Embedding) or leaf == "head":
        nn.init.normal_(module.weight, 0.0, cfg.init_std)
        return
    beta = deepnorm_constants(cfg.n_layers)[1]
    nn.init.xavier_normal_(module.weight, gain=beta if leaf in DEEPNORM_BETA else 1.0)


def _xavier(leaf: str, module: nn.Module, cfg: ModelConfig) -> None:
    """Xiong et al.'s analysis setting: Xavier everywhere, W_Q = W_K = 0 (uniform attention)."""
    if leaf in ("q_proj", "k_proj"):
        nn.init.zeros_(module.weight)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, 1.0)
    else:
        nn.init.xavier_normal_(module.weight)


SCHEMES = {
    "gpt2": _gpt2,
    "normal": _normal,
    "olmo2": _olmo2,
    "deepnorm": _deepnorm,
    "xavier": _xavier,
}
