"""Online early warning and its actions (SCIENCE.md 23.2 detector, 23.4 actions).

Every step the watched signals (the loss, the global gradient norm) are averaged over the ranks
in one small collective and copied to the host (one sync per step, as the spike policy's); the
robust z-score detector of launch.warning.detector (log value against the previous `window`
values, alarm at z >= k, none during warm-up) sees the same numbers on every rank, so every rank
agrees on the alarm step, as they agree on a stop step. Alarms closer than 50 steps to the
previous one belong to its episode (SCIENCE.md 23.3's R) and trigger nothing more; `alarms`
counts episodes. On an alarm, the action:

- `checkpoint`: this step becomes a checkpoint step (the ring of good states is
  `checkpoint.keep_last`).
- `backoff`: the learning rate is scaled by `backoff` (0.5: halved) for the rest of the run, and
  re-warmed linearly from 0 to that over `rewarm_steps` steps (SCIENCE.md 23.4 [choice]; no primary
  source for the halving).
- `rollback`: model and optimizer (and this detector) return to the newest checkpoint before the
  alarm; the step counter and the data go on, so the batches since that checkpoint are skipped
  (PaLM section 5.1 restarted about 100 steps before the spike and skipped 200-500 batches).
  At most `max_rollbacks`; after that an alarm is only counted.
- `clip_update`: not alarm-driven: every step the whole update is scaled down to
  mean + clip_sigma * std of the last `clip_window` update norms (Levanter's
  `clip_update_by_historical_norm`: no clipping before max(2, window // 2) norms; the history
  keeps the unclipped norms; population std floored at 1e-6). One engine only (the update must
  be whole on one device; preflight refuses the others).

Logged on log steps: `early_warning/alarms`, `early_warning/lr_scale`, `early_warning/rollbacks`,
`early_warning/did_clip` (steps clipped so far). The detector state is in checkpoints: a resumed
run takes the same decisions.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import is_log_step
from normlab.launch.instruments.policy import last_checkpoint_before
from normlab.launch.warning.detector import RobustZ, Rule

ALARMS, LR_SCALE = "early_warning/alarms", "early_warning/lr_scale"
MERGE = 50  # alarms closer than this are one episode, acted on once (SCIENCE.md 23.3's R)
ROLLBACKS, DID_CLIP = "early_warning/rollbacks", "early_warning/did_clip"


def levanter_threshold(history: list[float], sigma: float, window: int) -> float:
    """Levanter's clip level: mean + sigma * max(std, 1e-6) of the history; inf before
    max(2, window // 2) values."""
    if len(history) < max(2, window // 2):
        return math.inf
    return statistics.fmean(history) + sigma * max(statistics.pstdev(history), 1e-6)


class EarlyWarning(Callback):
    """The online divergence detector of SCIENCE.md 23.4: a robust z-score of the watched
    signals each step, agreed over ranks, and an action on alarm (checkpoint, lr back-off,
    rollback, clip)."""

    name = "early_warning"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        s = self.settings = checked_settings(self.name, settings)
        self.signals: list[str] = list(s.signals)
        self.detectors = {sig: RobustZ(Rule(), s.k, s.window) for sig in self.signals}
        self.action = s.action
        self.alarms = self.rollbacks = self.clipped = 0
        # backoff: peak scale, re-warm start step
        self.lr_scale = 1.0
        self.rewarm_from: int | None = None
        self.last_alarm: int | None = None
        self.update_norms: deque[float] = deque(maxlen=s.clip_window)
        self._checkpoint_due = False
        self._before: list[torch.Tensor] | None = None

    def on_train_start(self, trainer: TrainerView) -> None:
        for det in self.detectors.values():
            det.warmup = trainer.cfg.schedule.warmup_steps

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
        stacked = torch.stack(
            [torch.as_tensor(metrics[s]).detach().float().reshape(()) for s in self.signals]
        )
        values = trainer.engine.all_reduce(stacked, "mean").tolist()  # the same on every rank
        hits = [
            self.detectors[s].update(step, v) for s, v in zip(self.signals, values, strict=True)
        ]
        if any(hits):
            merged = self.last_alarm is not None and step - self.last_alarm < MERGE
            self.last_alarm = step
            if not merged:  # an alarm within MERGE steps of the last one is the same episode
                self._alarm(
                    trainer, step, [s for s, h in zip(self.signals, hits, strict=True) if h]
                )
        if is_log_step(trainer, step):
            metrics[ALARMS] = float(self.alarms)
            metrics[LR_SCALE] = self.scale_at(step)
            metrics[ROLLBACKS] = float(self.rollbacks)
            metrics[DID_CLIP] = float(self.clipped)

    def _alarm(self, trainer: TrainerView, step: int, signals: list[str]) -> None:
        self.alarms += 1
        what = ", ".join(f"{s} z {self.detectors[s].last_z:.1f}" for s in signals)
        if self.action == "checkpoint":
            self._checkpoint_due = True
            self._say(trainer, f"early warning at step {step} ({what}): checkpoint")
        elif self.action == "backoff":
            self.lr_scale *= self.settings.backoff
            self.rewarm_from = step + 1
            self._say(
                trainer,
                f"early warning at step {step} ({what}): learning rate x{self.lr_scale:g}, "
                f"re-warmed over {self.settings.rewarm_steps} steps",
            )
        elif self.action == "rollback":
            self._roll_back(trainer, step, what)
        else:
            self._say(trainer, f"early warning at step {step} ({what})")

    def _roll_back(self, trainer: TrainerView, step: int, what: str) -> None:
        target = last_checkpoint_before(trainer.ckpt.step_dirs(), step)
        if target is None or self.rollbacks >= self.settings.max_rollbacks:
            why = "no checkpoint before it" if target is None else "max_rollbacks used"
            self._say(trainer, f"early warning at step {step} ({what}): {why}, no rollback")
            return
        extra = trainer.ckpt.restore(trainer.engine, target)
        state = extra.get("callbacks", {}).get(self.name)
        if state:  # the detector as it was then; the counts go on
            for sig, det in self.detectors.items():
                det.load_state_dict(state["detectors"][sig])
        self.rollbacks += 1
        self._say(
            trainer,
            f"early warning at step {step} ({what}): rolled back to {target.name}; the batches "
            f"since are skipped",
        )

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
            "detectors": {s: d.state_dict() for s, d in self.detectors.items()},
            "alarms": self.alarms,
            "rollbacks": self.rollbacks,
            "clipped": self.clipped,
            "lr_scale": self.lr_scale,
            "rewarm_from": self.rewarm_from,
            "update_norms": list(self.update_norms),
            "last_alarm": self.last_alarm,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for sig, det in self.detectors.items():
            det.load_state_dict(state["detectors"][sig])
        self.alarms, self.rollbacks = int(state["alarms"]), int(state["rollbacks"])
        self.clipped = int(state["clipped"])
        self.lr_scale, self.rewarm_from = float(state["lr_scale"]), state["rewarm_from"]
        self.update_norms.clear()
        self.update_norms.extend(float(v) for v in state["update_norms"])
        self.last_alarm = state.get("last_alarm")
