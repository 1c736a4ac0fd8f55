"""Outlier kurtosis of each block's output on log steps (docs/SCIENCE.md 24, normlab's outlier
kurtosis; an early-warning signal of SCIENCE.md 23.2, FOG's monitored metric [2nd]).

Per block `blocks.i`, over every token of the step's training forwards (all micro-batches, all
ranks), the two estimators of launch/instruments/outlier_kurtosis.py:
- `kurtosis/ii`: the element kurtosis, mean x^4 / (mean x^2)^2 over all entries, raw (about zero;
  3 for a zero-mean Gaussian). Runs logged before issue 49 hold the centred kurtosis under this
  name (the committed divergence study, docs/warnings/divergence).
- `neuron_kurtosis/ii`: He et al.'s neuron-norm kurtosis, the kurtosis of the per-neuron RMS
  over the tokens (1 when every neuron has the same RMS).
A forward hook, armed only for log steps as the activations instrument's are, adds one row of
sums (d + 2 float64 numbers on the device) per block; one all-reduce at the step's end. Other
steps run no hook and cost nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import is_log_step, unwrap
from normlab.launch.instruments.outlier_kurtosis import (
    moment_row,
    outlier_hook,
    report_outlier_kurtosis,
)
from normlab.launch.metric_keys import ELEMENT_KURTOSIS, NEURON_KURTOSIS
from torch.utils.hooks import RemovableHandle


class ActivationKurtosis(Callback):
    """Element and neuron-norm kurtosis of each block's output on log steps (docs/SCIENCE.md 24)."""

    name = "kurtosis"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._handles: list[RemovableHandle] = []
        self._sums: torch.Tensor | None = None

    def on_train_start(self, trainer: TrainerView) -> None:
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    def _arm(self, trainer: TrainerView) -> None:
        model: Any = unwrap(trainer.engine.model)  # a Transformer: blocks, config.d_model
        bs = model.blocks
        device = next(bs[0].parameters()).device
        self._sums = torch.stack([moment_row(model.config.d_model, device) for _ in bs])
        for i, block in enumerate(bs):
            self._handles.append(block.register_forward_hook(outlier_hook(self._sums[i])))

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._handles and self._sums is not None:
            for h in self._handles:
                h.remove()
            self._handles = []
            total = trainer.engine.all_reduce(self._sums, "sum")
            report_outlier_kurtosis(metrics, total, ELEMENT_KURTOSIS, NEURON_KURTOSIS)
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
