"""Per-block gradient norms and update/weight ratios, on log steps only.

The gradient norm of block i is the L2 norm over all of its parameters, before clipping and without
the fp16 loss scale: the block's share of the raw norm times the engine's unscaled global norm
(a uniform loss scale cancels in the ratio). The update ratio is ||W_after - W_before|| /
||W_before|| over the block's parameters (0 on a skipped step). Sharded engines hand over their
local parts through `engine.storage.local`; shards are summed across ranks, replicas counted once.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.engines.storage import Parts
from normlab.launch.instruments.common import (
    GRAD,
    UPDATE,
    block_key,
    blocks,
    is_log_step,
    unwrap,
)
from torch import nn


def local_parts(
    trainer: TrainerView, params: list[nn.Parameter], kind: Literal["param", "grad"]
) -> Parts:
    """(this rank's part, is a shard) of each parameter or gradient, as the engine defines it."""
    return trainer.engine.storage.local(params, kind)


def flat_parts(groups: list[Parts]) -> tuple[list[torch.Tensor], list[int]]:
    """(this rank's tensors, the row of each: 2 * group + (0 sharded, 1 replicated)) over every
    group's parts, parts absent on this rank left out: the layout `grouped_sum_squares` takes."""
    tensors, rows = [], []
    for i, group in enumerate(groups):
        for t, sharded in group:
            if t is not None:
                tensors.append(t.detach())
                rows.append(2 * i + (0 if sharded else 1))
    return tensors, rows


def sum_squares(trainer: TrainerView, groups: list[Parts]) -> torch.Tensor:
    """(len(groups),) global sums of squares: shards summed across ranks, replicas counted once."""
    return grouped_sum_squares(trainer, *flat_parts(groups), len(groups))


def grouped_sum_squares(
    trainer: TrainerView, tensors: list[torch.Tensor], rows: list[int] | torch.Tensor, n: int
) -> torch.Tensor:
    """(n,) global sums of squares of `tensors`, tensor j going to group rows[j] // 2, a shard
    when rows[j] is even (summed across ranks), a replica when odd (counted once): one fused norm
    over every tensor (fp32), one scatter-add, one collective."""
    parts = torch.zeros(2 * n, device=trainer.engine.device)
    if tensors:
        squares = torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)).square()
        index = torch.as_tensor(rows, device=parts.device)
        parts.index_add_(0, index, squares.to(parts.device))
    parts = parts.view(n, 2)
    return trainer.engine.all_reduce(parts[:, 0].contiguous(), "sum") + parts[:, 1]


class GradientStats(Callback):
    """Logs `grad_norm/i` and `update_ratio/i` for every block."""

    name = "gradients"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._before: list[Parts] | None = None
        self._grad_sq: torch.Tensor | None = None

    def on_train_start(self, trainer: TrainerView) -> None:
        self._params = [list(b.parameters()) for b in blocks(trainer)]
        self._all = list(unwrap(trainer.engine.model).parameters())  # for the global norm

    def on_after_backward(self, trainer: TrainerView, step: int) -> None:
        if not is_log_step(trainer, step):
            return
        grads = [local_parts(trainer, ps, "grad") for ps in [*self._params, self._all]]
        self._grad_sq = sum_squares(trainer, grads)
        self._before = [
            [
                (None if t is None else t.detach().clone(), s)
                for t, s in local_parts(trainer, ps, "param")
            ]
            for ps in self._params
        ]

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._before is None or self._grad_sq is None:
            return
        share = (self._grad_sq[:-1] / self._grad_sq[-1]).sqrt()
        norms = share * torch.as_tensor(metrics[GRAD]).float()
        diffs: list[Parts] = []
        for ps, olds in zip(self._params, self._before, strict=True):
            pairs = [
                (t.detach(), o, s)
                for (t, s), (o, _) in zip(local_parts(trainer, ps, "param"), olds, strict=True)
                if t is not None and o is not None
            ]
            after, before = [t for t, _, _ in pairs], [o for _, o, _ in pairs]
            delta = torch._foreach_sub(after, before) if pairs else []  # foreach: none empty
            diffs.append([(d, s) for d, (_, _, s) in zip(delta, pairs, strict=True)])
        ratio = (
            sum_squares(trainer, diffs) / sum_squares(trainer, self._before).clamp_min(1e-30)
        ).sqrt()
        for i in range(len(self._before)):
            metrics[block_key(GRAD, i)] = norms[i]
            metrics[block_key(UPDATE, i)] = ratio[i]
        self._before = self._grad_sq = None
