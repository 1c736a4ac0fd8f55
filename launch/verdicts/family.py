"""The per-seed statistics of the pre-registered family (SCIENCE.md 22.2) and the decision of a
family (22.3-22.4), on batches of studies: the verdict pipeline and the simulated A/A test
(aa_simulation.py) run this same code.

Arrays: `X` is (..., n seeds, G lrs) of capped losses by increasing lr, `min(l, l_0)`, a diverged,
failed or stopped run being `l_0` (so every statistic counts it the same way).

    (a) loss_at_best_lr  y(s) = X[s, argmin_eta mean_{s' != s} X[s', eta]]   (leave-one-seed-out;
                         a tie goes to the lowest lr); Welch on mean y, each arm's variance
                         the delete-one-seed jackknife of the whole cross-fitted mean (n >= 3)
    (b) lr_sensitivity   S(s) = mean_eta X[s, eta] - min_eta X[s, eta];        Welch on S
    (c) trained_range    W(s) = grid points in the widest contiguous run with
                         X[s, eta] <= plateau - 0.2;                           permutation only
Margins: 0.1 nats for (a) and (b), 1 grid step for (c). A claim's p (for Holm) is the smallest of
its three row p-values (A lower, B lower, equivalent); at the claim's Holm level alpha' at most one
row rejects, and that row is the verdict (statistics.outcome_from_p).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from normlab.launch.stats import group_sequential as gs
from normlab.launch.stats import statistics as st
from normlab.launch.stats.permutation_counts import cumulative_tails, integer_tails, integer_valued
from normlab.launch.stats.separation import TRAINED_MARGIN

LOSS, SENS, RANGE = "loss_at_best_lr", "lr_sensitivity", "trained_range"
STATISTICS = (LOSS, SENS, RANGE)
LOSS_MARGIN = 0.1  # nats, for (a) and (b)
RANGE_MARGIN = 1.0  # grid steps, for (c)
TOL = 1e-9
CHUNK = 2_000_000  # batch x relabellings evaluated at once (memory bound)
COUNT_FROM = 1000  # relabellings beyond which integer seeds are counted rather than enumerated


def cross_fitted(x: np.ndarray, units: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(y, pick): y[..., s] = x[..., s, pick[..., s]], pick the argmin over lr of the mean of the
    other seeds (n >= 2). `units` (..., n): which seed-run each row is a copy of (the A/A
    resampling draws some twice); a held-out row's selection then leaves out every copy of it, as
    cross-fitting requires, and a row with no other unit gets y = nan. Real tables have distinct
    seeds (units None), where both are the same."""
    n = x.shape[-2]
    if units is None:
        others = (x.sum(axis=-2, keepdims=True) - x) / (n - 1)
    else:
        keep = (units[..., :, None] != units[..., None, :]).astype(float)  # (..., n held, n)
        count = keep.sum(axis=-1)[..., None]
        with np.errstate(invalid="ignore", divide="ignore"):
            others = np.einsum("...st,...tg->...sg", keep, x) / count
        others = np.where(count > 0, others, 0.0)
    pick = np.argmin(others, axis=-1)
    y = np.take_along_axis(x, pick[..., None], axis=-1)[..., 0]
    if units is not None:
        y = np.where(count[..., 0] > 0, y, np.nan)
    return y, pick


_JACKKNIFED: dict[tuple[tuple[int, ...], bytes], np.ndarray] = {}  # one arm's, by its values
JACKKNIFE_CACHE = 512


def jackknife_var(x: np.ndarray, units: np.ndarray | None = None) -> np.ndarray:
    """Delete-one-seed jackknife variance of the arm's cross-fitted mean (n >= 3): each replicate
    redoes the whole cross-fitting on the n - 1 remaining seeds. It counts the selection noise
    that the seeds share (their y values are positively correlated, so var(y) / n is too small:
    docs/SCIENCE.md, verdict statistics). One arm's (a cell's curves, no units) is remembered by
    its values: a family of every pair asks for each cell's once per claim it is in."""
    if units is None and x.ndim == 2:
        key = (x.shape, np.ascontiguousarray(x, dtype=float).tobytes())
        if key not in _JACKKNIFED:
            if len(_JACKKNIFED) >= JACKKNIFE_CACHE:
                _JACKKNIFED.clear()
            _JACKKNIFED[key] = _jackknife_var(x, None)
        return _JACKKNIFED[key]
    return _jackknife_var(x, units)


def _jackknife_var(x: np.ndarray, units: np.ndarray | None) -> np.ndarray:
    n = x.shape[-2]
    reps = np.stack(
        [
            cross_fitted(
                np.delete(x, j, axis=-2), None if units is None else np.delete(units, j, axis=-1)
            )[0].mean(axis=-1)
            for j in range(n)
        ]
    )
    return (n - 1) / n * ((reps - reps.mean(axis=0)) ** 2).sum(axis=0)


def loss_welch(
    xa: np.ndarray, xb: np.ndarray, ua: np.ndarray | None = None, ub: np.ndarray | None = None
) -> st.Welch:
    """Welch's t for claim (a): the difference of cross-fitted means, each arm's variance the
    jackknife one when it has >= 3 seeds, else var(y) / n (n = 2), df n - 1 per arm. An arm whose
    y is undefined (A/A draws of one seed-run only) gives no test (p = 1)."""
    ya, yb = cross_fitted(xa, ua)[0], cross_fitted(xb, ub)[0]
    na, nb = ya.shape[-1], yb.shape[-1]
    va = jackknife_var(xa, ua) if na >= 3 else ya.var(axis=-1, ddof=1) / na
    vb = jackknife_var(xb, ub) if nb >= 3 else yb.var(axis=-1, ddof=1) / nb
    scale = np.maximum(np.abs(ya).max(axis=-1), np.abs(yb).max(axis=-1))
    return st.welch_from(ya.mean(axis=-1) - yb.mean(axis=-1), va, vb, na - 1, nb - 1, scale)


def naive_best(x: np.ndarray) -> np.ndarray:
    """min_eta mean_s x: the in-sample best loss (biased low; reported for comparison)."""
    return x.mean(axis=-2).min(axis=-1)


def seed_sensitivity(x: np.ndarray) -> np.ndarray:
    """S(s) = mean over the grid minus the minimum, per seed."""
    return x.mean(axis=-1) - x.min(axis=-1)


def trained_width(x: np.ndarray, plateau: float) -> np.ndarray:
    """W(s): length of the widest contiguous run of grid points with x <= plateau - 0.2."""
    ok = x <= plateau - TRAINED_MARGIN + TOL
    run = np.zeros(x.shape[:-1], dtype=np.int64)
    best = np.zeros_like(run)
    for g in range(x.shape[-1]):
        run = (run + 1) * ok[..., g]
        best = np.maximum(best, run)
    return best


def per_seed(statistic: str, x: np.ndarray, plateau: float | None = None) -> np.ndarray:
    """The per-seed values (..., n) that the claim's test compares."""
    if statistic == LOSS:
        return cross_fitted(x)[0]
    if statistic == SENS:
        return seed_sensitivity(x)
    if plateau is None:
        raise ValueError("the trained range needs the plateau")
    return trained_width(x, plateau).astype(float)


def margin_of(statistic: str, loss_margin: float = LOSS_MARGIN) -> float:
    return RANGE_MARGIN if statistic == RANGE else loss_margin


def welch_p3(a: np.ndarray, b: np.ndarray, margin: float) -> np.ndarray:
    """(..., 3) row p-values from Welch's t on per-seed values (..., n_a) and (..., n_b)."""
    w = st.welch(a, b)
    return st.margin_pvalues(w.p_below, w.p_above, margin)


def permutation_p3(a: np.ndarray, b: np.ndarray, margin: float) -> np.ndarray:
    """(..., 3) row p-values from the exact Fisher-Pitman test of per-seed values: every
    relabelling of the pooled seeds, A shifted by the margin under each null (location shift)."""
    single = np.ndim(a) == 1 and np.ndim(b) == 1
    a, b = np.atleast_2d(a).astype(float), np.atleast_2d(b).astype(float)
    batch_shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    na, nb = a.shape[-1], b.shape[-1]
    pooled = np.concatenate(
        [np.broadcast_to(a, (*batch_shape, na)), np.broadcast_to(b, (*batch_shape, nb))], axis=-1
    ).reshape(-1, na + nb)
    relabelled = math.comb(na + nb, na)
    if relabelled > COUNT_FROM and integer_valued(pooled):
        # many relabellings of integer seeds: counted exactly (launch.stats.permutation_counts);
        # beyond enumeration's reach without the joint table (the same counts, faster)
        tails = cumulative_tails if relabelled > st.EXACT_LIMIT else integer_tails
        out = np.stack([tails(r[:na], r[na:], margin, st.TOL) for r in pooled])
        return out[0] if single else out.reshape(*batch_shape, 3)
    choose = st.relabellings(na, nb)
    k_a = (choose < na).sum(axis=1)  # original A seeds in each relabelled A arm
    out = np.empty((pooled.shape[0], 3))
    step = max(1, CHUNK // len(choose))
    for lo in range(0, pooled.shape[0], step):
        part = pooled[lo : lo + step]
        sel = part[:, choose].sum(axis=-1)  # (B, R): sum of each relabelled A arm
        total = part.sum(axis=-1, keepdims=True)
        low = _shifted(sel, total, k_a, na, nb, -margin)
        high = _shifted(sel, total, k_a, na, nb, margin)
        out[lo : lo + step, 0] = _tail(low, True)
        out[lo : lo + step, 1] = _tail(high, False)
        out[lo : lo + step, 2] = np.maximum(_tail(low, False), _tail(high, True))
    return out[0] if single else out.reshape(*batch_shape, 3)


def _shifted(
    sel: np.ndarray, total: np.ndarray, k_a: np.ndarray, na: int, nb: int, shift: float
) -> np.ndarray:
    """Difference of means per relabelling after subtracting `shift` from the original A seeds."""
    s, t = sel - shift * k_a, total - shift * na
    return s / na - (t - s) / nb


def _tail(d: np.ndarray, lower: bool) -> np.ndarray:
    """Share of relabellings (columns) at least as extreme as the observed column 0."""
    obs = d[:, :1]
    tol = st.TOL * np.maximum(1.0, np.abs(obs))
    return ((d <= obs + tol) if lower else (d >= obs - tol)).mean(axis=1)


def claim_p3(
    statistic: str,
    xa: np.ndarray,
    xb: np.ndarray,
    plateau: float | None,
    loss_margin: float = LOSS_MARGIN,
    units: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """(..., 3) row p-values of one claim on curves xa (..., n_a, G) and xb (..., n_b, G'): Welch
    for (a) and (b), the exact permutation test for (c). `units`: see cross_fitted."""
    margin = margin_of(statistic, loss_margin)
    if statistic == LOSS:
        w = loss_welch(xa, xb, *(units or (None, None)))
        return st.margin_pvalues(w.p_below, w.p_above, margin)
    a, b = per_seed(statistic, xa, plateau), per_seed(statistic, xb, plateau)
    if statistic == RANGE:
        return permutation_p3(a, b, margin)
    return welch_p3(a, b, margin)


def decide_family(
    p3: np.ndarray, alpha: float = st.ALPHA, looks: Sequence[gs.Look | None] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(outcome index, level) per claim of a family p3 (..., K, 3); outcome 0 a_lower,
    1 b_lower, 2 equivalent, 3 inconclusive. `looks` (one per claim, of a family (K, 3)): where
    each claim sits in the study's plan of looks (SCIENCE.md 22.8); its level is then the nominal
    level of its look's boundary under a plan that spends the claim's Holm level, and Holm orders
    the claims by the plan level each p needs (closed testing with sequential Bonferroni tests)."""
    p = p3.min(axis=-1)
    if looks is None:
        _, level = st.holm(p, alpha)
        return st.outcome_from_p(p3, level), level
    q = np.array([gs.sequential_p(float(x), look, alpha) for x, look in zip(p, looks, strict=True)])
    _, holm_level = st.holm(q, alpha)
    level = np.array(
        [gs.nominal_level(float(a), look) for a, look in zip(holm_level, looks, strict=True)]
    )
    return st.outcome_from_p(p3, level), level
