"""Gradient-spike score (OLMo 2, Team OLMo 2024, section 3.2; SCIENCE.md section 8).

"The percentage of values in a time series that are at least seven standard deviations away from a
rolling average of the last 1,000 values", for the training loss and the gradient L2 norm. normlab's
reading: two-sided; the window is the previous `window` values, not the current one; population
standard deviation; only points with a full window are scored; a percentage. A point equal to its
window mean is never a spike (so a constant series scores 0). Non-finite values are left out of the
series and counted apart. Not OLMo-core's StabilityMonitor (128 values, 6 std, one-sided).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from launch.instruments.common import (
    NONFINITE,
    SPIKE_GRAD,
    SPIKE_LOSS,
    is_log_step,
    settings_of,
)
from launch.training.callbacks import Callback

if TYPE_CHECKING:
    from launch.training.trainer import Trainer


def spike_flags(series: np.ndarray, window: int, k: float) -> np.ndarray:
    """For each series[t] with t >= window: is it a spike against series[t - window : t]?"""
    x = np.asarray(series, dtype=np.float64)
    n = len(x) - window
    if n <= 0:
        return np.zeros(0, dtype=bool)
    x = x - x.mean()  # centring keeps the running-sum variance accurate
    c1 = np.concatenate([[0.0], np.cumsum(x)])
    c2 = np.concatenate([[0.0], np.cumsum(x * x)])
    mean = (c1[window : window + n] - c1[:n]) / window
    var = np.maximum((c2[window : window + n] - c2[:n]) / window - mean**2, 0.0)
    dev = np.abs(x[window:] - mean)
    # relative slack absorbs running-sum rounding: equal values must not count as deviating
    return (dev >= k * np.sqrt(var)) & (dev > 1e-9 * (1.0 + np.abs(mean)))


def spike_score(values: Sequence[float], window: int = 1000, k: float = 7.0) -> float:
    """Percentage of scored points lying at least k population std from the mean of the previous
    `window` values; NaN when no point has a full window."""
    flags = spike_flags(np.asarray(values, dtype=np.float64), window, k)
    return 100.0 * float(flags.mean()) if len(flags) else math.nan


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
        return {"history": list(self.history), "scored": self.scored, "spikes": self.spikes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [float(v) for v in state["history"]]
        self.scored, self.spikes = int(state["scored"]), int(state["spikes"])


class SpikeScore(Callback):
    """Logs `spike_score/loss`, `spike_score/grad_norm` (percent, over the run so far) and
    `nonfinite_steps`. Per step it only keeps references to the loss and gradient-norm tensors;
    on log steps they cross to the host in one copy."""

    name = "spike_score"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        s = settings_of(settings, {"window": 1000, "k": 7.0}, self.name)
        if s["window"] < 1 or s["k"] <= 0:
            from launch.errors import ConfigError

            raise ConfigError(
                f"instruments.spike_score needs window >= 1 and k > 0, got {s['window']}, {s['k']}"
            )
        self.loss = RollingSpikeScore(s["window"], s["k"])
        self.grad = RollingSpikeScore(s["window"], s["k"])
        self.nonfinite = 0
        self._pending: list[torch.Tensor] = []

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        self._pending.append(metrics["loss"].detach().float().reshape(()))
        self._pending.append(torch.as_tensor(metrics["grad_norm"]).detach().float().reshape(()))
        if is_log_step(trainer, step):
            self._flush()
            metrics[SPIKE_LOSS] = self.loss.score
            metrics[SPIKE_GRAD] = self.grad.score
            metrics[NONFINITE] = float(self.nonfinite)

    def _flush(self) -> None:
        if not self._pending:
            return
        values = torch.stack([t.to(self._pending[0].device) for t in self._pending]).tolist()
        self._pending = []
        losses, grads = values[0::2], values[1::2]
        self.nonfinite += sum(
            not (math.isfinite(a) and math.isfinite(b)) for a, b in zip(losses, grads, strict=True)
        )
        self.loss.update(losses)
        self.grad.update(grads)

    def state_dict(self) -> dict[str, Any]:
        self._flush()  # a checkpoint step need not be a log step
        return {
            "loss": self.loss.state_dict(),
            "grad_norm": self.grad.state_dict(),
            "nonfinite": self.nonfinite,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss.load_state_dict(state["loss"])
        self.grad.load_state_dict(state["grad_norm"])
        self.nonfinite = int(state["nonfinite"])
        self._pending = []
