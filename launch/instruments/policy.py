"""Spike policy: skip bad optimizer steps; after N in a row, roll back to the last good checkpoint.

A step is bad when the loss or the gradient norm is non-finite, or lies more than `k` population
standard deviations above the mean of the last `window` good values (one-sided; skipped values
never enter the window). In fp16 a non-finite gradient norm is left to the loss scaler, which skips
that step itself. The decision needs the values on the host, so this policy costs one small
device-to-host copy per step; it is off unless a recipe lists `instruments.spike_policy`.

Rollback (PaLM, Chowdhery et al. 2022, section 5.1: restart from a checkpoint before the spike and
skip the batches around it): model, optimizer and loss-scaler state return to the newest checkpoint
saved before the run of bad steps began; the step counter, the learning-rate schedule and the data
position go on, so the batches since that checkpoint are never applied. Without such a checkpoint
the bad steps are let through (the trainer then stops a run whose loss is non-finite).
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from launch.errors import ConfigError
from launch.instruments.common import ROLLBACKS, SKIPPED, settings_of
from launch.training.callbacks import Callback
from launch.training.checkpoint import STEP_DIR

if TYPE_CHECKING:
    from launch.training.trainer import Trainer

DEFAULTS = {"window": 1000, "k": 7.0, "max_bad_steps": 5, "rollback": True}


class SpikePolicy(Callback):
    """Counts `skipped_steps` and `rollbacks` in the metrics and prints each one."""

    name = "spike_policy"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        s = settings_of(settings, DEFAULTS, self.name)
        if s["window"] < 2 or s["k"] <= 0 or s["max_bad_steps"] < 1:
            raise ConfigError(
                "instruments.spike_policy needs window >= 2, k > 0 and max_bad_steps >= 1, got "
                f"{s['window']}, {s['k']}, {s['max_bad_steps']}"
            )
        self.k, self.max_bad, self.rollback = s["k"], s["max_bad_steps"], bool(s["rollback"])
        self.windows = {"loss": deque(maxlen=s["window"]), "grad_norm": deque(maxlen=s["window"])}
        self.skipped = self.rollbacks = self.bad_run = 0
        self.bad_since: int | None = None
        self._rollback_due = self._let_through = False

    def judge(self, values: dict[str, float], fp16: bool) -> str | None:
        """Why this step is bad, or None when it is good."""
        for key, v in values.items():
            if not math.isfinite(v):
                if key == "grad_norm" and fp16:
                    continue  # the loss scaler skips it and lowers the scale
                return f"non-finite {key} ({v})"
            win = self.windows[key]
            if len(win) == win.maxlen:
                mean = sum(win) / len(win)
                std = math.sqrt(sum((w - mean) ** 2 for w in win) / len(win))
                if v - mean > self.k * std:
                    return f"{key} {v:.4g} is {(v - mean) / max(std, 1e-30):.1f} std above mean"
        return None

    def should_skip_step(
        self, trainer: Trainer, step: int, loss: torch.Tensor, grad_norm: torch.Tensor
    ) -> bool:
        pair = torch.stack([loss.detach().float().reshape(()), grad_norm.detach().float()])
        loss_v, grad_v = trainer.engine.all_reduce(pair, "mean").tolist()  # one sync per step
        values = {"loss": loss_v, "grad_norm": grad_v}
        reason = self.judge(values, trainer.cfg.precision.dtype == "fp16")
        if reason is None:
            for key, v in values.items():
                if math.isfinite(v):
                    self.windows[key].append(v)
            self.bad_run, self.bad_since, self._let_through = 0, None, False
            return False
        self.bad_run += 1
        self.bad_since = self.bad_since or step
        if self._let_through:
            return False
        self.skipped += 1
        self._say(trainer, f"spike policy: skipped step {step}: {reason}")
        if self.rollback and self.bad_run >= self.max_bad:
            self._rollback_due = True
        return True

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if self._rollback_due:
            self._rollback_due = False
            self._roll_back(trainer, step)
        metrics[SKIPPED] = float(self.skipped)
        metrics[ROLLBACKS] = float(self.rollbacks)

    def _roll_back(self, trainer: Trainer, step: int) -> None:
        target = last_checkpoint_before(trainer.ckpt.step_dirs(), self.bad_since or step)
        if target is None:
            self._say(
                trainer,
                f"spike policy: {self.bad_run} bad steps in a row and no checkpoint before step "
                f"{self.bad_since}: letting bad steps through",
            )
            self._let_through = True
            return
        trainer.engine.load(target)  # model, optimizer, scaler; data and step go on
        self.rollbacks += 1
        self._say(
            trainer,
            f"spike policy: {self.bad_run} bad steps in a row: rolled back to {target.name}; "
            f"batches of steps {int(STEP_DIR.match(target.name)[1]) + 1}..{step} are skipped",
        )
        self.bad_run, self.bad_since = 0, None

    @staticmethod
    def _say(trainer: Trainer, text: str) -> None:
        if trainer.engine.is_main:
            trainer.console.print(f"[yellow]{text}[/yellow]", highlight=False)

    def state_dict(self) -> dict[str, Any]:
        return {
            "windows": {k: list(v) for k, v in self.windows.items()},
            "skipped": self.skipped,
            "rollbacks": self.rollbacks,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, values in state["windows"].items():
            self.windows[key].clear()
            self.windows[key].extend(float(v) for v in values)
        self.skipped, self.rollbacks = int(state["skipped"]), int(state["rollbacks"])


def last_checkpoint_before(dirs: list[Path], step: int) -> Path | None:
    """The newest `step_XXXXXXXX` directory saved before `step`."""
    before = [d for d in dirs if (m := STEP_DIR.match(d.name)) and int(m[1]) < step]
    return before[-1] if before else None
