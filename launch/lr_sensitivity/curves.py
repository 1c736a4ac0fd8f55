"""The LR-sensitivity protocol (SCIENCE.md 19, after Wortsman et al. 2023, arXiv 2309.14322).

For one curve (a recipe at one size) over a log-spaced learning-rate grid {eta_i}:

    capped(eta)     = min(l(eta), l_0)       l: final held-out eval loss; l_0: the eval loss of
                                             the initialised model, measured before step 0.
                                             A run that diverged, stopped or left a non-finite
                                             loss counts as l_0 (the penalty stays bounded).
    l*              = min_i  mean_seeds capped(eta_i)
    LR sensitivity  = mean_i mean_seeds capped(eta_i) - l*      (each grid point weighted equally)
    stable LR range = the widest contiguous run of grid points whose seed-mean is within
                      `margin` (STABLE_MARGIN, 0.1 nats) of l*; a tie goes to the run holding
                      argmin eta. EMPTY when the curve trained nowhere (below), with the reason
                      in `Curve.range_note`: a curve flat at the plateau is not "stable".
    trained LR range = the widest contiguous run of grid points where every seed trained (its
                      capped loss TRAINED_MARGIN, 0.2 nats, below the data's unigram plateau);
                      none when no point trained. LR sensitivity is relative to each curve's
                      own l*, so a curve that trains nowhere is "insensitive": this range tells
                      the two apart (Post-LN without warm-up trains over fewer rates).
    trained (curve) = l* <= plateau - TRAINED_MARGIN (the 'trained' rule of SCIENCE.md 19 on the
                      best seed-mean); unknown (None) without a plateau. Without a plateau a
                      curve whose l* is l_0 (every run failed or ended at or above l_0) has
                      trained nowhere too. A curve that did not train is marked in every table
                      and figure and left out of the ranking by LR sensitivity (`ranking`).

Which runs count as l_0 (the same rule in launch.verdicts.growth_claims): a run counts at its final
eval loss only when its status is 'completed' and that loss is finite; a diverged, failed or stopped
(interrupted, preempted) run, or one that never evaluated, counts as l_0. A run's own l_0 that
is missing or non-finite (NaN: the init_loss instrument measured a broken model) is replaced by
the mean of the curve's finite ones, and the curve says so in `Curve.notes`; a curve with no
finite l_0 at all is left out of the protocol with a note (never an exception mid-report).

The curve is the mean over seeds at each grid point (every seed capped first); the sensitivity
of each seed's own curve is reported beside it as its spread.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from normlab.launch.stats.separation import TOL, TRAINED_MARGIN, trained

STABLE_MARGIN = 0.1  # nats above l* that still count as stable (SCIENCE.md 19)
PROTOCOL_LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)  # normlab's grid (SCIENCE.md 19)
COMPLETED = "completed"  # the one run status whose final loss counts as it is
DID_NOT_TRAIN = "did not train"  # the mark of a curve or run that did not train


def counts_as_l0(status: str | None, loss: float | None) -> bool:
    """A run that counts as l_0: any status but 'completed' (diverged, failed, interrupted,
    preempted, no summary) or no finite final loss."""
    return status != COMPLETED or loss is None or not math.isfinite(loss)


@dataclass
class Point:
    """One run: its learning rate, seed, final eval loss (None / nan: none) and measured l_0."""

    recipe: str
    size: str
    lr: float
    seed: int
    loss: float | None
    init_loss: float | None
    failed: bool = False  # diverged, stopped, or non-finite: counts as l_0
    extra: dict[str, float] = field(default_factory=dict)  # max_logit, logz_mean, ... (per run)


@dataclass
class GridPoint:
    lr: float
    seeds: list[int]
    capped: list[float]  # per seed, min(l, l_0)
    failed: int
    extra: dict[str, list[float]]

    @property
    def mean(self) -> float:
        return float(np.mean(self.capped))

    @property
    def sd(self) -> float:
        return float(np.std(self.capped, ddof=1)) if len(self.capped) > 1 else 0.0


@dataclass
class Curve:
    recipe: str
    size: str
    init_loss: float  # mean measured l_0 over the curve's runs
    points: list[GridPoint]  # by increasing lr
    margin: float = STABLE_MARGIN
    plateau: float | None = None  # the data's unigram loss (None: unknown, no trained range)
    notes: list[str] = field(default_factory=list)  # what the numbers rest on (non-finite l_0)

    @property
    def best(self) -> GridPoint:
        return min(self.points, key=lambda p: p.mean)

    @property
    def sensitivity(self) -> float:
        return lr_sensitivity([p.mean for p in self.points])

    def seed_sensitivities(self) -> list[float]:
        """The sensitivity of each seed's own curve (seeds present at every grid point)."""
        common = set.intersection(*(set(p.seeds) for p in self.points))
        return [
            lr_sensitivity([p.capped[p.seeds.index(s)] for p in self.points])
            for s in sorted(common)
        ]

    @property
    def trained(self) -> bool | None:
        """l* trained (module docstring); None: no plateau, and some run ended below l_0."""
        if self.plateau is not None:
            return trained(self.best.mean, self.plateau)
        return None if self.best.mean < self.init_loss - TOL else False

    @property
    def range_note(self) -> str:
        """Why the stable and trained ranges are empty ('' when the curve trained)."""
        if self.trained is not False:
            return ""
        if self.plateau is None:
            return f"trained nowhere: every run failed or ended at l_0 {self.init_loss:.3f}"
        return (
            f"trained nowhere: best loss {self.best.mean:.3f} > plateau {self.plateau:.3f} - "
            f"{TRAINED_MARGIN:g}"
        )

    @property
    def stable_range(self) -> tuple[float, float] | None:
        """(lowest, highest) lr of the stable range; None when the curve trained nowhere."""
        if self.trained is False:
            return None
        i, j = stable_range([p.mean for p in self.points], self.margin)
        return self.points[i].lr, self.points[j].lr

    @property
    def trained_range(self) -> tuple[float, float] | None:
        """(lowest, highest) lr of the widest contiguous run of points where every seed trained;
        None when none did or the plateau is unknown."""
        plateau = self.plateau
        if plateau is None:
            return None
        ok = [all(trained(v, plateau) for v in p.capped) for p in self.points]
        found = widest_run(ok)
        return None if found is None else (self.points[found[0]].lr, self.points[found[1]].lr)


def capped_loss(loss: float | None, init_loss: float, failed: bool) -> float:
    """min(l, l_0); a failed run, a missing or non-finite loss is l_0."""
    if failed or loss is None or not math.isfinite(loss):
        return init_loss
    return min(float(loss), init_loss)


def lr_sensitivity(capped: list[float]) -> float:
    """E_eta[capped(eta)] - min_eta capped(eta) over an equally weighted grid."""
    values = np.asarray(capped, dtype=float)
    return float((values - values.min()).mean())  # exactly 0 for a flat curve


def _runs(ok: list[bool]) -> list[tuple[int, int]]:
    """(first, last) index of each contiguous run of True."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, inside in enumerate([*ok, False]):
        if inside and start is None:
            start = i
        elif not inside and start is not None:
            runs.append((start, i - 1))
            start = None
    return runs


def stable_range(means: list[float], margin: float = STABLE_MARGIN) -> tuple[int, int]:
    """(first, last) index of the widest contiguous run within `margin` of the minimum."""
    best = int(np.argmin(means))
    runs = _runs([m <= means[best] + margin for m in means])
    return max(runs, key=lambda r: (r[1] - r[0], r[0] <= best <= r[1]))


def widest_run(ok: list[bool]) -> tuple[int, int] | None:
    """(first, last) index of the widest contiguous run of True (the lower one on a tie)."""
    runs = _runs(ok)
    return max(runs, key=lambda r: (r[1] - r[0], -r[0])) if runs else None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def curves(
    points: list[Point],
    margin: float = STABLE_MARGIN,
    plateau: float | None = None,
    left_out: list[str] | None = None,
) -> list[Curve]:
    """One curve per (recipe, size), in first-seen order; l_0 of a run that never measured it,
    or measured it non-finite, is the mean of the curve's finite ones (the same shape and seeds
    give the same init; noted in Curve.notes). `plateau`: the data's unigram loss, for the
    trained range. A curve whose runs measured l_0 but none finitely is left out, its note
    appended to `left_out`; a curve none of whose runs measured l_0 is a ValueError (the
    init_loss instrument was off: the protocol cannot be computed at all)."""
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        groups.setdefault((p.recipe, p.size), []).append(p)
    out = []
    for (recipe, size), runs in groups.items():
        if all(p.init_loss is None for p in runs):
            raise ValueError(
                f"{recipe} at size {size}: no run measured its loss at init (instruments.init_loss)"
            )
        measured = [float(p.init_loss) for p in runs if _finite(p.init_loss)]
        bad = [p for p in runs if p.init_loss is not None and not math.isfinite(p.init_loss)]
        where = ", ".join(f"lr {p.lr:g} seed {p.seed} ({p.init_loss})" for p in bad)
        if not measured:
            if left_out is not None:
                left_out.append(
                    f"{recipe} at size {size}: left out of the LR-sensitivity protocol: no run "
                    f"measured a finite l_0 ({where})"
                )
            continue
        l0 = float(np.mean(measured))
        notes = (
            [f"non-finite l_0 measured at {where}: counted at the curve's mean l_0 {l0:.3f}"]
            if bad
            else []
        )
        by_lr: dict[float, list[Point]] = {}
        for p in runs:
            by_lr.setdefault(float(p.lr), []).append(p)
        grid = []
        for lr in sorted(by_lr):
            seeds = sorted(by_lr[lr], key=lambda p: p.seed)
            own = [float(p.init_loss) if _finite(p.init_loss) else l0 for p in seeds]
            keys = sorted({k for p in seeds for k in p.extra})
            grid.append(
                GridPoint(
                    lr=lr,
                    seeds=[p.seed for p in seeds],
                    capped=[
                        capped_loss(p.loss, o, p.failed) for p, o in zip(seeds, own, strict=True)
                    ],
                    failed=sum(
                        p.failed or p.loss is None or not math.isfinite(p.loss) for p in seeds
                    ),
                    extra={k: [p.extra.get(k, math.nan) for p in seeds] for k in keys},
                )
            )
        out.append(Curve(recipe, size, l0, grid, margin, plateau, notes))
    return out


def ranking(found: list[Curve]) -> list[Curve]:
    """The curves that trained (or may have: no plateau), by LR sensitivity, lowest first;
    a curve that did not train is left out (it is flat at the plateau, not insensitive)."""
    return sorted((c for c in found if c.trained is not False), key=lambda c: c.sensitivity)


SUMMARY_COLUMNS = [
    "recipe",
    "size",
    "lr_sensitivity",
    "lr_sensitivity_seed_mean",
    "lr_sensitivity_seed_sd",
    "best_loss",
    "best_loss_sd",
    "best_lr",
    "stable_lr_low",
    "stable_lr_high",
    "trained_lr_low",
    "trained_lr_high",
    "trained",
    "range_note",
    "plateau",
    "init_loss",
    "failed_runs",
    "runs",
    "seeds",
    "lrs",
]
GRID_COLUMNS = ["recipe", "size", "lr", "seeds", "mean", "sd", "min", "max", "failed"]


def summary_row(c: Curve) -> dict[str, Any]:
    per_seed = c.seed_sensitivities()
    stable = c.stable_range
    trained_lrs = c.trained_range
    return {
        "recipe": c.recipe,
        "size": c.size,
        "lr_sensitivity": round(c.sensitivity, 4),
        "lr_sensitivity_seed_mean": round(float(np.mean(per_seed)), 4) if per_seed else "",
        "lr_sensitivity_seed_sd": (
            round(float(np.std(per_seed, ddof=1)), 4) if len(per_seed) > 1 else ""
        ),
        "best_loss": round(c.best.mean, 4),
        "best_loss_sd": round(c.best.sd, 4),
        "best_lr": f"{c.best.lr:g}",
        "stable_lr_low": f"{stable[0]:g}" if stable else "",
        "stable_lr_high": f"{stable[1]:g}" if stable else "",
        "trained_lr_low": f"{trained_lrs[0]:g}" if trained_lrs else "",
        "trained_lr_high": f"{trained_lrs[1]:g}" if trained_lrs else "",
        "trained": {True: "yes", False: "no", None: ""}[c.trained],
        "range_note": c.range_note,
        "plateau": round(c.plateau, 4) if c.plateau is not None else "",
        "init_loss": round(c.init_loss, 4),
        "failed_runs": sum(p.failed for p in c.points),
        "runs": sum(len(p.seeds) for p in c.points),
        "seeds": " ".join(str(s) for s in sorted({s for p in c.points for s in p.seeds})),
        "lrs": " ".join(f"{p.lr:g}" for p in c.points),
    }


def grid_rows(c: Curve) -> list[dict[str, Any]]:
    rows = []
    for p in c.points:
        row: dict[str, Any] = {
            "recipe": c.recipe,
            "size": c.size,
            "lr": f"{p.lr:g}",
            "seeds": " ".join(str(s) for s in p.seeds),
            "mean": round(p.mean, 4),
            "sd": round(p.sd, 4),
            "min": round(min(p.capped), 4),
            "max": round(max(p.capped), 4),
            "failed": p.failed,
        }
        for key, values in p.extra.items():
            ok = [v for v in values if math.isfinite(v)]
            row[f"{key}_mean"] = round(float(np.mean(ok)), 4) if ok else ""
        rows.append(row)
    return rows


def write_csvs(found: list[Curve], out: Path) -> tuple[Path, Path]:
    """sensitivity.csv (one row per curve) and sensitivity_grid.csv (one per grid point)."""
    summary, grid = out / "sensitivity.csv", out / "sensitivity_grid.csv"
    with summary.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(summary_row(c) for c in found)
    rows = [r for c in found for r in grid_rows(c)]
    extra = sorted({k for r in rows for k in r} - set(GRID_COLUMNS))
    with grid.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, [*GRID_COLUMNS, *extra], restval="")
        writer.writeheader()
        writer.writerows(rows)
    return summary, grid
