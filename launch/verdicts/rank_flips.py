"""Descriptive companions of the verdicts: rank flips during training (SCIENCE.md 22.7) and the
exploratory per-grid-point differences (22.4, Benjamini-Hochberg). Neither is a verdict.

Rank flips: at fractions f of the steps, Delta_f = mean_s l_A(eta_A(s), s, f) - mean_s
l_B(eta_B(s), s, f), with eta_R(s) the final cross-fitted best lr of seed s (the same selection
as claim (a), so only time changes and Delta_1 is claim (a)'s delta). A value missing or
non-finite at f counts as l_0 (a run that diverged later is counted as it was at f). Flag when
sign(Delta_f) != sign(Delta_1), |Delta_f| > m and |Delta_1| > m.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
from normlab.launch.stats import statistics as st
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts.results_table import FRACTIONS, Cell


@dataclass
class RankFlip:
    a: str
    b: str
    size: str
    deltas: dict[float, float]  # fraction -> Delta_f (1.0 included)
    flipped: list[float]  # fractions flagged
    note: str = ""


def _at(cell: Cell, pick: np.ndarray) -> dict[float, float]:
    rows = np.arange(cell.n)
    out = {f: float(v[rows, pick].mean()) for f, v in sorted(cell.at.items())}
    out[1.0] = float(cell.loss[rows, pick].mean())
    return out


def rank_flips(
    cells: dict[tuple[str, str], Cell], pairs: list[tuple[str, str, str]], margin: float
) -> list[RankFlip]:
    """One RankFlip per (a, b, size) pair; skipped with a note without the fraction columns."""
    out = []
    for a, b, size in pairs:
        ca, cb = cells[(a, size)], cells[(b, size)]
        if ca.n < 2 or cb.n < 2 or not (ca.usable and cb.usable):
            out.append(RankFlip(a, b, size, {}, [], "needs >= 2 seeds and a known l_0"))
            continue
        if len(ca.at) < len(FRACTIONS) or len(cb.at) < len(FRACTIONS):
            cols = ", ".join(FRACTIONS.values())
            out.append(RankFlip(a, b, size, {}, [], f"skipped: no eval loss at fractions ({cols})"))
            continue
        la = _at(ca, vc.cross_fitted(ca.loss)[1])
        lb = _at(cb, vc.cross_fitted(cb.loss)[1])
        deltas = {f: la[f] - lb[f] for f in la}
        final = deltas[1.0]
        flipped = [
            f
            for f, d in deltas.items()
            if f < 1.0 and np.sign(d) != np.sign(final) and abs(d) > margin and abs(final) > margin
        ]
        out.append(RankFlip(a, b, size, deltas, flipped))
    return out


@dataclass
class PointDifference:
    a: str
    b: str
    size: str
    lr: float
    delta: float
    p: float  # two-sided Welch
    bh_rejected: bool = False


def exploratory(
    cells: dict[tuple[str, str], Cell], pairs: list[tuple[str, str, str]], q: float = st.ALPHA
) -> list[PointDifference]:
    """Per shared grid point of each pair: the difference of capped means, Welch's two-sided p,
    and whether Benjamini-Hochberg at q over all points and pairs rejects it. Exploratory."""
    return benjamini_hochberg_points(
        [d for pair in pairs for d in point_differences(cells, pair)], q
    )


def point_differences(
    cells: dict[tuple[str, str], Cell], pair: tuple[str, str, str]
) -> list[PointDifference]:
    """One pair's per-grid-point differences and Welch p's (no multiplicity correction yet)."""
    a, b, size = pair
    ca, cb = cells[(a, size)], cells[(b, size)]
    if ca.n < 2 or cb.n < 2 or not (ca.usable and cb.usable):
        return []
    shared = sorted(set(ca.lrs) & set(cb.lrs))
    if not shared:
        return []
    # one Welch over the shared points: each point's seeds a contiguous row, as a single column
    xa = np.ascontiguousarray(ca.loss[:, [ca.lrs.index(lr) for lr in shared]].T)
    xb = np.ascontiguousarray(cb.loss[:, [cb.lrs.index(lr) for lr in shared]].T)
    w = st.welch(xa, xb)
    p = np.minimum(1.0, 2 * np.minimum(w.p_below(0.0), w.p_above(0.0)))
    return [
        PointDifference(a, b, size, lr, float(d), float(q))
        for lr, d, q in zip(shared, w.delta, p, strict=True)
    ]


def benjamini_hochberg_points(found: list[PointDifference], q: float = st.ALPHA) -> list:
    """Benjamini-Hochberg at q over every point of every pair (marks bh_rejected)."""
    for d, r in zip(found, st.benjamini_hochberg(np.array([d.p for d in found]), q), strict=True):
        d.bh_rejected = bool(r)
    return found


def pairs_of(cells: dict[tuple[str, str], Cell]) -> list[tuple[str, str, str]]:
    """Every (a, b, size) pair of recipes run at the same size, in order of appearance."""
    sizes = list(dict.fromkeys(s for _, s in cells))
    return [
        (a, b, size)
        for size in sizes
        for a, b in combinations([r for r, s in cells if s == size], 2)
    ]
