"""Shared pieces of the stability instruments: log-step test, model lookup, settings (the metric
key names are launch.metric_keys, re-exported here).

Per-block keys use the 0-based index of `blocks.{i}` padded to two digits so TensorBoard sorts
them by depth; `block_key` / `parse_block_key` are the only place that format lives (compare reads
metrics.jsonl through them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

# re-exported: the key names live in launch.metric_keys (torch-free, read by the reports)
from normlab.launch.metric_keys import (  # noqa: F401
    ATTN_OUT,
    FP16_CLAMPS,
    GRAD,
    MAX_LOGIT,
    MAX_LOGIT_LOWER,
    MAX_LOGIT_UPPER,
    MLP_OUT,
    NONFINITE,
    PRE_NORM,
    QK_GAIN,
    RESID,
    ROLLBACKS,
    ROLLED_BACK,
    SCALER_SKIPS,
    SKIPPED,
    SPIKE_GRAD,
    SPIKE_LOSS,
    SPIKE_WINDOW,
    UPDATE,
    UPDATE_NORM,
    UPDATE_RATIO_MAX,
    UPDATE_SPIKE_STEPS,
    UPDATE_SPIKES,
    Z_LOSS,
    block_key,
    parse_block_key,
)
from normlab.model.attention import Attention, causal_max_logits
from torch import nn

if TYPE_CHECKING:
    from normlab.launch.callbacks import TrainerView


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


def fold_max_logits(best: torch.Tensor) -> Callable[..., None]:
    """A forward hook for an attention's `qk_tap`: on a training forward, folds the exact
    per-head max logit of the tapped q, k (`causal_max_logits`, causal mask respected) into
    `best` (heads,) in place. It holds the row itself, not a block index: per-block compiled
    blocks (fsdp, deepspeed) then share one graph instead of specialising on each index."""

    def hook(tap: nn.Module, args: Any, out: tuple[torch.Tensor, torch.Tensor]) -> None:
        if tap.training:  # evaluation passes are not the training step's logits
            best.copy_(torch.maximum(best, causal_max_logits(*out)))

    return hook


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly DTensor) tensor, as a plain tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def is_sharded(t: torch.Tensor) -> bool:
    """DTensor shards must be summed across ranks; plain tensors are replicas."""
    return hasattr(t, "to_local")
