"""Per-block RMS of the residual stream and of each branch output (attention, MLP).

Xiong et al. 2020 and Peri-LN (Kim et al. 2025) describe stability through how these grow with
depth. Forward hooks are registered only for log steps (armed at the end of the step before), so
unlogged steps run no hook at all; sums of squares stay on the device and reach the host with the
trainer's single copy per log step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from launch.instruments.common import (
    ATTN_OUT,
    MLP_OUT,
    RESID,
    block_key,
    blocks,
    is_log_step,
    settings_of,
)
from launch.training.callbacks import Callback

if TYPE_CHECKING:
    from launch.training.trainer import Trainer

KINDS = (RESID, ATTN_OUT, MLP_OUT)


class ActivationStats(Callback):
    """Logs `resid_rms/i` (output of blocks.i), `attn_out_rms/i` and `mlp_out_rms/i` (the
    branch outputs F(.)), each sqrt(mean(x^2)) over every element seen in the step."""

    name = "activations"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        settings_of(settings, {}, self.name)
        self._handles: list[RemovableHandle] = []
        self._sumsq: torch.Tensor | None = None
        self._count: list[list[int]] = []

    def on_train_start(self, trainer: Trainer) -> None:
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    def _arm(self, trainer: Trainer) -> None:
        mods = blocks(trainer)
        device = next(mods.parameters()).device
        self._sumsq = torch.zeros(len(KINDS), len(mods), device=device)
        self._count = [[0] * len(mods) for _ in KINDS]
        for i, block in enumerate(mods):
            for k, module in enumerate((block, block.attn.branch, block.mlp.branch)):
                self._handles.append(module.register_forward_hook(self._hook(k, i)))

    def _hook(self, k: int, i: int):  # noqa: ANN202 (a forward hook)
        def hook(module: torch.nn.Module, args: Any, out: torch.Tensor) -> None:
            if not module.training or self._sumsq is None:
                return  # an evaluation between two steps is not the training step's statistic
            self._sumsq[k, i] += out.detach().float().square().sum()
            self._count[k][i] += out.numel()

        return hook

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if self._handles:
            self._disarm()
            sumsq = trainer.engine.all_reduce(self._sumsq, "sum")
            count = torch.tensor(self._count, dtype=torch.float32, device=sumsq.device)
            count = trainer.engine.all_reduce(count, "sum")
            rms = (sumsq / count.clamp_min(1)).sqrt()
            for k, kind in enumerate(KINDS):
                for i in range(rms.shape[1]):
                    metrics[block_key(kind, i)] = rms[k, i]
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def on_train_end(self, trainer: Trainer, status: str) -> None:
        self._disarm()
