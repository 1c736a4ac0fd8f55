"""Size ladders that forecast (issue 31 item 5; SCIENCE.md 21.6, 22).

For one recipe over a size axis (width, depth, or any numeric `size` of a study), per rung:

    best loss    l*(x)   = min over the lr grid of the seed-mean capped loss (SCIENCE.md 19)
    best lr      η*(x)   = vertex of a quadratic fit of the seed-mean loss on log2 η through the
                           5 grid points nearest the grid minimum (21.6); the grid argmin when
                           the parabola opens downwards or its vertex leaves those points
    sensitivity  S(x)    = mean over the grid of (seed-mean capped loss - l*) (SCIENCE.md 19)
    max logit    M(x)    = seed-mean max attention logit at the grid argmin (when recorded)

each fitted as a power law y = a · x^b by least squares on log y vs log x; and the best-lr shift
D = log2 η*(largest) - log2 η*(smallest) of SCIENCE.md 21.6 (µP/CompleteP pass: |D| <= 0.5).
Intervals: a bootstrap over seed-runs — each replicate resamples, per rung, the seeds with
replacement (a seed keeps all its learning rates) and refits; 95 % percentile intervals. They
cover seed noise only, not a wrong functional form; the hold-out check is what tests the form:
the ladder without its largest rung forecasts that rung, and the CSV says whether the measured
value fell inside the forecast interval.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from normlab.launch.metric_keys import MAX_LOGIT

QUANTITIES = ("best_loss", "best_lr", "lr_sensitivity", MAX_LOGIT)
BOOTSTRAP = 2000
LEVEL = 0.95


@dataclass
class Rung:
    """One size of one recipe: losses[seed, lr] (capped), logits[seed, lr] (nan: not recorded);
    seeds: the seed of each row (default 0, 1, ...)."""

    size: float
    lrs: np.ndarray
    losses: np.ndarray
    logits: np.ndarray | None = None
    seeds: tuple[int, ...] = ()

    def seed_ids(self) -> list[int]:
        return list(self.seeds) if self.seeds else list(range(self.losses.shape[0]))


def best_lrs(lrs: np.ndarray, means: np.ndarray) -> np.ndarray:
    """`best_lr` of each row of `means` [replicate, lr]: the replicates whose grid argmin is the
    same share the 5 points, so one least-squares solve fits them all."""
    out = np.empty(len(means))
    x = np.log2(lrs)
    argmins = np.argmin(means, axis=1)
    for i in np.unique(argmins):
        rows = argmins == i
        if len(x) < 3:
            out[rows] = lrs[i]
            continue
        near = np.sort(np.argsort(np.abs(np.arange(len(x)) - i), kind="stable")[:5])
        c2, c1, _ = np.polyfit(x[near], means[rows][:, near].T, 2)
        vertex = -c1 / (2 * np.where(c2 > 0, c2, 1.0))
        inside = (c2 > 0) & (x[near].min() <= vertex) & (vertex <= x[near].max())
        out[rows] = np.where(inside, 2.0**vertex, lrs[i])
    return out


def fit_powers(sizes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`fit_power` of each row of `values` [replicate, rung] as [replicate, (a, b)]: rows with
    the same usable rungs share one least-squares solve."""
    out = np.full((len(values), 2), math.nan)
    ok = np.isfinite(values) & (values > 0)
    for pattern in np.unique(ok, axis=0):
        rows = (ok == pattern).all(axis=1)
        if pattern.sum() < 2 or len(set(sizes[pattern])) < 2:
            continue
        logs = np.log(values[rows][:, pattern])
        b, log_a = np.polyfit(np.log(sizes[pattern]), logs.T, 1)
        out[rows] = np.stack([np.exp(log_a), b], axis=1)
    return out


def rung_stats_of(rung: Rung, draws: np.ndarray) -> np.ndarray:
    """[replicate, quantity]: the four statistics of the module docstring for each row of seed
    indices in `draws` [replicate, seeds], all replicates at once."""
    n = len(draws)
    means = rung.losses[draws].mean(axis=1)  # [replicate, lr]
    argmin = np.argmin(means, axis=1)
    best = means[np.arange(n), argmin]
    out = np.full((n, len(QUANTITIES)), math.nan)
    out[:, 0] = best
    out[:, 1] = best_lrs(rung.lrs, means)
    out[:, 2] = (means - best[:, None]).mean(axis=1)
    if rung.logits is not None:
        column = rung.logits[draws, argmin[:, None]]  # [replicate, seed] at the grid argmin
        seen = np.isfinite(column).any(axis=1)
        out[seen, 3] = np.nanmean(column[seen], axis=1)
    return out


def best_lr(lrs: np.ndarray, mean: np.ndarray) -> float:
    """η* by the quadratic fit of 21.6 on log2 η (see the module docstring)."""
    return float(best_lrs(lrs, mean[None])[0])


def rung_stats(rung: Rung, rows: np.ndarray | np.integer | None = None) -> dict[str, float]:
    """The four statistics of one rung on the seed rows `rows` (all seeds when None)."""
    picked = np.arange(rung.losses.shape[0]) if rows is None else np.atleast_1d(rows)
    return dict(zip(QUANTITIES, map(float, rung_stats_of(rung, picked[None])[0]), strict=True))


def fit_power(sizes: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """(a, b) of y = a · x^b by least squares on log y; nan when fewer than 2 positive values."""
    a, b = fit_powers(sizes, values[None])[0]
    return float(a), float(b)


@dataclass
class Fit:
    """One quantity of one recipe: the power law, its bootstrap interval, a forecast."""

    quantity: str
    coef: float
    exponent: float
    exponent_ci: tuple[float, float]
    target: float | None = None
    forecast: float = math.nan
    forecast_ci: tuple[float, float] = (math.nan, math.nan)
    # best_lr only: D = log2 η*(largest) - log2 η*(smallest), the shift of SCIENCE.md 21.6
    shift: float = math.nan
    shift_ci: tuple[float, float] = (math.nan, math.nan)


def _ci(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def _replicates(rungs: list[Rung], n: int, seed: int) -> np.ndarray:
    """[replicate, rung, quantity] statistics on seed rows resampled with replacement (drawn in
    the order replicate, rung)."""
    rng = np.random.default_rng(seed)
    draws = [np.empty((n, r.losses.shape[0]), dtype=np.int64) for r in rungs]
    for b in range(n):
        for j, rung in enumerate(rungs):
            draws[j][b] = rng.integers(0, rung.losses.shape[0], size=rung.losses.shape[0])
    return np.stack([rung_stats_of(rung, d) for rung, d in zip(rungs, draws, strict=True)], axis=1)


def fit_ladder(
    rungs: list[Rung], target: float | None = None, n_boot: int = BOOTSTRAP, seed: int = 0
) -> dict[str, Fit]:
    """The four power laws of one recipe's ladder, with intervals and a forecast at `target`."""
    rungs = sorted(rungs, key=lambda r: r.size)
    sizes = np.array([r.size for r in rungs], dtype=float)
    point = np.array([[rung_stats(r)[q] for q in QUANTITIES] for r in rungs])
    boot = _replicates(rungs, n_boot, seed)
    fits = {}
    for k, q in enumerate(QUANTITIES):
        coef, exponent = fit_power(sizes, point[:, k])
        params = fit_powers(sizes, boot[:, :, k])
        fit = Fit(q, coef, exponent, _ci(params[:, 1]))
        if target is not None:
            fit.target = float(target)
            fit.forecast = coef * target**exponent
            fit.forecast_ci = _ci(params[:, 0] * float(target) ** params[:, 1])
        if q == "best_lr":
            fit.shift = float(np.log2(point[-1, k] / point[0, k]))
            fit.shift_ci = _ci(np.log2(boot[:, -1, k] / boot[:, 0, k]))
        fits[q] = fit
    return fits


@dataclass
class HoldOut:
    """The ladder without its largest rung forecasting that rung."""

    quantity: str
    size: float
    forecast: float
    forecast_ci: tuple[float, float]
    measured: float

    @property
    def covered(self) -> bool | None:
        lo, hi = self.forecast_ci
        if not all(map(math.isfinite, (lo, hi, self.measured))):
            return None
        return lo <= self.measured <= hi


def hold_out_largest(rungs: list[Rung], n_boot: int = BOOTSTRAP, seed: int = 0) -> list[HoldOut]:
    """Fit on all rungs but the largest, forecast it, compare with its measurement (needs 3)."""
    rungs = sorted(rungs, key=lambda r: r.size)
    if len(rungs) < 3:
        return []
    last = rungs[-1]
    fits = fit_ladder(rungs[:-1], target=last.size, n_boot=n_boot, seed=seed)
    measured = rung_stats(last)
    return [
        HoldOut(q, last.size, fits[q].forecast, fits[q].forecast_ci, measured[q])
        for q in QUANTITIES
    ]


CSV_COLUMNS = (
    "recipe", "quantity", "coef", "exponent", "exponent_lo", "exponent_hi", "target",
    "forecast", "forecast_lo", "forecast_hi", "holdout_size", "holdout_forecast",
    "holdout_lo", "holdout_hi", "holdout_measured", "holdout_covered", "shift_log2",
    "shift_lo", "shift_hi",
)  # fmt: skip


def ladder_rows(recipe: str, fits: dict[str, Fit], held: list[HoldOut]) -> list[dict]:
    by_q = {h.quantity: h for h in held}
    rows = []
    for q, f in fits.items():
        h = by_q.get(q)
        rows.append(
            {
                "recipe": recipe,
                "quantity": q,
                "coef": f.coef,
                "exponent": f.exponent,
                "exponent_lo": f.exponent_ci[0],
                "exponent_hi": f.exponent_ci[1],
                "target": "" if f.target is None else f.target,
                "forecast": f.forecast,
                "forecast_lo": f.forecast_ci[0],
                "forecast_hi": f.forecast_ci[1],
                "holdout_size": "" if h is None else h.size,
                "holdout_forecast": "" if h is None else h.forecast,
                "holdout_lo": "" if h is None else h.forecast_ci[0],
                "holdout_hi": "" if h is None else h.forecast_ci[1],
                "holdout_measured": "" if h is None else h.measured,
                "holdout_covered": "" if h is None or h.covered is None else h.covered,
                "shift_log2": f.shift if q == "best_lr" else "",
                "shift_lo": f.shift_ci[0] if q == "best_lr" else "",
                "shift_hi": f.shift_ci[1] if q == "best_lr" else "",
            }
        )
    return rows


def write_ladder_csv(rows: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(v) for k, v in row.items()})
    return path


def _fmt(value: object) -> object:
    return f"{value:.6g}" if isinstance(value, float) else value


def coverage(rows: list[dict]) -> tuple[int, int]:
    """(hold-out forecasts that covered their measurement, hold-out forecasts decided)."""
    decided = [r["holdout_covered"] for r in rows if r["holdout_covered"] in (True, False)]
    return sum(decided), len(decided)
