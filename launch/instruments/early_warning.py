"""Online early warning and its actions (SCIENCE.md 23.2 detector, 23.4 actions).

The watched signals are any of `normlab warnings`' (launch.warning.signals): the loss and the
global gradient norm every step, a signal an instrument logs (residual RMS, kurtosis, Adam
state, ...) on the steps it is logged; a per-block signal is watched block by block and alarms
when one block does. Each step the values present are averaged over the ranks in one small
collective and copied to the host (one sync per step, as the spike policy's); the detector of
launch.warning.detector (robust z of the log value against the previous `window` values, alarm
at z >= k; with `levels`, also a level alarm on the value; none during warm-up) sees the same
numbers on every rank, so every rank agrees on the alarm step, as they agree on a stop step.
The signals' rules (direction, log or raw) are those the offline evaluation scores, so the
thresholds `normlab warnings` tunes are the ones to set here. Alarms closer than 50 steps to the
previous one belong to its episode (SCIENCE.md 23.3's R, chained as the evaluation scores them);
`alarms` counts episodes. The action is taken at an episode's first alarm, and again each 50
steps the episode lasts (an alarm still firing 50 steps after the action was not cured by it:
a level that holds, say). The action:

- `checkpoint`: this step becomes a checkpoint step (the ring of good states is
  `checkpoint.keep_last`).
- `backoff`: model and optimizer (and this detector) return to the newest checkpoint before the
  alarm (`backoff_from: checkpoint`, SCIENCE.md 23.4; where there is none, or `max_rollbacks`
  are used, or `backoff_from: alarm`, it stays where it is), and the learning rate is scaled by
  `backoff` (0.5: halved) for the rest of the run, re-warmed linearly from 0 to that over
  `rewarm_steps` steps (SCIENCE.md 23.4 [choice]; no primary source for the halving).
- `rollback`: model and optimizer (and this detector) return to the newest checkpoint before the
  alarm; the step counter and the data go on, so the batches since that checkpoint are skipped,
  and more are drawn and dropped until `skip_batches` steps' worth are (SCIENCE.md 23.4: 200;
  PaLM section 5.1 restarted about 100 steps before the spike and skipped 200-500 batches).
  At most `max_rollbacks`; after that an alarm is only counted.
- `clip_update`: not alarm-driven: every step the whole update is scaled down to
  mean + clip_sigma * std of the last `clip_window` update norms (Levanter's
  `clip_update_by_historical_norm`: no clipping before max(2, window // 2) norms; the history
  keeps the unclipped norms; population std floored at 1e-6). One engine only (the update must
  be whole on one device; preflight refuses the others).

Logged on log steps: `early_warning/alarms`, `early_warning/lr_scale`, `early_warning/rollbacks`
(returns to a checkpoint, by a rollback or a back-off),
`early_warning/did_clip` (steps clipped so far). The detector state is in checkpoints: a resumed
run takes the same decisions.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from pathlib import Path
from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import is_log_step
from normlab.launch.instruments.policy import last_checkpoint_before, step_of
from normlab.launch.metric_keys import (
    EW_ALARMS,
    EW_DID_CLIP,
    EW_LR_SCALE,
    EW_ROLLBACKS,
    block_keys,
)
from normlab.launch.warning.detector import RobustZ, Rule
from normlab.launch.warning.signals import SIGNALS, level_rule

ALARMS, LR_SCALE, ROLLBACKS, DID_CLIP = EW_ALARMS, EW_LR_SCALE, EW_ROLLBACKS, EW_DID_CLIP
MERGE = 50  # alarms closer than this are one episode (SCIENCE.md 23.3's R)


def levanter_threshold(history: list[float], sigma: float, window: int) -> float:
    """Levanter's clip level: mean + sigma * max(std, 1e-6) of the history; inf before
    max(2, window // 2) values."""
    if len(history) < max(2, window // 2):
        return math.inf
    return statistics.fmean(history) + sigma * max(statistics.pstdev(history), 1e-6)


class EarlyWarning(Callback):
    """The online divergence detector of SCIENCE.md 23.4: a robust z-score (and optional level)
    of the watched signals, agreed over ranks, and an action on alarm (checkpoint, lr back-off,
    rollback, clip)."""

    name = "early_warning"
    reads_metrics = True  # runs after the instruments whose metrics it watches

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        s = self.settings = checked_settings(self.name, settings)
        self.signals: list[str] = list(s.signals)
        self.rules = {sig: self._rule(sig, s.levels.get(sig)) for sig in self.signals}
        self.warmup = 0
        self.detectors: dict[str, RobustZ] = {}  # by metric key (a block's own key per block)
        self.source: dict[str, str] = {}  # metric key -> signal
        for sig in self.signals:
            if not SIGNALS[sig].per_block:
                self._detector(SIGNALS[sig].key, sig)
        self.action = s.action
        self.alarms = self.rollbacks = self.clipped = 0
        # backoff: peak scale, re-warm start step
        self.lr_scale = 1.0
        self.rewarm_from: int | None = None
        self.last_alarm: int | None = None
        self.last_action: int | None = None
        self.update_norms: deque[float] = deque(maxlen=s.clip_window)
        self._checkpoint_due = False
        self._before: list[torch.Tensor] | None = None

    @staticmethod
    def _rule(signal: str, level: float | None) -> Rule:
        """The offline evaluation's rule for `signal`, with the level alarm only where set."""
        return level_rule(SIGNALS[signal], None if level is None else float(level))

    def _detector(self, key: str, signal: str) -> RobustZ:
        det = self.detectors.get(key)
        if det is None:
            det = self.detectors[key] = RobustZ(
                self.rules[signal], self.settings.k, self.settings.window, self.warmup
            )
            self.source[key] = signal
        return det

    def _keys(self, metrics: dict[str, Any]) -> list[tuple[str, str]]:
        """(metric key, signal) of each watched value this step holds, in a fixed order (the
        same on every rank: the instruments log on the same steps everywhere)."""
        out = []
        for sig in self.signals:
            signal = SIGNALS[sig]
            if not signal.per_block:
                if signal.key in metrics:
                    out.append((signal.key, sig))
                continue
            out += [(key, sig) for key in block_keys(signal.key, metrics)]
        return out

    def on_train_start(self, trainer: TrainerView) -> None:
        self.warmup = trainer.cfg.schedule.warmup_steps
        for det in self.detectors.values():
            det.warmup = self.warmup

    # --- before the optimizer step --------------------------------------------------------------
    def on_after_backward(self, trainer: TrainerView, step: int) -> None:
        scale = self.scale_at(step)
        if scale != 1.0:
            for group in trainer.engine.optimizer.param_groups:
                group["lr"] *= scale
        if self.action == "clip_update":
            self._before = [p.detach().clone() for p in trainer.engine.model.parameters()]

    def scale_at(self, step: int) -> float:
        """The learning-rate factor of `step`: the backed-off peak, re-warmed linearly."""
        if self.rewarm_from is None:
            return self.lr_scale
        ramp = self.settings.rewarm_steps
        done = (step - self.rewarm_from + 1) / ramp if ramp else 1.0
        return self.lr_scale * min(1.0, done)

    # --- after it -------------------------------------------------------------------------------
    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        self._checkpoint_due = False
        if self.action == "clip_update":
            self._clip(trainer)
        keys = self._keys(metrics)
        values = self._agreed(trainer, [metrics[k] for k, _ in keys]) if keys else []
        hits = []
        for (key, sig), v in zip(keys, values, strict=True):
            if self._detector(key, sig).update(step, v):
                hits.append((key, v))
        if hits:
            # an alarm within MERGE steps of the last one continues its episode (as scored);
            # the action is taken at an episode's start and again each MERGE steps it lasts
            # (an alarm that outlives the action by MERGE steps was not cured by it)
            if self.last_alarm is None or step - self.last_alarm >= MERGE:
                self.alarms += 1
            self.last_alarm = step
            placebo = self.settings.placebo_step > 0  # alarms counted, not acted on
            if not placebo and (self.last_action is None or step - self.last_action >= MERGE):
                self.last_action = step
                self._alarm(trainer, step, hits)
        if step == self.settings.placebo_step > 0:
            self.last_action = step
            self._alarm(trainer, step, [])
        if is_log_step(trainer, step):
            metrics[ALARMS] = float(self.alarms)
            metrics[LR_SCALE] = self.scale_at(step)
            metrics[ROLLBACKS] = float(self.rollbacks)
            metrics[DID_CLIP] = float(self.clipped)

    @staticmethod
    def _agreed(trainer: TrainerView, values: list[Any]) -> list[float]:
        """The values averaged over the ranks, on the host: one collective, one copy."""
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
        stacked = torch.stack(
            [torch.as_tensor(v, device=device).detach().float().reshape(()) for v in values]
        )
        return list(trainer.engine.all_reduce(stacked, "mean").tolist())  # same on every rank

    def _alarm(self, trainer: TrainerView, step: int, hits: list[tuple[str, float]]) -> None:
        what = ", ".join(f"{k} {v:.4g} (z {self.detectors[k].last_z:.1f})" for k, v in hits)
        what = what or "placebo: at a fixed step, not on an alarm"
        if self.action == "checkpoint":
            self._checkpoint_due = True
            self._say(trainer, f"early warning at step {step} ({what}): checkpoint")
        elif self.action == "backoff":
            back = ""
            if self.settings.backoff_from == "checkpoint":
                target = self._restore(trainer, step)
                back = f" from {target.name}" if target is not None else f" ({self._why_not()})"
            self.lr_scale *= self.settings.backoff
            self.rewarm_from = step + 1
            self._say(
                trainer,
                f"early warning at step {step} ({what}): learning rate x{self.lr_scale:g}, "
                f"re-warmed over {self.settings.rewarm_steps} steps{back}",
            )
        elif self.action == "rollback":
            target = self._restore(trainer, step)
            if target is None:
                self._say(trainer, f"early warning at step {step} ({what}): {self._why_not()}")
                return
            since = step - step_of(target)  # the batches since the checkpoint are not replayed
            more = max(0, self.settings.skip_batches - since)
            trainer.skip_batches(more)
            self._say(
                trainer,
                f"early warning at step {step} ({what}): rolled back to {target.name}; "
                f"{since + more} steps' batches skipped",
            )
        else:
            self._say(trainer, f"early warning at step {step} ({what})")

    def _why_not(self) -> str:
        """Why there was no return to a checkpoint."""
        if self.rollbacks >= self.settings.max_rollbacks:
            return f"max_rollbacks ({self.settings.max_rollbacks}) used, no rollback"
        return "no checkpoint before it, no rollback"

    def _restore(self, trainer: TrainerView, step: int) -> Path | None:
        """Model, optimizer and detector back to the newest checkpoint before `step` (the step
        counter and the data go on); None when there is none or max_rollbacks are used."""
        target = last_checkpoint_before(trainer.ckpt.step_dirs(), step)
        if target is None or self.rollbacks >= self.settings.max_rollbacks:
            return None
        extra = trainer.ckpt.restore(trainer.engine, target)
        state = extra.get("callbacks", {}).get(self.name)
        if state:  # the detector as it was then; the counts go on
            self._load_detectors(state)
        self.rollbacks += 1
        return target

    def _clip(self, trainer: TrainerView) -> None:
        """Levanter's update clipping, applied to W_after - W_before."""
        params = list(trainer.engine.model.parameters())
        before, self._before = self._before, None
        if before is None:
            return
        with torch.no_grad():
            deltas = [p - b for p, b in zip(params, before, strict=True)]
            norm = float(torch.linalg.vector_norm(torch.stack([d.norm() for d in deltas])))
            limit = levanter_threshold(list(self.update_norms), *self._clip_args())
            if math.isfinite(norm):
                self.update_norms.append(norm)  # the unclipped norm, as Levanter keeps
            if norm > limit:
                scale = limit / max(norm, 1e-6)
                for p, b, d in zip(params, before, deltas, strict=True):
                    p.copy_(b + scale * d)
                self.clipped += 1

    def _clip_args(self) -> tuple[float, int]:
        return self.settings.clip_sigma, self.settings.clip_window

    def wants_checkpoint(self) -> bool:
        return self._checkpoint_due

    @staticmethod
    def _say(trainer: TrainerView, text: str) -> None:
        if trainer.engine.is_main:
            trainer.console.print(f"[yellow]{text}[/yellow]", highlight=False)

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "detectors": {k: d.state_dict() for k, d in self.detectors.items()},
            "sources": dict(self.source),
            "alarms": self.alarms,
            "rollbacks": self.rollbacks,
            "clipped": self.clipped,
            "lr_scale": self.lr_scale,
            "rewarm_from": self.rewarm_from,
            "update_norms": list(self.update_norms),
            "last_alarm": self.last_alarm,
            "last_action": self.last_action,
        }

    def _load_detectors(self, state: dict[str, Any]) -> None:
        """The detectors as saved: one per metric key seen by then (a key of a signal no longer
        watched is dropped; a watched one not seen yet starts empty)."""
        sources: dict[str, str] = state.get("sources") or {k: k for k in state["detectors"]}
        self.detectors, self.source = {}, {}
        for sig in self.signals:
            if not SIGNALS[sig].per_block:
                self._detector(SIGNALS[sig].key, sig)
        for key, det_state in state["detectors"].items():
            sig = sources.get(key, "")  # older checkpoints: loss and grad_norm, by their key
            if sig in self.rules:
                self._detector(key, sig).load_state_dict(det_state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_detectors(state)
        self.alarms, self.rollbacks = int(state["alarms"]), int(state["rollbacks"])
        self.clipped = int(state["clipped"])
        self.lr_scale, self.rewarm_from = float(state["lr_scale"]), state["rewarm_from"]
        self.update_norms.clear()
        self.update_norms.extend(float(v) for v in state["update_norms"])
        self.last_alarm = state.get("last_alarm")
        self.last_action = state.get("last_action", self.last_alarm)
