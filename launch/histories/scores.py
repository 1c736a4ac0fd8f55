"""Spike scores and early-warning events of a History, computed as a normlab run's are.

Spike score (launch/instruments/spikes.py, SCIENCE.md 8): the loss's and the grad norm's finite
logged values are the series, the window is `run_window(1000, n)` for n logged loss values (the
instrument's rule with the run's length counted in logged values: equal to a normlab run's when
it logs every step). Events E1-E3 (launch/warning/events.py, SCIENCE.md 23.1): find_events on the
rows (step, loss, grad_norm) with the history's warm-up, l_0 (its init_loss, else the first
logged loss), fp16 flag and planned length (--steps; without it a history is not "completed":
an excursion that runs to its last step counts [choice], as for a run that stopped early).
"""

from __future__ import annotations

import math
from typing import Any

from normlab.launch.histories.history import History
from normlab.launch.histories.sources import GRAD, LOSS
from normlab.launch.instruments.spikes import run_window, spike_score
from normlab.launch.warning.events import Event, find_events

WINDOW, K = 1000, 7.0  # the spike_score instrument's defaults (OLMo 2)


def _finite(values: tuple[float, ...]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def spike_scores(history: History, window: int = WINDOW, k: float = K) -> dict[str, Any]:
    """{'spike_loss', 'spike_grad': percent or None (no point with a full window or no grad
    norm logged), 'spike_window': the window used, 'nonfinite': rows with a non-finite loss (or
    grad norm outside fp16)}."""
    losses = _finite(history.loss.values)
    used = run_window(window, len(losses))
    grad = history.get(GRAD)
    out: dict[str, Any] = {"spike_window": used}
    for key, values in (
        ("spike_loss", losses),
        ("spike_grad", _finite(grad.values) if grad else []),
    ):
        score = spike_score(values, used, k) if values else math.nan
        out[key] = None if math.isnan(score) else score
    out["nonfinite"] = sum(
        not math.isfinite(r[LOSS]) or (not history.fp16 and not math.isfinite(r.get(GRAD, 0.0)))
        for r in train_rows(history)
    )
    return out


def train_rows(history: History) -> list[dict[str, float]]:
    """One row per logged loss step: the step, the loss and each other series logged there."""
    others = {name: s.at() for name, s in history.series.items() if name != LOSS}
    rows = []
    for step, loss in zip(history.loss.steps, history.loss.values, strict=True):
        row: dict[str, float] = {"step": step, LOSS: loss}
        row.update({name: at[step] for name, at in others.items() if step in at})
        rows.append(row)
    return rows


def history_events(history: History) -> list[Event]:
    """E1-E3 of the history (launch/warning/events.find_events)."""
    return find_events(
        train_rows(history),
        warmup_steps=history.warmup_steps,
        init_loss=history.init_loss,
        fp16=history.fp16,
        total_steps=history.total_steps,
    )
