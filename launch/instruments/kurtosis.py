"""Kurtosis of each block's output on log steps (SCIENCE.md 23.2: FOG's monitored metric, [2nd]).

kurt_i = E[(x - mu)^4] / (E[(x - mu)^2])^2 over every element of blocks.i's output seen in the
step (all micro-batches, all ranks): 3 for a Gaussian, large when a few channels carry outliers.
A forward hook, armed only for log steps as the activations instrument's are, adds the power sums
sum x^k (k = 0..4, float64, on the device) in place; the central moments come from them after
the one all-reduce: m2 = s2/n - mu^2, m4 = s4/n - 4 mu s3/n + 6 mu^2 s2/n - 3 mu^4. Float64
keeps the cancellation harmless for activations of RMS near 1 (tests hold it to a two-pass
computation). Logged as `kurtosis/ii`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import block_key, blocks, is_log_step
from normlab.launch.metric_keys import KURTOSIS
from torch.utils.hooks import RemovableHandle


def kurtosis_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """Kurtosis from power sums (..., 5) = (n, sum x, sum x^2, sum x^3, sum x^4)."""
    n = sums[..., 0].clamp_min(1)
    mu, e2, e3, e4 = (sums[..., k] / n for k in range(1, 5))
    m2 = e2 - mu**2
    m4 = e4 - 4 * mu * e3 + 6 * mu**2 * e2 - 3 * mu**4
    return m4 / (m2**2).clamp_min(1e-300)


class ActivationKurtosis(Callback):
    """Kurtosis of each block's output on log steps (SCIENCE.md 23.2, FOG's outlier metric)."""

    name = "kurtosis"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._handles: list[RemovableHandle] = []
        self._sums: torch.Tensor | None = None

    def on_train_start(self, trainer: TrainerView) -> None:
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    def _arm(self, trainer: TrainerView) -> None:
        bs = blocks(trainer)
        device = next(bs[0].parameters()).device
        self._sums = torch.zeros(len(bs), 5, dtype=torch.float64, device=device)
        for i, block in enumerate(bs):
            self._handles.append(block.register_forward_hook(self._hook(self._sums[i])))

    @staticmethod
    def _hook(row: torch.Tensor) -> Callable[[torch.nn.Module, Any, torch.Tensor], None]:
        def hook(module: torch.nn.Module, args: Any, out: torch.Tensor) -> None:
            if not module.training:
                return
            x = out.detach().double().flatten()
            x2 = x * x
            row.add_(torch.stack([x.new_tensor(float(x.numel())), x.sum(), x2.sum(),
                                  (x2 * x).sum(), (x2 * x2).sum()]))  # fmt: skip

        return hook

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._handles and self._sums is not None:
            for h in self._handles:
                h.remove()
            self._handles = []
            total = trainer.engine.all_reduce(self._sums, "sum")
            kurt = kurtosis_from_sums(total).float()
            for i in range(kurt.shape[0]):
                metrics[block_key(KURTOSIS, i)] = kurt[i]
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
