"""Per-block RMS of the residual stream and of each branch output (attention, MLP), and for
post-norm blocks the stream before its closing norm.

Xiong et al. 2020 and Peri-LN (Kim et al. 2025) describe stability through how these grow with
depth. A block ending in a norm (Post-LN, DeepNorm, Mix-LN's post blocks) outputs N(alpha x + F(x)),
whose RMS is about 1 by construction; what grows there is the sum before the norm, which the
wrappers expose through their `pre_norm` tap (model.placements.ResidualTap) and which is logged as
`pre_norm_rms/i` (the MLP sub-layer's sum: the stream at the block's end, before its norm).
Forward hooks are registered only for log steps (armed at the end of the step before), so unlogged
steps run no hook at all; sums of squares stay on the device and reach the host with the
trainer's single copy per log step.
"""

from __future__ import annotations

from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import (
    ATTN_OUT,
    MLP_OUT,
    PRE_NORM,
    RESID,
    block_key,
    blocks,
    is_log_step,
)
from torch.utils.hooks import RemovableHandle

KINDS = (RESID, ATTN_OUT, MLP_OUT, PRE_NORM)


def _sum(module: torch.nn.Module, args: tuple[Any, ...], out: Any) -> torch.Tensor:
    """The tensor a hooked module observes: its output, or for a tap the residual sum."""
    if isinstance(out, tuple):  # ResidualTap: (x, f) -> alpha * x + f, as the norm receives it
        x, f = out
        return module.alpha * x.detach().float() + f.detach().float()
    return out.detach().float()


class ActivationStats(Callback):
    """Logs `resid_rms/i` (output of blocks.i), `attn_out_rms/i` and `mlp_out_rms/i` (the
    branch outputs F(.)) and, for post-norm blocks, `pre_norm_rms/i`; each sqrt(mean(x^2)) over
    every element seen in the step."""

    name = "activations"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._handles: list[RemovableHandle] = []
        self._sumsq: torch.Tensor | None = None
        self._count: torch.Tensor | None = None
        self._tapped: list[int] = []  # blocks with a pre-norm tap

    def on_train_start(self, trainer: TrainerView) -> None:
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    def _arm(self, trainer: TrainerView) -> None:
        mods = blocks(trainer)
        device = next(mods.parameters()).device
        self._sumsq = torch.zeros(len(KINDS), len(mods), device=device)
        # float64: element counts pass 2^24 exactly (fp32 would round them)
        self._count = torch.zeros(len(KINDS), len(mods), device=device, dtype=torch.float64)
        self._tapped = []
        for i, block in enumerate(mods):
            watched = [block, block.attn.branch, block.mlp.branch]
            tap = getattr(block.mlp, "pre_norm", None)
            if tap is not None:
                watched.append(tap)
                self._tapped.append(i)
            for k, module in enumerate(watched):
                hook = self._hook(self._sumsq[k, i], self._count[k, i])
                self._handles.append(module.register_forward_hook(hook))

    @staticmethod
    def _hook(sumsq: torch.Tensor, count: torch.Tensor):  # noqa: ANN205 (a forward hook)
        """Add one output's sum of squares and size into its 0-d cells (tensors, not indices:
        per-block compiled blocks then share one graph)."""

        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            if not module.training:
                return  # an evaluation between two steps is not the training step's statistic
            x = _sum(module, args, out)
            sumsq.add_(x.square().sum())
            count.add_(x.numel())

        return hook

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._handles:
            self._disarm()
            sumsq = trainer.engine.all_reduce(self._sumsq, "sum")
            count = self._count.clone()
            count = trainer.engine.all_reduce(count, "sum")
            rms = (sumsq / count.clamp_min(1)).sqrt().float()
            for k, kind in enumerate(KINDS):
                for i in range(rms.shape[1]) if kind != PRE_NORM else self._tapped:
                    metrics[block_key(kind, i)] = rms[k, i]
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        self._disarm()
