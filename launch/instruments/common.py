"""Shared pieces of the stability instruments: metric key names, log-step test, model lookup.

Per-block keys use the 0-based index of `blocks.{i}` padded to two digits so TensorBoard sorts
them by depth; `block_key` / `parse_block_key` are the only place that format lives (compare reads
metrics.jsonl through them).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import torch
from normlab.launch.config.loader import suggest
from normlab.launch.errors import ConfigError
from normlab.model.attention import Attention
from torch import nn

if TYPE_CHECKING:
    from normlab.launch.callbacks import TrainerView

RESID, ATTN_OUT, MLP_OUT = "resid_rms", "attn_out_rms", "mlp_out_rms"
PRE_NORM = "pre_norm_rms"  # post-norm blocks: the residual sum before the closing norm
GRAD, UPDATE = "grad_norm", "update_ratio"
MAX_LOGIT, QK_GAIN = "max_logit", "qk_gain"
MAX_LOGIT_LOWER, MAX_LOGIT_UPPER = "max_logit_lower", "max_logit_upper"  # the lse bound
FP16_CLAMPS = "fp16_clamps"
SPIKE_LOSS, SPIKE_GRAD = "spike_score/loss", "spike_score/grad_norm"
SPIKE_WINDOW = "spike_score/window"  # the window used (scaled down for short runs)
SKIPPED, ROLLBACKS, NONFINITE = "skipped_steps", "rollbacks", "nonfinite_steps"
SCALER_SKIPS = "scaler_skips"  # fp16: updates the loss scaler skipped (inf/NaN gradients)
Z_LOSS = "z_loss"  # the z-loss term, logged beside the cross-entropy `loss`
UPDATE_NORM, UPDATE_SPIKES = "update_norm", "update_spikes"  # per block (update_spikes.py)
UPDATE_RATIO_MAX, UPDATE_SPIKE_STEPS = "update_ratio_max", "update_spike_steps"
ROLLED_BACK = "rolled_back_steps"  # steps whose updates a rollback discarded

_BLOCK_KEY = re.compile(r"^(?P<kind>[a-z0-9_]+)/(?P<block>\d+)(?:/(?P<sub>[a-z0-9_]+))?$")


def block_key(kind: str, block: int, sub: str | None = None) -> str:
    """'resid_rms/03', or with a sub-key 'max_logit/03/h1'."""
    return f"{kind}/{block:02d}" + (f"/{sub}" if sub else "")


def parse_block_key(key: str) -> tuple[str, int, str | None] | None:
    """(kind, block, sub) for a per-block key, None for any other key."""
    m = _BLOCK_KEY.match(key)
    return (m["kind"], int(m["block"]), m["sub"]) if m else None


def is_log_step(trainer: TrainerView, step: int) -> bool:
    """The trainer writes metrics for `step` (keep in step with Trainer._loop)."""
    t = trainer.cfg.training
    return step % t.log_every == 0 or step == t.steps


def unwrap(model: nn.Module) -> nn.Module:
    """The Transformer inside an engine's wrapper (DeepSpeed/DDP keep it as `.module`)."""
    while not hasattr(model, "blocks") and hasattr(model, "module"):
        model = model.module
    if not hasattr(model, "blocks"):
        raise TypeError(f"instruments need a normlab Transformer, got {type(model).__name__}")
    return model


def blocks(trainer: TrainerView) -> nn.ModuleList:
    return unwrap(trainer.engine.model).blocks


def attention_of(block: nn.Module) -> Attention:
    """The attention module of one block (the residual wrapper's `branch`)."""
    return block.attn.branch


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly DTensor) tensor, as a plain tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def is_sharded(t: torch.Tensor) -> bool:
    """DTensor shards must be summed across ranks; plain tensors are replicas."""
    return hasattr(t, "to_local")


def settings_of(settings: Any, allowed: dict[str, Any], name: str) -> dict[str, Any]:
    """Merge an instrument's settings over its defaults; unknown keys are a ConfigError."""
    if settings is True or settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise ConfigError(f"instruments.{name} must be a mapping or true/false, got {settings!r}")
    for key in settings:
        if key not in allowed:
            hint = suggest(str(key), list(allowed), f"instruments.{name}.")
            raise ConfigError(f"unknown key 'instruments.{name}.{key}'{hint}")
    out = dict(allowed)
    for key, value in settings.items():
        out[key] = _typed(value, allowed[key], f"instruments.{name}.{key}")
    return out


def _typed(value: Any, default: Any, where: str) -> Any:
    """`value` as the type of `default`: bools are no numbers, numbers must be finite."""
    if not isinstance(default, bool | int | float | str):
        return value
    kind = type(default)
    fits = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if isinstance(value, bool) != (kind is bool) or not fits:
        raise ConfigError(f"{where} must be {kind.__name__}, got {value!r}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return kind(value)
