"""The permutation p reported beside Welch for claims (a) and (b) when the exact count of
relabellings is out of reach: a sequential Monte-Carlo p (launch.stats.sequential_mc, Besag and
Clifford 1991) with its Monte-Carlo standard error, or no p where Welch already decides.

The p is the same combination of tails as the exact test (decide._permutation_min_p): A shifted by
-margin and +margin under the two nulls, p = min(lower at -m, upper at +m, max(upper at -m,
lower at +m)); for (a) the cross-fitted selection is redone inside every relabelling of whole
seed-runs. It is a report next to Welch's p, never the decision, so a claim that Welch decides at
its Holm level is not resampled ("skipped" below): its verdict would not change with any p.
"""

from __future__ import annotations

import math

import numpy as np
from normlab.launch.stats import statistics as st
from normlab.launch.stats.sequential_mc import McP, sequential_p
from normlab.launch.verdicts import family as vc


def exact_in_reach(n_a: int, n_b: int) -> bool:
    """Whether every relabelling is enumerated (statistics.relabellings is exact)."""
    return math.comb(n_a + n_b, n_a) <= st.EXACT_LIMIT


def skipped_note(n_a: int, n_b: int) -> str:
    """What the verdict says when its side permutation p is not computed."""
    count = math.comb(n_a + n_b, n_a)
    return (
        f"permutation p skipped: Welch decides, and its C({n_a + n_b}, {n_a}) = {count:,} "
        f"relabellings exceed the exact enumeration's {st.EXACT_LIMIT:,}"
    )


def _arm_stat(statistic: str, x: np.ndarray) -> np.ndarray:
    """The arm's statistic: (a) the mean cross-fitted loss of curves (..., n, G); (b) the mean of
    per-seed sensitivities (..., n)."""
    if statistic == vc.LOSS:
        return vc.cross_fitted(x)[0].mean(axis=-1)
    return x.mean(axis=-1)


def mc_min_p(statistic: str, xa: np.ndarray, xb: np.ndarray, margin: float) -> McP:
    """The sequential Monte-Carlo permutation p of claim (a) or (b) on curves xa (n_a, G) and
    xb (n_b, G): relabellings of whole seed-runs, the statistic recomputed in each (for (a)
    the cross-fitted selection; for (b) S(s) of a seed-run is its own, so its values are
    relabelled and shifted, as in the exact test)."""
    na, nb = len(xa), len(xb)
    n = na + nb
    if statistic != vc.LOSS:  # (b): the per-seed values are the units, shifted as exact (c)
        xa, xb = vc.seed_sensitivity(xa), vc.seed_sensitivity(xb)
    shifted = [np.concatenate([xa - shift, xb]) for shift in (-margin, margin)]
    observed = [float(_arm_stat(statistic, p[:na]) - _arm_stat(statistic, p[na:])) for p in shifted]

    def hits(mask: np.ndarray) -> np.ndarray:
        in_a = np.nonzero(mask)[1].reshape(len(mask), na)
        in_b = np.nonzero(~mask)[1].reshape(len(mask), nb)
        cols = []
        for pooled, obs in zip(shifted, observed, strict=True):
            d = _arm_stat(statistic, pooled[in_a]) - _arm_stat(statistic, pooled[in_b])
            slack = st.TOL * max(1.0, abs(obs))
            cols += [d <= obs + slack, d >= obs - slack]
        return np.stack(cols, axis=1)  # low_le, low_ge, high_le, high_ge

    low_le, low_ge, high_le, high_ge = sequential_p(hits, n, na)
    equivalent = max(low_ge, high_le, key=lambda m: m.p)
    return min(low_le, high_ge, equivalent, key=lambda m: m.p)
