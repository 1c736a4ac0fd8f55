"""Does the best learning rate transfer across a ladder? The verdict of SCIENCE.md 21.6 by the rules
of 22 (issue 31 items 3 and 4).

Per recipe, per seed s present at the smallest and the largest rung:

    D_s = log2 η*_s(largest) - log2 η*_s(smallest)

with η*_s the quadratic-fit vertex of 21.6 on that seed's own capped loss curve (ladder.best_lrs).
The seed-runs are the replicates (22.2), so the test is the one-sample t on the D_s: the interval
D̄ ∓ t_{n-1, 1-α'} sd/√n, α' from Holm over the family (one claim per recipe of the study), and the
rows of 22.3 with the margin m = 0.5 octave of 21.6:

    hi < -m            the optimum moves down by more than half an octave: does not transfer
    lo > +m            the optimum moves up by more than half an octave: does not transfer
    -m < lo, hi < m    transfers (TOST, Schuirmann 1987)
    otherwise          inconclusive, with the seeds per recipe that give 80 % power at the
                       observed D̄ and spread (one-sample noncentral t, df n - 1)

This is not the ladder's bootstrap interval on the seed-mean shift (ladder.Fit.shift): that one
describes the mean curve; this one decides, and a decision from 2 seeds needs a large effect.
A diverged run's loss is the initial loss (capped, SCIENCE.md 19), so it enters η*_s as a bad point.

The grid's edge [choice]: when a seed's lowest loss sits at the grid's first or last learning
rate, its η*_s is clipped to the grid and D_s is only a bound (at the largest rung's top edge, or
the smallest rung's bottom edge, the true D_s is at least the measured one; mirrored, at most).
A verdict stands only if every bound points its way: "does not transfer, up" survives lower
bounds, "down" upper bounds, "transfers" none. Otherwise the recipe is inconclusive with no seed
count (more seeds do not move a clipped optimum) and the note names the seeds and edges: widen
the grid.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from normlab.launch.stats import group_sequential as gs
from normlab.launch.stats import statistics as st
from normlab.launch.transfer.ladder import Rung, best_lrs
from normlab.launch.verdicts import family as vc
from scipy import stats

MARGIN = 0.5  # octaves (SCIENCE.md 21.6)
TRANSFERS, MOVES_DOWN, MOVES_UP = "transfers", "does_not_transfer_down", "does_not_transfer_up"
INCONCLUSIVE = st.INCONCLUSIVE
# decide_family's outcome index: 0 "a lower" (D < -m), 1 "b lower" (D > m), 2 equivalent, 3 none
_BY_CODE = (MOVES_DOWN, MOVES_UP, TRANSFERS, INCONCLUSIVE)
WORDS = {
    TRANSFERS: "transfers (|D| < 0.5 octave)",
    MOVES_DOWN: "does not transfer: the optimum moves down by more than 0.5 octave",
    MOVES_UP: "does not transfer: the optimum moves up by more than 0.5 octave",
    INCONCLUSIVE: "inconclusive",
}


@dataclass
class TransferVerdict:
    recipe: str
    small: float
    large: float
    seeds: list[int]
    shifts: list[float]  # D_s per seed, octaves
    verdict: str = INCONCLUSIVE
    mean: float = math.nan
    sd: float = math.nan
    interval: tuple[float, float] = (math.nan, math.nan)
    level: float = math.nan
    p: float = math.nan
    seeds_needed: int | None = None
    note: str = ""
    # per seed: +1 when D_s is a lower bound (true >= measured), -1 an upper bound, 0 exact,
    # 2 unbounded (clipped both ways); with the words that say where
    bounds: list[int] = field(default_factory=list)
    edges: list[str] = field(default_factory=list)


def grid_edges(lrs: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """Per row of losses [seed, lr]: -1 when its lowest loss is at the grid's first (smallest)
    learning rate, +1 at its last, 0 inside."""
    order = np.argsort(lrs)
    argmin = np.argmin(losses[:, order], axis=1)
    return np.where(argmin == 0, -1, np.where(argmin == len(lrs) - 1, 1, 0))


def seed_shifts(small: Rung, large: Rung) -> tuple[list[int], np.ndarray]:
    """The seeds both rungs ran at every learning rate, and D_s for each (octaves)."""
    seeds, rows_s, rows_l = _common(small, large)
    if not seeds:
        return [], np.empty(0)
    eta_s = best_lrs(small.lrs, small.losses[rows_s])
    eta_l = best_lrs(large.lrs, large.losses[rows_l])
    return seeds, np.log2(eta_l / eta_s)


def _common(small: Rung, large: Rung) -> tuple[list[int], list[int], list[int]]:
    ids_s, ids_l = small.seed_ids(), large.seed_ids()
    seeds = sorted(set(ids_s) & set(ids_l))
    return seeds, [ids_s.index(s) for s in seeds], [ids_l.index(s) for s in seeds]


def shift_bounds(small: Rung, large: Rung) -> tuple[list[int], list[str]]:
    """Per common seed: the kind of bound its D_s is (TransferVerdict.bounds) and, for a clipped
    one, where ("seed 1: 16 at the top edge")."""
    seeds, rows_s, rows_l = _common(small, large)
    if not seeds:
        return [], []
    e_s = grid_edges(small.lrs, small.losses[rows_s])
    e_l = grid_edges(large.lrs, large.losses[rows_l])
    side = {-1: "bottom", 1: "top"}
    bounds, edges = [], []
    for seed, es, el in zip(seeds, e_s, e_l, strict=True):
        # the largest rung clipped at the top, or the smallest at the bottom: D_s is a lower bound
        kinds = {int(el), -int(es)} - {0}
        bounds.append(0 if not kinds else kinds.pop() if len(kinds) == 1 else 2)
        ends = ((small, es), (large, el))
        where = [f"{r.size:g} at the {side[int(e)]} edge" for r, e in ends if e]
        if where:
            edges.append(f"seed {seed}: {' and '.join(where)}")
    return bounds, edges


def _bounds_allow(verdict: str, bounds: list[int]) -> bool:
    """Whether the verdict holds whatever the clipped D_s are beyond their bounds."""
    clipped = {b for b in bounds if b}
    if verdict == MOVES_UP:
        return clipped <= {1}
    if verdict == MOVES_DOWN:
        return clipped <= {-1}
    return not clipped


def one_sample_seeds(mean: float, sd: float, margin: float, alpha: float) -> int | None:
    """Seeds for 80 % power of the one-sample test at true D = mean and seed SD sd: beyond the
    margin the minimum-effect test (noncentral t, df n - 1, one-sided at alpha); inside it TOST
    (P(reject lower) + P(reject upper) - 1). None when |mean| == m or past st.MAX_SEEDS."""
    if not (math.isfinite(mean) and math.isfinite(sd)):
        return None
    if sd <= 0:
        return 2
    gap = abs(mean) - margin

    def power(n: int) -> float:
        df, k = n - 1, math.sqrt(n) / sd
        crit = float(stats.t.ppf(1 - alpha, df))
        if gap > 0:
            return float(stats.nct.sf(crit, df, gap * k))
        return float(
            stats.nct.sf(crit, df, -gap * k)
            + stats.nct.sf(crit, df, (margin + abs(mean)) * k)
            - 1.0
        )

    return None if gap == 0 else st.search_seeds(power, st.POWER, 2)


def decide_transfer(
    ladders: dict[str, list[Rung]],
    margin: float = MARGIN,
    alpha: float = st.ALPHA,
    plan: gs.Plan | None = None,
) -> list[TransferVerdict]:
    """One verdict per recipe with 2+ rungs, Holm over those with >= 2 seeds at both ends;
    `plan`: the study's plan of looks (SCIENCE.md 22.8), each recipe at the look of its seeds."""
    out: list[TransferVerdict] = []
    for recipe, rungs in ladders.items():
        rungs = sorted(rungs, key=lambda r: r.size)
        seeds, d = seed_shifts(rungs[0], rungs[-1])
        bounds, edges = shift_bounds(rungs[0], rungs[-1])
        out.append(
            TransferVerdict(
                recipe,
                rungs[0].size,
                rungs[-1].size,
                seeds,
                [*map(float, d)],
                bounds=bounds,
                edges=edges,
            )
        )
    tested = [v for v in out if len(v.shifts) >= 2]
    for v in out:
        if len(v.shifts) < 2:
            has = len(v.shifts)
            v.note = f"needs >= 2 seeds at both ends (has {has}): never a verdict from one"
    if not tested:
        return out
    tests = []
    for v in tested:
        d = np.array(v.shifts)
        v.mean, v.sd = float(d.mean()), float(d.std(ddof=1))
        se = v.sd / math.sqrt(len(d))
        tests.append(st.Welch(np.asarray(v.mean), np.asarray(se), np.asarray(len(d) - 1.0)))
    p3 = np.stack([st.margin_pvalues(w.p_below, w.p_above, margin) for w in tests])
    looks = None if plan is None else [gs.look_at(plan, len(v.shifts)) for v in tested]
    codes, levels = vc.decide_family(p3, alpha, looks)
    for v, w, code, level, p in zip(tested, tests, codes, levels, p3, strict=True):
        v.verdict = _BY_CODE[int(code)]
        v.level, v.p = float(level), float(p.min())
        lo, hi = w.interval(float(level))
        v.interval = (float(lo), float(hi))
        if not _bounds_allow(v.verdict, v.bounds):
            v.verdict = INCONCLUSIVE
            v.note = (
                "best lr at the grid's edge (" + "; ".join(v.edges) + "), so D is only a bound "
                "there: widen the learning-rate grid (more seeds do not decide it)"
            )
        elif any(v.bounds):
            v.note = f"best lr at the grid's edge ({'; '.join(v.edges)}): the verdict holds"
        elif v.verdict == INCONCLUSIVE:
            need = one_sample_seeds(v.mean, v.sd, margin, v.level) if v.level > 0 else None
            v.seeds_needed = None if need is None else max(need, len(v.shifts) + 1)
            v.note = (
                f"needs {v.seeds_needed} seeds for 80% power at the observed shift and spread"
                if v.seeds_needed is not None
                else "no seed count decides it at the observed shift (|D| at the margin)"
            )
    for v, look in zip(tested, looks or [], strict=False):
        more = look.undecided() if v.verdict == INCONCLUSIVE else ""
        if not look.fractions:  # past the plan: no level, so no seed count either
            v.note, v.seeds_needed = "", None
        v.note = "; ".join(x for x in (v.note, look.note, more) if x)
    return out


COLUMNS = (
    "recipe", "small", "large", "seeds", "shifts_log2", "mean_log2", "sd_log2", "lo", "hi",
    "level", "p", "verdict", "seeds_needed", "note",
)  # fmt: skip


def write_transfer_csv(verdicts: list[TransferVerdict], path: Path) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for v in verdicts:
            writer.writerow(
                [
                    v.recipe, f"{v.small:g}", f"{v.large:g}", " ".join(map(str, v.seeds)),
                    " ".join(f"{x:.6g}" for x in v.shifts), f"{v.mean:.6g}", f"{v.sd:.6g}",
                    f"{v.interval[0]:.6g}", f"{v.interval[1]:.6g}", f"{v.level:.6g}",
                    f"{v.p:.6g}", v.verdict, "" if v.seeds_needed is None else v.seeds_needed,
                    v.note,
                ]
            )  # fmt: skip
    return path


def transfer_lines(verdicts: list[TransferVerdict], plan: gs.Plan | None = None) -> list[str]:
    """study.md's section: one row per recipe (and the plan of looks the levels come from)."""
    lines = [
        "",
        "## Does the best learning rate transfer? (SCIENCE.md 21.6 decided by 22)",
        "",
        "Per seed, D_s = log2 η*_s(largest) − log2 η*_s(smallest), η*_s the quadratic-fit vertex "
        "on that seed's own curve; the one-sample t interval at the Holm level over the recipes; "
        f"margin {MARGIN:g} octave (transfer.csv). A seed whose best lr sits at the grid's first "
        "or last rate gives only a bound on D_s: a verdict stands only if every bound points its "
        "way."
        + (
            f" Looks: {plan.describe()}; each level is the nominal level of its recipe's look "
            "(SCIENCE.md 22.8)."
            if plan is not None
            else ""
        ),
        "",
        "| recipe | sizes | D per seed | mean D [interval] | level | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        per_seed = ", ".join(f"{x:+.2f}" for x in v.shifts) or "-"
        shown = (
            f"{v.mean:+.2f} [{v.interval[0]:+.2f}, {v.interval[1]:+.2f}]"
            if math.isfinite(v.mean)
            else "-"
        )
        level = f"{v.level:.3g}" if math.isfinite(v.level) else "-"
        said = WORDS[v.verdict] + (f"; {v.note}" if v.note else "")
        lines.append(
            f"| {v.recipe} | {v.small:g} → {v.large:g} | {per_seed} | {shown} | {level} | {said} |"
        )
    return [*lines, ""]
