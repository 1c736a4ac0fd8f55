"""Spike policy: skip bad optimizer steps; when bad steps go on, roll back, then decide.

A step is bad when the loss (cross-entropy) or the gradient norm is non-finite, or lies more than
`k` population standard deviations above the mean of the last `window` good values (one-sided;
skipped values never enter the window). Judging starts once a window is half full and holds at
least 20 values (the whole window when it is shorter), as OLMo-core's SkipStepOptimizer does
(`max(20, rolling_interval_length // 2)` values). In
fp16 a non-finite gradient norm is left to the loss scaler, which skips that step itself. The
decision needs the values on the host, so this policy costs one small device-to-host copy per step;
it is off unless a recipe lists `instruments.spike_policy`.

One rule, with or without checkpoints:
- Skip. A bad step's update is not applied (OLMo-core's SkipStep). A run of at most
  `max_bad_steps` bad steps is a passing spike: skipping it is all the policy does.
- Roll back. When bad steps go on past `max_bad_steps` (PaLM, Chowdhery et al. 2022, section 5.1:
  restart from a checkpoint before the spike and skip the batches around it), model, optimizer,
  loss-scaler state and this policy's windows return to the newest checkpoint saved before the
  run of bad steps began; the step counter, the learning-rate schedule and the data position go
  on, so the batches since that checkpoint are never applied. The windows come back as saved, so
  the loss of the restored model is judged against the loss that model had.
- Decide. A run of bad steps past `max_bad_steps` that no rollback can answer is a lasting
  change: there is no checkpoint before it, `rollback` is off, `max_rollbacks` are used up, or it
  began right after a rollback with no good step in between (the rollback confirmed it). Finite
  values are then the new level: the windows re-baseline on them and judging resumes once a window
  is half full again. Non-finite values are never a new level: the run stops as diverged (exit
  status 1, the reason in summary.json).
So a lasting level shift ends the same way with or without a checkpoint (accepted as the new
level; with one it costs a rollback first), and non-finite values that persist stop the run either
way.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any

import torch
from normlab.launch.callbacks import Callback, StopRun, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import ROLLBACKS, ROLLED_BACK, SKIPPED
from normlab.launch.metric_keys import GRAD
from normlab.launch.rundir.checkpoint import STEP_DIR

KEYS = ("loss", GRAD)


class SpikePolicy(Callback):
    """Counts `skipped_steps`, `rollbacks` and `rolled_back_steps` (applied updates a rollback
    discarded: the steps so far minus the skipped ones minus the updates the model now holds,
    `applied`, which a checkpoint saves and a rollback restores) and prints each event."""

    name = "spike_policy"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        s = checked_settings(self.name, settings)
        self.k, self.max_bad, self.rollback = s.k, s.max_bad_steps, s.rollback
        self.max_rollbacks = s.max_rollbacks
        self.windows = {key: deque(maxlen=s.window) for key in KEYS}
        # judging starts from half a window, with at least 20 values (or the whole window)
        self.min_values = max(s.window // 2, min(20, s.window))
        self.skipped = self.rollbacks = self.rebaselines = 0
        self.applied: int | None = 0  # updates the model holds (None: resumed from an older one)
        self.bad_values: list[dict[str, float]] = []  # the current run of bad steps
        self.bad_since: int | None = None
        self.good_since_rollback = True
        self._act_due = False

    # --- judging ------------------------------------------------------------------------------
    def judge(self, values: dict[str, float], fp16: bool) -> str | None:
        """Why this step is bad, or None when it is good."""
        for key, v in values.items():
            if not math.isfinite(v):
                if key == GRAD and fp16:
                    continue  # the loss scaler skips it and lowers the scale
                return f"non-finite {key} ({v})"
            win = self.windows[key]
            if len(win) >= self.min_values:
                mean = math.fsum(win) / len(win)
                std = math.sqrt(math.fsum((w - mean) ** 2 for w in win) / len(win))
                if v - mean > self.k * std:
                    return f"{key} {v:.4g} is {(v - mean) / max(std, 1e-30):.1f} std above mean"
        return None

    def should_skip_step(
        self, trainer: TrainerView, step: int, loss: torch.Tensor, grad_norm: torch.Tensor
    ) -> bool:
        pair = torch.stack([loss.detach().float().reshape(()), grad_norm.detach().float()])
        loss_v, grad_v = trainer.engine.all_reduce(pair, "mean").tolist()  # one sync per step
        values = {"loss": loss_v, GRAD: grad_v}
        reason = self.judge(values, trainer.cfg.precision.dtype == "fp16")
        if reason is None:
            self._accept([values])
            self.bad_values, self.bad_since, self.good_since_rollback = [], None, True
            self.applied = None if self.applied is None else self.applied + 1
            return False
        self.bad_values.append(values)
        self.bad_since = self.bad_since or step
        self.skipped += 1
        self._say(trainer, f"spike policy: skipped step {step}: {reason}")
        self._act_due = len(self.bad_values) > self.max_bad
        return True

    def _accept(self, rows: list[dict[str, float]]) -> None:
        for values in rows:
            for key, v in values.items():
                if math.isfinite(v):
                    self.windows[key].append(v)

    # --- acting on a run of bad steps past max_bad_steps ------------------------------------------
    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._act_due:
            self._act_due = False
            target, why = self._rollback_target(trainer)
            if target is None:
                self._decide(trainer, step, why)
            else:
                self._roll_back(trainer, step, target)
        metrics[SKIPPED] = float(self.skipped)
        metrics[ROLLBACKS] = float(self.rollbacks)
        if self.applied is not None:
            metrics[ROLLED_BACK] = float(step - self.skipped - self.applied)

    def _rollback_target(self, trainer: TrainerView) -> tuple[Path | None, str]:
        """The checkpoint to roll back to, or None and why no rollback answers this run."""
        if not self.rollback:
            return None, "rollback is off"
        if not self.good_since_rollback:
            return None, "they began right after a rollback, with no good step in between"
        if self.rollbacks >= self.max_rollbacks:
            return None, f"instruments.spike_policy.max_rollbacks ({self.max_rollbacks}) are used"
        target = last_checkpoint_before(trainer.ckpt.step_dirs(), self.bad_since or 0)
        return target, f"no checkpoint before step {self.bad_since}"

    def _bad_span(self, step: int) -> str:
        return f"{len(self.bad_values)} bad steps in a row (steps {self.bad_since}..{step})"

    def _decide(self, trainer: TrainerView, step: int, why: str) -> None:
        """A lasting change: finite values are the new level, non-finite ones stop the run."""
        fp16 = trainer.cfg.precision.dtype == "fp16"
        if any(self.judge_nonfinite(v, fp16) for v in self.bad_values):
            raise StopRun(
                f"spike policy: {self._bad_span(step)} with non-finite values and {why}: "
                "stopping. Lower optim.lr or lengthen schedule.warmup_steps"
            )
        for win in self.windows.values():
            win.clear()
        self._accept(self.bad_values)
        self.rebaselines += 1
        self._say(
            trainer,
            f"spike policy: {self._bad_span(step)} and {why}: accepting them as the new level "
            "(windows re-baselined; judging resumes once a window is half full)",
        )
        self.bad_values, self.bad_since, self.good_since_rollback = [], None, True

    @staticmethod
    def judge_nonfinite(values: dict[str, float], fp16: bool) -> bool:
        return any(not math.isfinite(v) and not (key == GRAD and fp16) for key, v in values.items())

    def _roll_back(self, trainer: TrainerView, step: int, target: Path) -> None:
        # model, optimizer, scaler (data and step go on); verified, and the recipe's optimizer
        # values kept as on resume: the target may predate a `--force` change of optim.lr
        extra = trainer.ckpt.restore(trainer.engine, target)
        state = extra.get("callbacks", {}).get(self.name, {})
        saved = state.get("windows", {})
        self.applied = state.get("applied") if self.applied is not None else None
        for key, win in self.windows.items():
            win.clear()
            win.extend(float(v) for v in saved.get(key, []))
        self.rollbacks += 1
        self._say(
            trainer,
            f"spike policy: {self._bad_span(step)}: rolled back to {target.name}; "
            f"batches of steps {step_of(target) + 1}..{step} are skipped",
        )
        self.good_since_rollback = False
        self.bad_values, self.bad_since = [], None

    @staticmethod
    def _say(trainer: TrainerView, text: str) -> None:
        if trainer.engine.is_main:
            trainer.console.print(f"[yellow]{text}[/yellow]", highlight=False)

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "windows": {k: list(v) for k, v in self.windows.items()},
            "skipped": self.skipped,
            "rollbacks": self.rollbacks,
            "applied": self.applied,
            "rebaselines": self.rebaselines,
            "bad_values": list(self.bad_values),
            "bad_since": self.bad_since,
            "good_since_rollback": self.good_since_rollback,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """On resume: everything (a rollback restores only the windows, in _roll_back)."""
        for key, values in state["windows"].items():
            self.windows[key].clear()
            self.windows[key].extend(float(v) for v in values)
        self.skipped, self.rollbacks = int(state["skipped"]), int(state["rollbacks"])
        self.rebaselines = int(state.get("rebaselines", 0))
        self.applied = state.get("applied")  # absent in checkpoints from before the count
        self.bad_values = list(state.get("bad_values", []))
        self.bad_since = state.get("bad_since")
        self.good_since_rollback = bool(state.get("good_since_rollback", True))


def step_of(checkpoint: Path) -> int:
    """The step a `step_XXXXXXXX` checkpoint directory holds."""
    m = STEP_DIR.match(checkpoint.name)
    if m is None:
        raise ValueError(f"not a checkpoint directory: {checkpoint}")
    return int(m[1])


def last_checkpoint_before(dirs: list[Path], step: int) -> Path | None:
    """The newest `step_XXXXXXXX` directory saved before `step`."""
    before = [d for d in dirs if (m := STEP_DIR.match(d.name)) and int(m[1]) < step]
    return before[-1] if before else None
