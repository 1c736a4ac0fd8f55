"""Initialisation schemes (SCIENCE.md section 2), each matched to its placement.

A scheme names the distribution of each weight (`Draw`); the values come from generators keyed by
(seed, parameter name, chunk of CHUNK elements of the flattened parameter). Any part of a
parameter can therefore be drawn on its own and equals the same part of the whole: N processes
that each fill only their shard hold exactly the tensor one process fills whole, whatever N is.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .config import ModelConfig
from .parametrization import hidden_init_factor, param_class
from .placements import deepnorm_constants

# Weights that write into the residual stream: GPT-2 scales their std by 1/sqrt(2L).
RESIDUAL_OUTPUTS = ("o_proj", "down_proj")
# DeepNet initialises these with Xavier-normal gain beta (the rest of the block with gain 1).
DEEPNORM_BETA = ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CHUNK = 1 << 20  # elements drawn from one generator (4 MB of fp32 at a time)
# Module wrappers that add a segment to parameter names (activation checkpointing, compile)
WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


@dataclass(frozen=True)
class Draw:
    """The distribution of every element of one parameter: N(0, std^2), N(0, std^2) cut at
    +-3 std, or the constant `value`."""

    kind: Literal["normal", "trunc_normal", "constant"]
    std: float = 0.0
    value: float = 0.0

    def fill_(self, flat: torch.Tensor, seed: int, name: str, numel: int, start: int = 0) -> None:
        """Write elements [start, start + flat.numel()) of parameter `name` (of `numel` elements
        in all) into `flat`. Each chunk is drawn whole: a generator's first k values of an n-value
        draw need not equal a k-value draw."""
        if self.kind == "constant":
            flat.fill_(self.value)
            return
        if flat.numel() == 0:
            return
        stop = start + flat.numel()
        for chunk in range(start // CHUNK, -(-stop // CHUNK)):
            first = chunk * CHUNK
            lo, hi = max(start, first), min(stop, first + CHUNK)
            values = self._chunk(seed, name, chunk, min(CHUNK, numel - first))
            flat[lo - start : hi - start].copy_(values[lo - first : hi - first])

    def _chunk(self, seed: int, name: str, chunk: int, n: int) -> torch.Tensor:
        """The first n elements of `chunk`, drawn on the CPU (so every device gets the same)."""
        key = hashlib.blake2b(f"{seed}/{name}/{chunk}".encode(), digest_size=8).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)
        out = torch.empty(n).normal_(0.0, self.std, generator=gen)
        if self.kind == "trunc_normal":  # redraw what falls outside +-3 std (rejection sampling)
            outside = out.abs() > 3 * self.std
            while bool(outside.any()):
                out[outside] = torch.empty(int(outside.sum())).normal_(0.0, self.std, generator=gen)
                outside = out.abs() > 3 * self.std
        return out


ONES, ZEROS = Draw("constant", value=1.0), Draw("constant", value=0.0)


def canonical_name(name: str) -> str:
    """A parameter's name without the segments wrappers insert."""
    for segment in WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def init_plan(model: nn.Module, cfg: ModelConfig) -> dict[str, Draw]:
    """Each parameter's distribution by name: weights by `cfg.init`, norm gains 1, biases 0.

    Reads only names and shapes, so it works on a model built on the meta device. A tied weight
    takes the scheme of the last module that holds it (the head), as an in-order init would.
    """
    by_id: dict[int, Draw] = {}
    for name, module in model.named_modules():
        constants = getattr(module, "init_values", {})  # DyT alpha, LayerScale λ, ...
        for pname, p in module.named_parameters(recurse=False):
            if pname in constants:
                by_id[id(p)] = Draw("constant", value=constants[pname])
            elif pname == "bias" or pname == "sinks":
                by_id[id(p)] = ZEROS
            elif isinstance(module, nn.Linear | nn.Embedding):
                draw = SCHEMES[cfg.init](name.rsplit(".", 1)[-1], module, cfg)
                by_id[id(p)] = width_scaled(draw, name, cfg)
            elif pname == "weight":
                by_id[id(p)] = ONES  # norm gains
            else:
                raise ValueError(f"no initialisation rule for parameter {name}.{pname}")
    return {canonical_name(n): by_id[id(p)] for n, p in model.named_parameters()}


def width_scaled(draw: Draw, module_name: str, cfg: ModelConfig) -> Draw:
    """µP: hidden matrices (inside the blocks) drawn with std σ / sqrt(m_N) (SCIENCE.md 21.1)."""
    factor = hidden_init_factor(cfg)
    hidden = param_class(canonical_name(module_name) + ".weight", 2) == "hidden"
    if factor == 1.0 or not hidden or draw.kind == "constant":
        return draw
    return Draw(draw.kind, draw.std * factor)


def local_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(canonical name, parameter) for every parameter with storage on this process."""
    for name, p in model.named_parameters():
        if not p.is_meta and p.numel() > 0:
            yield canonical_name(name), p


@torch.no_grad()
def init_weights(model: nn.Module, cfg: ModelConfig, seed: int) -> None:
    """Initialise every (whole, materialised) parameter of `model` in place by `cfg.init`.

    Parameters still on the meta device, or partitioned away to nothing, are skipped: the engine
    that sharded them fills its shards from the same plan (launch/engines/construct.py).
    """
    todo = list(local_parameters(model))
    if not todo:
        return
    plan = init_plan(model, cfg)
    for name, p in todo:
        plan[name].fill_(p.view(-1), seed, name, p.numel())


def _gpt2(leaf: str, module: nn.Module, cfg: ModelConfig) -> Draw:
    std = cfg.init_std / math.sqrt(2 * cfg.n_layers) if leaf in RESIDUAL_OUTPUTS else cfg.init_std
    return Draw("normal", std)


def _normal(leaf: str, module: nn.Module, cfg: ModelConfig) -> Draw:
    """Plain N(0, init_std) everywhere, no depth factor: what LayerNorm Scaling's authors use
    (depth-scaled init would cancel its 1/sqrt(l); SCIENCE.md section 2)."""
    return Draw("normal", cfg.init_std)


def _olmo2(leaf: str, module: nn.Module, cfg: ModelConfig) -> Draw:
    return Draw("trunc_normal", cfg.init_std)


def _xavier_std(module: nn.Module, gain: float) -> float:
    fan_out, fan_in = module.weight.shape  # (out, in) of nn.Linear
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def _deepnorm(leaf: str, module: nn.Module, cfg: ModelConfig) -> Draw:
    if isinstance(module, nn.Embedding) or leaf == "head":
        return Draw("normal", cfg.init_std)
    beta = deepnorm_constants(cfg.n_layers)[1]
    return Draw("normal", _xavier_std(module, beta if leaf in DEEPNORM_BETA else 1.0))


def _xavier(leaf: str, module: nn.Module, cfg: ModelConfig) -> Draw:
    """Xiong et al.'s analysis setting: Xavier everywhere, W_Q = W_K = 0 (uniform attention)."""
    if leaf in ("q_proj", "k_proj", "g_proj"):  # the gate initialised like W_q (SCIENCE.md 12)
        return ZEROS
    if isinstance(module, nn.Embedding):
        return Draw("normal", 1.0)
    return Draw("normal", _xavier_std(module, 1.0))


def _megatron_small(leaf: str, module: nn.Module, cfg: ModelConfig) -> Draw:
    """HybridNorm's `full_megatron` recipe: every weight N(0, 2/(5d)) cut at +-3 std, the
    residual output projections divided by sqrt(2L) (SCIENCE.md 17); init_std is not used."""
    std = math.sqrt(2.0 / (5 * cfg.d_model))
    if leaf in RESIDUAL_OUTPUTS:
        std /= math.sqrt(2 * cfg.n_layers)
    return Draw("trunc_normal", std)


SCHEMES = {
    "gpt2": _gpt2,
    "normal": _normal,
    "olmo2": _olmo2,
    "deepnorm": _deepnorm,
    "xavier": _xavier,
    "megatron_small": _megatron_small,
}
