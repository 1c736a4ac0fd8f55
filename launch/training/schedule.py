"""Learning-rate schedules as multipliers of optim.lr (SCIENCE.md section 11).

`step` is the 1-based index of the optimizer update being taken. Linear warm-up reaches the full
rate at `warmup_steps`; the decay phase then runs over the remaining steps.
Vaswani et al. 2017: lr = d^-0.5 * min(step^-0.5, step * warmup^-1.5); here optim.lr multiplies it
(the "factor" of common implementations; 1.0 is the paper).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from normlab.launch.config import ScheduleSection

Multiplier = Callable[[int], float]


def _warmup(step: int, warmup: int) -> float | None:
    return step / warmup if step <= warmup else None


def _decay_progress(step: int, warmup: int, total: int) -> float:
    return min(1.0, (step - warmup) / max(1, total - warmup))


def build_schedule(cfg: ScheduleSection, total_steps: int, d_model: int) -> Multiplier:
    """The lr multiplier for each 1-based update index."""
    warm, floor = cfg.warmup_steps, cfg.min_lr_ratio

    def cosine(step: int) -> float:
        p = _decay_progress(step, warm, total_steps)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p))

    def linear(step: int) -> float:
        return floor + (1.0 - floor) * (1.0 - _decay_progress(step, warm, total_steps))

    def wsd(step: int) -> float:
        decay_start = total_steps - round(cfg.decay_fraction * total_steps)
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
