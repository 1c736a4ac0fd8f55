"""Per-block gradient norms and update/weight ratios, on log steps only.

The gradient norm of block i is the L2 norm over all of its parameters, before clipping and without
the fp16 loss scale: the block's share of the raw norm times the engine's unscaled global norm
(a uniform loss scale cancels in the ratio). The update ratio is ||W_after - W_before|| /
||W_before|| over the block's parameters (0 on a skipped step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from launch.callbacks import Callback
from launch.instruments.common import (
    GRAD,
    UPDATE,
    block_key,
    blocks,
    is_log_step,
    is_sharded,
    local,
    settings_of,
    unwrap,
)

if TYPE_CHECKING:
    from launch.trainer import Trainer


def sum_squares(
    trainer: Trainer, groups: list[list[torch.Tensor]], sharded: list[list[bool]]
) -> torch.Tensor:
    """(len(groups),) global sums of squares: shards summed across ranks, replicas counted once."""
    device = trainer.engine.device
    parts = torch.zeros(2, len(groups), device=device)  # row 0: sharded, row 1: replicated
    for i, (group, flags) in enumerate(zip(groups, sharded, strict=True)):
        for t, flag in zip(group, flags, strict=True):
            parts[0 if flag else 1, i] += local(t).detach().float().square().sum()
    return trainer.engine.all_reduce(parts[0], "sum") + parts[1]


class GradientStats(Callback):
    """Logs `grad_norm/i` and `update_ratio/i` for every block."""

    name = "gradients"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        settings_of(settings, {}, self.name)
        self._before: list[list[torch.Tensor]] | None = None
        self._grad_sq: torch.Tensor | None = None

    def on_train_start(self, trainer: Trainer) -> None:
        self._params = [list(b.parameters()) for b in blocks(trainer)]
        self._params.append(list(unwrap(trainer.engine.model).parameters()))  # the global norm
        self._sharded = [[is_sharded(p) for p in ps] for ps in self._params]

    def on_after_backward(self, trainer: Trainer, step: int) -> None:
        if not is_log_step(trainer, step):
            return
        grads, flags = [], []
        for ps, fs in zip(self._params, self._sharded, strict=True):
            with_grad = [(p.grad, f) for p, f in zip(ps, fs, strict=True) if p.grad is not None]
            grads.append([g for g, _ in with_grad])
            flags.append([f for _, f in with_grad])
        self._grad_sq = sum_squares(trainer, grads, flags)
        self._before = [[local(p).detach().clone() for p in ps] for ps in self._params[:-1]]

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if self._before is None or self._grad_sq is None:
            return
        share = (self._grad_sq[:-1] / self._grad_sq[-1]).sqrt()
        norms = share * metrics["grad_norm"].float()
        diffs = [
            [local(p).detach() - old for p, old in zip(ps, olds, strict=True)]
            for ps, olds in zip(self._params[:-1], self._before, strict=True)
        ]
        flags = self._sharded[:-1]
        ratio = (
            sum_squares(trainer, diffs, flags)
            / sum_squares(trainer, self._before, flags).clamp_min(1e-30)
        ).sqrt()
        for i in range(len(self._before)):
            metrics[block_key(GRAD, i)] = norms[i]
            metrics[block_key(UPDATE, i)] = ratio[i]
        self._before = self._grad_sq = None
