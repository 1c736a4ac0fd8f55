"""Gradient-spike score (OLMo 2, Team OLMo 2024, section 3.2; SCIENCE.md section 8).

"The percentage of values in a time series that are at least seven standard deviations away from a
rolling average of the last 1,000 values", for the training loss (cross-entropy, without the
z-loss) and the gradient L2 norm. normlab's reading: two-sided; the window is the previous `window`
values, not the current one; population standard deviation; only points with a full window are
scored; a percentage. A point equal to its window mean is never a spike (so a constant series
scores 0). Not OLMo-core's StabilityMonitor (128 values, 6 std, one-sided).

Window statistics are exact: each window's mean and standard deviation come from its own values
(two passes, the deviations centred on that window's mean), never from running sums, which one
huge value (1e8 beside values near 1) would ruin for the next thousand windows.

A run shorter than twice the window is scored with the window scaled to it, steps // 2 (so half
the run is scored): a 300-step run uses 150. The window used is logged as `spike_score/window` and
stated by `normlab compare`. Scores are logged once some point has been scored; before that they
are absent ("-" in compare: not measured). Non-finite values are left out of the series and counted
apart: `nonfinite_steps` (a non-finite loss, or gradient norm outside fp16) and `scaler_skips`
(fp16: finite loss, non-finite gradient norm: the loss scaler skipped that update and lowered
its scale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import (
    NONFINITE,
    SCALER_SKIPS,
    SPIKE_GRAD,
    SPIKE_LOSS,
    SPIKE_WINDOW,
    is_log_step,
)
from normlab.launch.metric_keys import GRAD
from numpy.lib.stride_tricks import sliding_window_view

CHUNK_ELEMENTS = 1 << 20  # window rows per numpy pass: bounded memory for any series length


def window_stats(series: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, population std) of series[t - window : t] for each t in window..len - 1, each
    computed from that window's own values (no running sums)."""
    x = np.asarray(series, dtype=np.float64)
    n = max(len(x) - window, 0)
    mean, std = np.empty(n), np.empty(n)
    rows = max(1, CHUNK_ELEMENTS // window)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        view = sliding_window_view(x[start : stop + window - 1], window)  # windows start..stop-1
        m = view.mean(axis=1)
        mean[start:stop] = m
        std[start:stop] = np.sqrt(np.square(view - m[:, None]).mean(axis=1))
    return mean, std


def spike_flags(series: np.ndarray, window: int, k: float) -> np.ndarray:
    """For each series[t] with t >= window: is it a spike against series[t - window : t]?"""
    x = np.asarray(series, dtype=np.float64)
    mean, std = window_stats(x, window)
    dev = np.abs(x[window:] - mean)
    return (dev >= k * std) & (dev > 0)


def spike_score(values: Sequence[float], window: int = 1000, k: float = 7.0) -> float:
    """Percentage of scored points lying at least k population std from the mean of the previous
    `window` values; NaN when no point has a full window."""
    flags = spike_flags(np.asarray(values, dtype=np.float64), window, k)
    return 100.0 * float(flags.mean()) if len(flags) else math.nan


def run_window(window: int, steps: int) -> int:
    """The window for a run of `steps` steps: `window`, or steps // 2 when the run is shorter than
    twice the window (at least 1)."""
    return max(1, min(window, steps // 2))


class RollingSpikeScore:
    """spike_score over a series that arrives in pieces; keeps only the last `window` values."""

    def __init__(self, window: int = 1000, k: float = 7.0) -> None:
        self.window, self.k = window, k
        self.history: list[float] = []
        self.scored = 0
        self.spikes = 0

    def update(self, values: Sequence[float]) -> None:
        series = self.history + [v for v in values if math.isfinite(v)]
        start = max(0, len(self.history) - self.window)
        flags = spike_flags(np.asarray(series[start:]), self.window, self.k)
        self.scored += len(flags)
        self.spikes += int(flags.sum())
        self.history = series[-self.window :]

    @property
    def score(self) -> float:
        return 100.0 * self.spikes / self.scored if self.scored else math.nan

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "history": list(self.history),
            "scored": self.scored,
            "spikes": self.spikes,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window = int(state.get("window", self.window))
        self.history = [float(v) for v in state["history"]]
        self.scored, self.spikes = int(state["scored"]), int(state["spikes"])


class SpikeScore(Callback):
    """Logs `spike_score/loss`, `spike_score/grad_norm` (percent, over the run so far, once some
    point is scored), `spike_score/window`, `nonfinite_steps` and `scaler_skips`. Per step it only
    keeps references to the loss and gradient-norm tensors; on log steps they cross to the host
    in one copy."""

    name = "spike_score"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        s = checked_settings(self.name, settings)
        self.loss = RollingSpikeScore(s.window, s.k)
        self.grad = RollingSpikeScore(s.window, s.k)
        self.nonfinite = self.scaler_skips = 0
        self.restored, self.fp16 = False, False
        self._pending: list[torch.Tensor | float] = []

    def on_train_start(self, trainer: TrainerView) -> None:
        if not self.restored:  # a resumed run keeps the window it started with
            window = run_window(self.loss.window, trainer.cfg.training.steps)
            self.loss.window = self.grad.window = window
        self.fp16 = trainer.cfg.precision.dtype == "fp16"

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        # references only: no tensor op off log steps (the conversions run in _flush)
        self._pending += [metrics["loss"], metrics[GRAD]]
        if is_log_step(trainer, step):
            self._flush()
            for key, rolling in ((SPIKE_LOSS, self.loss), (SPIKE_GRAD, self.grad)):
                if rolling.scored:
                    metrics[key] = rolling.score
            metrics[SPIKE_WINDOW] = float(self.loss.window)
            metrics[NONFINITE] = float(self.nonfinite)
            metrics[SCALER_SKIPS] = float(self.scaler_skips)

    def _flush(self) -> None:
        if not self._pending:
            return
        device = next((t.device for t in self._pending if isinstance(t, torch.Tensor)), None)
        values = torch.stack(
            [torch.as_tensor(t, device=device).detach().float().reshape(()) for t in self._pending]
        ).tolist()
        self._pending = []
        losses, grads = values[0::2], values[1::2]
        for loss, grad in zip(losses, grads, strict=True):
            if not math.isfinite(loss) or (not math.isfinite(grad) and not self.fp16):
                self.nonfinite += 1
            elif not math.isfinite(grad):
                self.scaler_skips += 1
        self.loss.update(losses)
        self.grad.update(grads)

    def state_dict(self) -> dict[str, Any]:
        self._flush()  # a checkpoint step need not be a log step
        return {
            "loss": self.loss.state_dict(),
            "grad_norm": self.grad.state_dict(),
            "nonfinite": self.nonfinite,
            "scaler_skips": self.scaler_skips,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss.load_state_dict(state["loss"])
        self.grad.load_state_dict(state["grad_norm"])
        self.nonfinite = int(state["nonfinite"])
        self.scaler_skips = int(state.get("scaler_skips", 0))
        self.restored = True
        self._pending = []
