"""Verdict statistics of SCIENCE.md 22: Welch intervals, the exact Fisher-Pitman permutation test,
the four outcomes of a margin test, Holm and Benjamini-Hochberg, and the seed-count calculator.

Conventions (SCIENCE.md 22.3): `delta = mean(A) - mean(B)`, lower loss is better, so `delta < -m`
means "A lower than B by more than the margin m". A two-sided `(1 - 2 alpha)` interval
`[lo, hi]` and the one-sided level-alpha tests agree: `hi < -m` exactly when the one-sided p of
`H0: delta >= -m` is below alpha, `lo > m` when that of `H0: delta <= m` is, and `-m < lo, hi < m`
when both TOST p-values are (Schuirmann 1987). The functions take batches along the leading axis
(`(..., n)` arrays) so the simulated A/A test (aa_simulation.py) runs thousands of studies at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np
from scipy import special, stats

try:  # the ufunc scipy.stats.nct.sf evaluates (Boost); absent: through scipy.stats
    from scipy.special._ufuncs import _nct_sf
except ImportError:  # pragma: no cover - other scipy versions
    _nct_sf = None

ALPHA = 0.05  # family-wise level (SCIENCE.md 22.4)
POWER = 0.8  # the seed-count calculator's target power (22.5)
MAX_SEEDS = 10_000  # the calculator gives up beyond this many seeds per arm
EXACT_LIMIT = 20_000  # relabellings enumerated exactly; beyond, a fixed-seed random subset
TOL = 1e-12

A_LOWER, B_LOWER, EQUIVALENT, INCONCLUSIVE = "a_lower", "b_lower", "equivalent", "inconclusive"
OUTCOMES = (A_LOWER, B_LOWER, EQUIVALENT, INCONCLUSIVE)


# ------------------------------------------------- t and noncentral t, called directly ----------
# scipy.stats' distribution objects check and broadcast their arguments on every call (about 0.2
# ms); a family of thousands of claims calls them tens of thousands of times. These call the same
# special functions scipy.stats.t / nct evaluate, with the same answers at the edges (df <= 0 or
# nan: nan; x = -/+inf: 0 / 1; q = 0 / 1: -/+inf); tests/launch/stats hold them to scipy.stats.


def t_cdf(x: np.ndarray | float, df: np.ndarray | float) -> np.ndarray:
    """scipy.stats.t.cdf(x, df)."""
    return np.asarray(special.stdtr(df, x))


def t_sf(x: np.ndarray | float, df: np.ndarray | float) -> np.ndarray:
    """scipy.stats.t.sf(x, df)."""
    return np.asarray(special.stdtr(df, -np.asarray(x, dtype=float)))


def t_ppf(q: np.ndarray | float, df: np.ndarray | float) -> np.ndarray:
    """scipy.stats.t.ppf(q, df)."""
    q, df = np.asarray(q, dtype=float), np.asarray(df, dtype=float)
    return np.where((q == 0) & (df > 0), -np.inf, special.stdtrit(df, q))


def nct_sf(x: np.ndarray | float, df: np.ndarray | float, nc: np.ndarray | float) -> np.ndarray:
    """scipy.stats.nct.sf(x, df, nc)."""
    if _nct_sf is None:  # pragma: no cover
        return np.asarray(stats.nct.sf(x, df, nc))
    x = np.asarray(x, dtype=float)
    with np.errstate(over="ignore"):
        p = np.clip(_nct_sf(x, df, nc), 0.0, 1.0)
    p = np.where(x == np.inf, 0.0, np.where(x == -np.inf, 1.0, p))
    ok = (np.asarray(df) > 0) & (np.asarray(nc) == np.asarray(nc))
    return np.where(ok, p, np.nan)


# ---------------------------------------------------------------- Welch (22.3) ----------------


@dataclass(frozen=True)
class Welch:
    """Welch's two-sample t on the last axis: delta, its standard error and the Welch-Satterthwaite
    degrees of freedom (arrays over the batch axes; floats for one comparison)."""

    delta: np.ndarray
    se: np.ndarray
    df: np.ndarray

    def interval(self, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """The two-sided (1 - 2 alpha) interval delta -/+ t_{df, 1-alpha} se."""
        half = np.where(self.se > 0, t_ppf(1.0 - alpha, self.df) * self.se, np.inf)
        return self.delta - half, self.delta + half

    def p_below(self, bound: float) -> np.ndarray:
        """One-sided p of H0: delta >= bound against delta < bound."""
        return _t_tail((self.delta - bound), self.se, self.df, lower=True)

    def p_above(self, bound: float) -> np.ndarray:
        """One-sided p of H0: delta <= bound against delta > bound."""
        return _t_tail((self.delta - bound), self.se, self.df, lower=False)


def welch(a: np.ndarray, b: np.ndarray) -> Welch:
    """Welch (1947) on the last axis of a (..., n_a) and b (..., n_b), n >= 2 each. A zero standard
    error (every value equal within both arms: no seed spread to test against) is no test: the
    interval is (-inf, inf) and every p-value 1 (see docs/SCIENCE.md, verdict statistics)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    na, nb = a.shape[-1], b.shape[-1]
    if na < 2 or nb < 2:
        raise ValueError(f"Welch's t needs >= 2 values per arm, got {na} and {nb}")
    scale = np.maximum(np.abs(a).max(axis=-1), np.abs(b).max(axis=-1))
    return welch_from(
        a.mean(axis=-1) - b.mean(axis=-1),
        a.var(axis=-1, ddof=1) / na,
        b.var(axis=-1, ddof=1) / nb,
        na - 1,
        nb - 1,
        scale,
    )


def welch_from(
    delta: np.ndarray,
    var_a: np.ndarray,
    var_b: np.ndarray,
    df_a: float,
    df_b: float,
    scale: np.ndarray | float = 1.0,
) -> Welch:
    """Welch from the variances of the two arm means and their degrees of freedom (df_a = n_a - 1
    for a sample variance / n_a; also for a jackknife variance of n_a seeds). A total below
    rounding of `scale` counts as zero: no test."""
    se2 = np.asarray(var_a + var_b, dtype=float)
    with np.errstate(invalid="ignore"):
        se2 = np.where(se2 > (TOL * np.maximum(scale, 1.0)) ** 2, se2, 0.0)  # nan: no test too
    denom = var_a**2 / df_a + var_b**2 / df_b
    with np.errstate(invalid="ignore", divide="ignore"):
        df = np.where(denom > 0, se2**2 / np.where(denom > 0, denom, 1.0), df_a + df_b)
    return Welch(np.asarray(delta, dtype=float), np.sqrt(se2), df)


def _t_tail(diff: np.ndarray, se: np.ndarray, df: np.ndarray, lower: bool) -> np.ndarray:
    diff, se = np.asarray(diff, dtype=float), np.asarray(se, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = diff / np.where(se > 0, se, 1.0)
        p = t_cdf(t, df) if lower else t_sf(t, df)
    return np.where(se > 0, p, 1.0)


# ----------------------------------------------------- the four outcomes (22.3) --------------


def outcome(lo: float, hi: float, margin: float) -> str:
    """The verdict row of SCIENCE.md 22.3 for the interval [lo, hi] of delta = A - B."""
    if hi < -margin:
        return A_LOWER
    if lo > margin:
        return B_LOWER
    if -margin < lo and hi < margin:
        return EQUIVALENT
    return INCONCLUSIVE


def margin_pvalues(
    p_below: Callable[[float], np.ndarray], p_above: Callable[[float], np.ndarray], margin: float
) -> np.ndarray:
    """(..., 3) one-sided p-values of the three rows: A lower (H0 delta >= -m), B lower
    (H0 delta <= m), equivalent (the larger TOST p). The claim's p for Holm is their minimum."""
    p_a = np.asarray(p_below(-margin))
    p_b = np.asarray(p_above(margin))
    p_eq = np.maximum(np.asarray(p_above(-margin)), np.asarray(p_below(margin)))
    return np.stack(np.broadcast_arrays(p_a, p_b, p_eq), axis=-1)


def outcome_from_p(p3: np.ndarray, level: np.ndarray | float) -> np.ndarray:
    """Outcome index (0 a_lower, 1 b_lower, 2 equivalent, 3 inconclusive) from margin_pvalues at
    `level`: the row whose test rejects (at most one does for level < 0.5)."""
    p3 = np.asarray(p3)
    level = np.asarray(level)[..., None]
    rejected = p3 <= level
    first = np.argmax(rejected, axis=-1)
    return np.where(rejected.any(axis=-1), first, 3)


# -------------------------------------------------- exact permutation test (22.3) ------------


@lru_cache(maxsize=64)
def relabellings(n_a: int, n_b: int) -> np.ndarray:
    """(R, n_a) indices into the pooled n_a + n_b units: every choice of the A arm (the observed
    labelling, 0..n_a-1, first) when C(n_a+n_b, n_a) <= EXACT_LIMIT, else the observed one and
    EXACT_LIMIT - 1 random ones (seed 0)."""
    n = n_a + n_b
    if math.comb(n, n_a) <= EXACT_LIMIT:
        return np.array(list(combinations(range(n), n_a)), dtype=np.intp)
    rng = np.random.default_rng(0)
    drawn = np.argsort(rng.random((EXACT_LIMIT - 1, n)), axis=1)[:, :n_a]
    return np.vstack([np.arange(n_a)[None, :], np.sort(drawn, axis=1)])


def permutation_distribution(
    pooled: np.ndarray, n_a: int, statistic: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
    """The statistic over every relabelling of whole units (seed-runs): `pooled` is (N, ...) with
    the A arm first; `statistic(A, B)` takes (R, n_a, ...) and (R, n_b, ...) and returns (R,),
    recomputing everything (a cross-fitted selection included) inside each relabelling. Element 0
    is the observed value."""
    pooled = np.asarray(pooled, dtype=float)
    n = pooled.shape[0]
    choose = relabellings(n_a, n - n_a)
    mask = np.zeros((len(choose), n), dtype=bool)
    np.put_along_axis(mask, choose, True, axis=1)
    rest = np.nonzero(~mask)[1].reshape(len(choose), n - n_a)
    return np.asarray(statistic(pooled[choose], pooled[rest]), dtype=float)


def permutation_p(dist: np.ndarray, lower: bool) -> float:
    """One-sided p: the share of relabellings at least as extreme as the observed dist[0] (ties
    count; the observed labelling is one of them, so p >= 1 / len(dist))."""
    obs = dist[0]
    scale = TOL * max(1.0, abs(obs))
    hits = dist <= obs + scale if lower else dist >= obs - scale
    return float(hits.mean())


def permutation_floor(n_a: int, n_b: int, sided: int = 1) -> float:
    """Smallest achievable p of the unpaired permutation test: sided / C(n_a + n_b, n_a)."""
    return min(1.0, sided / math.comb(n_a + n_b, n_a))


def permutation_floor_n(alpha: float, sided: int = 1) -> int:
    """Smallest n per arm whose permutation floor reaches alpha."""
    n = 1
    while permutation_floor(n, n, sided) > alpha + TOL:
        n += 1
    return n


def shifted_permutation_p(a: np.ndarray, b: np.ndarray, shift: float, lower: bool) -> float:
    """Fisher-Pitman p of the difference of means for per-unit values, A shifted by -shift: tests
    H0 delta >= shift (lower=True) or delta <= shift under the location-shift model."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    pooled = np.concatenate([a - shift, b])
    dist = permutation_distribution(pooled, len(a), _mean_difference)
    return permutation_p(dist, lower)


def _mean_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.mean(axis=1) - b.mean(axis=1)


def permutation_interval(a: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, float]:
    """The (1 - 2 alpha) interval from inverting the two one-sided Fisher-Pitman tests: the
    shifts delta0 neither test rejects at alpha (bisection; the p-values are monotone in the
    shift). (-inf, inf) when the floor cannot reach alpha."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if permutation_floor(len(a), len(b)) > alpha + TOL:
        return -math.inf, math.inf
    delta = float(a.mean() - b.mean())
    span = float(np.ptp(np.concatenate([a, b]))) + 1.0

    def edge(lower: bool) -> float:
        # lower=True: smallest shift not rejected by H0 delta <= shift (p_above); else largest.
        inside, outside = delta, (delta - span if lower else delta + span)
        for _ in range(60):
            mid = 0.5 * (inside + outside)
            p = shifted_permutation_p(a, b, mid, lower=not lower)
            if p <= alpha:
                outside = mid
            else:
                inside = mid
        return 0.5 * (inside + outside)

    return edge(True), edge(False)


# -------------------------------------------------- multiplicity (22.4) ----------------------


def holm(pvalues: np.ndarray, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """Holm (1979) step-down on the last axis: (rejected, level). Sorted p_(j) is rejected while
    p_(j) <= alpha / (m - j + 1), stopping at the first failure. `level` is each claim's alpha':
    alpha / (m - j + 1) up to and including the first failure, then the failing claim's level for
    every claim ranked after it (so no later interval can disagree with its 'not rejected')."""
    p = np.asarray(pvalues, dtype=float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    steps = alpha / (m - np.arange(m))
    passes = np.cumprod(sorted_p <= steps, axis=-1).astype(bool)
    failed_at = passes.sum(axis=-1, keepdims=True)  # index of the first failure (m: none)
    idx = np.minimum(np.arange(m), failed_at)
    sorted_level = steps[np.minimum(idx, m - 1)]
    rejected, level = np.empty_like(passes), np.empty_like(sorted_level)
    np.put_along_axis(rejected, order, passes, axis=-1)
    np.put_along_axis(level, order, sorted_level, axis=-1)
    return rejected, level


def holm_adjusted(pvalues: Sequence[float]) -> list[float]:
    """Holm (1979) adjusted p-values: sorted p_(j) becomes max over i <= j of
    min(1, (m - i + 1) p_(i)); a claim is rejected at level alpha exactly when its adjusted p is
    <= alpha, the same decisions as `holm`. NaN entries (no test) are left NaN and not counted
    in m."""
    idx = [i for i, v in enumerate(pvalues) if not math.isnan(float(v))]
    out = [math.nan] * len(pvalues)
    m = len(idx)
    running = 0.0
    for j, i in enumerate(sorted(idx, key=lambda i: float(pvalues[i]))):
        running = max(running, min(1.0, (m - j) * float(pvalues[i])))
        out[i] = running
    return out


def benjamini_hochberg(pvalues: np.ndarray, q: float = ALPHA) -> np.ndarray:
    """Benjamini-Hochberg (1995) step-up: reject the k smallest p, k the largest j with
    p_(j) <= q j / m. For exploratory per-grid-point differences only (22.4)."""
    p = np.asarray(pvalues, dtype=float).ravel()
    m = len(p)
    if m == 0:
        return np.zeros(0, dtype=bool)
    order = np.argsort(p, kind="stable")
    below = p[order] <= q * np.arange(1, m + 1) / m
    k = int(np.nonzero(below)[0].max()) + 1 if below.any() else 0
    rejected = np.zeros(m, dtype=bool)
    rejected[order[:k]] = True
    return rejected


# -------------------------------------------------- seed-count calculator (22.5) -------------


def search_seeds(power: Callable[[int], float], target: float, floor: int) -> int | None:
    """The smallest n in [max(2, floor), MAX_SEEDS] with power(n) >= target (None: none), for a
    power that grows with n (every power here does): doubling steps, then bisection, so about
    2 log2(n) evaluations instead of n (a family of thousands of claims needs it)."""
    low = max(2, floor) - 1  # power(low) < target, or low below the range
    high, step = low + 1, 1
    while power(high) < target:
        if high >= MAX_SEEDS:
            return None
        low, high, step = high, min(MAX_SEEDS, high + step), 2 * step
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if power(mid) >= target else (mid, high)
    return high


def seeds_for_effect(d: float, alpha: float, sided: int = 2, target: float = POWER) -> int | None:
    """Smallest n per arm with noncentral-t power P(T_{2n-2, d sqrt(n/2)} > t_{2n-2, 1-alpha/sided})
    >= target (Cohen 1988 ch. 2). None when d <= 0 or beyond MAX_SEEDS."""
    if not d > 0:
        return None
    crit = alpha / sided

    def power(n: int) -> float:
        df = 2 * n - 2
        return float(nct_sf(t_ppf(1 - crit, df), df, d * math.sqrt(n / 2)))

    return search_seeds(power, target, 2)


def tost_power(n: int, delta: float, sd: float, margin: float, alpha: float) -> float:
    """Lower bound on the TOST power at true difference delta: P(reject lower) + P(reject upper)
    - 1, each a noncentral t with df 2n - 2."""
    df = 2 * n - 2
    crit = t_ppf(1 - alpha, df)
    k = math.sqrt(n / 2) / sd
    return float(
        nct_sf(crit, df, (margin - abs(delta)) * k)
        + nct_sf(crit, df, (margin + abs(delta)) * k)
        - 1.0
    )


def seeds_needed(
    delta: float,
    sd: float,
    margin: float,
    alpha: float,
    *,
    permutation: bool = False,
    target: float = POWER,
) -> int | None:
    """Seeds per arm for `target` power at true difference `delta` and between-seed SD `sd`:
    |delta| > m: the minimum-effect test, d = (|delta| - m) / sd, one-sided at alpha;
    m == 0: the plain difference, d = |delta| / sd, two-sided at alpha;
    |delta| < m: the TOST equivalence test (Chow, Shao & Wang 2008 3.2; exact noncentral t).
    Raised to the permutation floor when that test decides. None: more than MAX_SEEDS, or
    |delta| == m (no seed count reaches it)."""
    floor = permutation_floor_n(alpha, 1) if permutation else 2
    if not (math.isfinite(delta) and math.isfinite(sd)):
        return None
    if sd <= 0:
        return floor
    if margin == 0:
        n = seeds_for_effect(abs(delta) / sd, alpha, sided=2, target=target)
    elif abs(delta) > margin:
        n = seeds_for_effect((abs(delta) - margin) / sd, alpha, sided=1, target=target)
    elif abs(delta) < margin:
        n = search_seeds(lambda k: tost_power(k, delta, sd, margin, alpha), target, 2)
    else:
        n = None
    return None if n is None else max(n, floor)
