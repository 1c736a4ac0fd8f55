"""The online detector of SCIENCE.md 23.2: a robust z-score over a trailing window, plus a level.

For a positive signal x_t, u_t = log x_t (|x_t| or x_t for a signal that may be negative);
against the previous `window` values (the current one excluded)

    z_t = (u_t - median(W)) / (1.4826 * MAD(W)),

scored once W holds at least window // 2 values. A rising signal alarms at z_t >= k, a falling
one (attention entropy) at z_t <= -k; no alarm during the learning-rate warm-up. A level alarm
(SCIENCE.md 23.2's table: `S_max > 50`, `r_b >= 2`, ...) fires on the raw value, or with
`level_is_ratio` on x_t / median(x over W). A MAD of zero (a constant window) scores nothing:
no spread, no z. Non-finite values are neither scored nor enter the window (they are E1 events).

`RobustZ` is the online form (one value at a time, a deque; its state goes into checkpoints);
`zscores` the offline form over a whole series; a test holds them equal.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MAD_SCALE = 1.4826  # MAD of a normal distribution -> its standard deviation
WINDOW, K = 100, 6.0


@dataclass(frozen=True)
class Rule:
    """How one signal alarms: direction of the z test, an optional level, the log transform."""

    rising: bool = True  # False: alarm on a drop (z <= -k)
    level: float | None = None  # level alarm on the value (or its ratio to the window median)
    level_is_ratio: bool = False
    level_above: bool = True  # False: alarm when the value is at or below the level
    transform: str = "log"  # z-score of log x (positive signals), |x| ("abs") or x ("none")


def _u(x: float, transform: str) -> float:
    if not math.isfinite(x):
        return math.nan
    if transform == "log":
        return math.log(x) if x > 0 else math.nan
    return abs(x) if transform == "abs" else x


def robust_z(u: float, window: Sequence[float]) -> float:
    """The robust z-score of u against `window`; NaN where the MAD is 0."""
    med = statistics.median(window)
    mad = statistics.median(abs(w - med) for w in window)
    return (u - med) / (MAD_SCALE * mad) if mad > 0 else math.nan


def zscores(values: Sequence[float], window: int = WINDOW, transform: str = "log") -> np.ndarray:
    """z_t for each value of a series (NaN where not scored): the offline form of RobustZ."""
    u = np.array([_u(float(v), transform) for v in values])
    ok = np.isfinite(u)
    kept = u[ok]
    z = np.full(len(u), math.nan)
    out = np.full(len(kept), math.nan)
    for i in range(len(kept)):
        past = kept[max(0, i - window) : i]
        if len(past) >= max(1, window // 2):
            med = np.median(past)
            mad = np.median(np.abs(past - med))
            if mad > 0:
                out[i] = (kept[i] - med) / (MAD_SCALE * mad)
    z[ok] = out
    return z


def ratios(values: Sequence[float], window: int = WINDOW) -> np.ndarray:
    """x_t / median(previous `window` finite values): the ratio a ratio level tests."""
    x = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(x)
    kept = x[ok]
    out = np.full(len(kept), math.nan)
    for i in range(len(kept)):
        past = kept[max(0, i - window) : i]
        if len(past) >= max(1, window // 2):
            med = np.median(past)
            out[i] = kept[i] / med if med > 0 else math.nan
    r = np.full(len(x), math.nan)
    r[ok] = out
    return r


def alarms(
    steps: Sequence[int],
    values: Sequence[float],
    rule: Rule,
    k: float = K,
    warmup_steps: int = 0,
    use_level: bool = True,
    window: int = WINDOW,
    z: np.ndarray | None = None,
) -> list[int]:
    """The steps at which the detector alarms (z over k, or the level), none during warm-up.
    `z` may be passed precomputed (the evaluation tries many k on one series)."""
    z = zscores(values, window, rule.transform) if z is None else z
    hit = (z >= k) if rule.rising else (z <= -k)
    if use_level and rule.level is not None:
        x = ratios(values, window) if rule.level_is_ratio else np.asarray(values, float)
        with np.errstate(invalid="ignore"):
            hit = hit | ((x >= rule.level) if rule.level_above else (x <= rule.level))
    return [int(s) for s, h in zip(steps, hit, strict=True) if h and s > warmup_steps]


class RobustZ:
    """The detector online: `update(step, x)` returns whether this value alarms."""

    def __init__(
        self, rule: Rule, k: float = K, window: int = WINDOW, warmup_steps: int = 0
    ) -> None:
        self.rule, self.k, self.window, self.warmup = rule, k, window, warmup_steps
        self.history: deque[float] = deque(maxlen=window)  # u values
        self.raw: deque[float] = deque(maxlen=window)  # x values (ratio levels)
        self.last_z = math.nan

    def update(self, step: int, x: float) -> bool:
        u = _u(x, self.rule.transform)
        if not math.isfinite(u):
            self.last_z = math.nan
            return False
        scored = len(self.history) >= max(1, self.window // 2)
        self.last_z = robust_z(u, self.history) if scored else math.nan
        level = self._level(x, scored)
        self.history.append(u)
        self.raw.append(x)
        if step <= self.warmup:
            return False
        z = self.last_z
        hit = math.isfinite(z) and (z >= self.k if self.rule.rising else z <= -self.k)
        return hit or level

    def _level(self, x: float, scored: bool) -> bool:
        rule = self.rule
        if rule.level is None:
            return False
        if rule.level_is_ratio:
            if not scored:
                return False
            med = statistics.median(self.raw)
            if med <= 0:
                return False
            x = x / med
        return x >= rule.level if rule.level_above else x <= rule.level

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "raw": list(self.raw)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = deque((float(v) for v in state["history"]), maxlen=self.window)
        self.raw = deque((float(v) for v in state["raw"]), maxlen=self.window)
