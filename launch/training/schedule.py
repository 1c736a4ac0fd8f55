"""Learning-rate schedules as multipliers of optim.lr (SCIENCE.md section 11).

`step` is the 1-based index of the optimizer update being taken. Linear warm-up reaches the full
rate at `warmup_steps`; the decay phase then runs over the remaining steps.
Vaswani et al. 2017: lr = d^-0.5 * min(step^-0.5, step * warmup^-1.5); here optim.lr multiplies it
(the "factor" of common implementations; 1.0 is the paper).

Resuming with another plan (more `training.steps`, another kind or lr) changes the lr from the
resume step on; `lr_change` says by how much. Only WSD extends a run without a jump: its stable
phase is at the peak rate whatever the total, so a run resumed from a checkpoint of its stable
phase (`stable_end`; the trainer keeps that checkpoint) with a larger total stays at the peak and
decays over the last `decay_fraction` of the new total. Cosine and linear decays depend on the
total at every step, so a longer total raises the lr of a resumed run at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from normlab.launch.config import RunConfig, ScheduleSection

Multiplier = Callable[[int], float]


def _warmup(step: int, warmup: int) -> float | None:
    return step / warmup if step <= warmup else None


def _decay_progress(step: int, warmup: int, total: int) -> float:
    return min(1.0, (step - warmup) / max(1, total - warmup))


def stable_end(cfg: ScheduleSection, total_steps: int) -> int | None:
    """WSD: the last step at the peak rate (the decay starts after it); None for other kinds."""
    if cfg.kind != "wsd":
        return None
    return total_steps - round(cfg.decay_fraction * total_steps)


def build_schedule(cfg: ScheduleSection, total_steps: int, d_model: int) -> Multiplier:
    """The lr multiplier for each 1-based update index."""
    warm, floor = cfg.warmup_steps, cfg.min_lr_ratio

    def cosine(step: int) -> float:
        p = _decay_progress(step, warm, total_steps)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p))

    def linear(step: int) -> float:
        return floor + (1.0 - floor) * (1.0 - _decay_progress(step, warm, total_steps))

    def wsd(step: int) -> float:
        decay_start = total_steps - round(cfg.decay_fraction * total_steps)  # = stable_end
        if step <= decay_start:
            return 1.0
        p = (step - decay_start) / max(1, total_steps - decay_start)
        return floor + (1.0 - floor) * (1.0 - p)

    def inv_sqrt(step: int) -> float:
        return math.sqrt(max(warm, 1) / step)

    decays: dict[str, Multiplier] = {
        "cosine": cosine,
        "linear": linear,
        "constant": lambda step: 1.0,
        "wsd": wsd,
        "inv_sqrt": inv_sqrt,
    }
    if cfg.kind == "vaswani":
        return lambda step: d_model**-0.5 * min(step**-0.5, step * warm**-1.5)
    decay = decays[cfg.kind]

    def multiplier(step: int) -> float:
        w = _warmup(step, warm)
        return w if w is not None else decay(step)

    return multiplier


def lr_plan(lr: float, cfg: ScheduleSection, total_steps: int, d_model: int) -> Multiplier:
    """The learning rate of each 1-based update index: `lr` (optim.lr) times the schedule."""
    multiplier = build_schedule(cfg, total_steps, d_model)
    return lambda step: lr * multiplier(step)


def lr_change(saved: dict, cfg: RunConfig, step: int) -> str | None:
    """The line for a resume at `step` whose recipe plans the lr otherwise than the checkpoint's
    `saved` config (RunConfig.to_dict()) did: the lr of `step` under both plans. None when the
    plan is the same (or the saved config predates these sections)."""
    try:
        old_cfg = ScheduleSection(**saved["schedule"])
        old_steps, old_lr = int(saved["training"]["steps"]), float(saved["optim"]["lr"])
    except (KeyError, TypeError, ValueError):
        return None
    new_cfg, new_steps, new_lr = cfg.schedule, cfg.training.steps, cfg.optim.lr
    if (old_cfg, old_steps, old_lr) == (new_cfg, new_steps, new_lr):
        return None
    d_model = cfg.model_config().d_model
    old_at = lr_plan(old_lr, old_cfg, old_steps, d_model)
    new_at = lr_plan(new_lr, new_cfg, new_steps, d_model)
    before, after = old_at(step), new_at(step)
    what = [f"optim.lr {old_lr:.4g} -> {new_lr:.4g}"] if old_lr != new_lr else []
    if (old_cfg, old_steps) != (new_cfg, new_steps):
        what.append(f"{old_cfg.kind} over {old_steps} steps -> {new_cfg.kind} over {new_steps}")
    head = (
        f"learning-rate plan changed on resume ({'; '.join(what)}): lr at step {step} "
        f"{before:.4g} -> {after:.4g}"
    )
    if step < new_steps:
        head += f", step {step + 1} takes {new_at(step + 1):.4g}"
    if math.isclose(before, after, rel_tol=1e-9, abs_tol=0.0):
        return f"{head} (continuous)"
    ratio = f" of x{after / before:.3g}" if before > 0 else ""
    return (
        f"{head}: a jump{ratio}; to extend a run without one, use schedule.kind=wsd and resume "
        "from the checkpoint kept at the end of its stable phase (--from)"
    )
