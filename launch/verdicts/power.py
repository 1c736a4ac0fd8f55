"""Seeds per arm for claim (a) by simulating the statistic the verdict uses (SCIENCE.md 22.5).

The noncentral-t calculator (statistics.seeds_needed) assumes Welch on independent per-seed values
with a known SD. Claim (a) is not that: its per-seed values y(s) share a cross-fitted selection
(each seed's lr is chosen on the other seeds), and its standard error is the delete-one-seed
jackknife of the whole cross-fitted mean, which runs 1.2-1.5x the true SD of the difference at
these n. At the n the noncentral t named, the verdict found the difference in 65-79 % of
simulated studies, not 80 %. This module names the n by running that verdict instead:

    model of an arm: its true curve mu(eta) (the pilot's mean curve) and seed noise drawn as
        Gaussian with the pilot's covariance across the grid (z @ R, R the k residual vectors
        (l(eta, s) - mu(eta)) / sqrt(k - 1): the observed spread and its across-lr correlation),
        or independent per lr at the pilot's per-lr SD; every loss capped at l_0 (a diverged run
        counts as l_0, as in the verdict)
    truth: B's curve shifted so that min mu_A - min mu_B = delta (the claim's true difference;
        for a verdict, its observed delta)
    power(n): share of R replicate studies (n seeds per arm, both arms) in which the verdict's
        own code (family.claim_p3: cross-fitting, the jackknife Welch, the margin's three rows)
        gives the target outcome at the claim's level: the observed direction when |delta| > m,
        'equivalent' when |delta| < m
    n: the smallest n whose one-sided 95 % Clopper-Pearson lower bound on power(n) is >= 0.8,
        for each noise model that applies; the larger of the two (neither shape of the noise is
        known from 2-4 seeds, so a count must hold under both)

Random numbers are fixed by `seed` and n (the result is deterministic); every replicate study
runs as one batch of numpy arrays. The search starts at the noncentral-t count (the simulation
rarely needs fewer) and walks from there, so a claim costs a few simulated seed counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from normlab.launch.stats import statistics as st
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts.results_table import Cell
from scipy import stats

REPLICATES = 2000  # simulated studies per seed count
CONFIDENCE = 0.95  # one-sided, of the lower bound on the simulated power
MAX_SIMULATED = 64  # seeds per arm beyond which the calculator stops ("more than 64")
BATCH = 250  # studies decided at a time before `reaches` looks whether the rest can matter
CHUNK = 2_000_000  # (study, j, s) triples the jackknife holds at once (memory bound)


@dataclass(frozen=True)
class ArmModel:
    """One arm's true curve over its lr grid and its seed noise: noise = z @ factor, z standard
    normal (..., r); losses capped at l0 (inf: never)."""

    curve: np.ndarray  # (G,)
    factor: np.ndarray  # (r, G)
    l0: float = math.inf

    @classmethod
    def correlated(cls, cell: Cell) -> ArmModel:
        """The pilot cell's mean curve and sample covariance across the grid (>= 2 seeds)."""
        x = cell.loss
        mu = x.mean(axis=0)
        return cls(mu, (x - mu) / math.sqrt(len(x) - 1), _cap(cell))

    @classmethod
    def independent(cls, cell: Cell) -> ArmModel:
        """The pilot cell's mean curve, noise independent per lr at its per-lr sample SD."""
        x = cell.loss
        return cls(x.mean(axis=0), np.diag(x.std(axis=0, ddof=1)), _cap(cell))

    @classmethod
    def stated(cls, sd: float, curve: np.ndarray | None = None) -> ArmModel:
        """A stated seed SD, independent per lr; no curve: a one-point grid (no selection)."""
        c = np.zeros(1) if curve is None else np.asarray(curve, dtype=float)
        return cls(c, np.eye(len(c)) * sd)

    def shifted(self, by: float) -> ArmModel:
        """The same arm with every loss, l_0 included, moved by `by` (a location shift)."""
        return ArmModel(self.curve + by, self.factor, self.l0 + by)

    def draw(self, rng: np.random.Generator, replicates: int, n: int) -> np.ndarray:
        """(replicates, n, G) seed curves."""
        z = rng.standard_normal((replicates, n, self.factor.shape[0]))
        return np.minimum(self.curve + z @ self.factor, self.l0)

    @property
    def sd_at_best(self) -> float:
        """The seed SD at the curve's minimum (the noncentral t's starting guess)."""
        return float(np.sqrt((self.factor**2).sum(axis=0))[np.argmin(self.curve)])


def _cap(cell: Cell) -> float:
    return cell.l0 if math.isfinite(cell.l0) else math.inf


def target_outcome(delta: float, margin: float) -> tuple[int, ...]:
    """The outcome indices (statistics.OUTCOMES) that count as finding a true difference delta:
    its direction when |delta| > m (either direction when m = 0 and delta = 0 is excluded),
    'equivalent' when |delta| < m; () when |delta| == m (no seed count reaches it)."""
    if margin == 0 and delta == 0:
        return ()
    if abs(delta) > margin:
        return (0,) if delta < 0 else (1,)
    if abs(delta) < margin:
        return (2,)
    return ()


def lower_bound(hits: int, replicates: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson lower confidence bound on a binomial proportion."""
    if hits == 0:
        return 0.0
    return float(stats.beta.ppf(1.0 - confidence, hits, replicates - hits + 1))


def replicates_at(n: int, replicates: int = REPLICATES) -> int:
    """Studies simulated at n seeds per arm: all of them up to 16 seeds, then fewer (down to a
    quarter, at least 500) so that the cost, which grows as n^2, stays bounded; fewer replicates
    only widen the lower bound, so the count stays conservative."""
    return replicates if n <= 16 else max(min(500, replicates), replicates * 256 // (n * n))


def simulated_power(
    arm_a: ArmModel,
    arm_b: ArmModel,
    delta: float,
    n: int,
    margin: float,
    level: float,
    replicates: int = REPLICATES,
    seed: int = 0,
) -> tuple[int, int]:
    """(hits, replicates): studies of n seeds per arm in which claim (a)'s verdict at `level` is
    the target outcome, with B's curve shifted to min mu_A - min mu_B = delta."""
    want = target_outcome(delta, margin)
    if not want:
        return 0, replicates
    xa, xb = _draw_studies(arm_a, arm_b, delta, n, replicates, seed)
    return _hits(xa, xb, margin, level, want), replicates


def _hits(
    xa: np.ndarray, xb: np.ndarray, margin: float, level: float, want: tuple[int, ...]
) -> int:
    """How many of the studies (xa[i], xb[i]) claim (a)'s verdict at `level` gives an outcome in
    `want`."""
    return int(np.isin(st.outcome_from_p(loss_claim_p3(xa, xb, margin), level), want).sum())


def _draw_studies(
    arm_a: ArmModel, arm_b: ArmModel, delta: float, n: int, replicates: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The replicate studies' seed curves, (replicates, n, G) per arm, B shifted to delta."""
    b = arm_b.shifted(float(arm_a.curve.min() - arm_b.curve.min() - delta))
    rng = np.random.default_rng([seed, n])
    return arm_a.draw(rng, replicates, n), b.draw(rng, replicates, n)


def hits_needed(replicates: int, target: float, confidence: float = CONFIDENCE) -> int:
    """The fewest hits of `replicates` whose lower bound (`lower_bound`) is >= target;
    replicates + 1 when none is."""
    lo, hi = 0, replicates + 1  # the bound rises with the hits: bisect
    while lo < hi:
        mid = (lo + hi) // 2
        if lower_bound(mid, replicates, confidence) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def reaches(
    arm_a: ArmModel,
    arm_b: ArmModel,
    delta: float,
    n: int,
    margin: float,
    level: float,
    target: float,
    replicates: int = REPLICATES,
    seed: int = 0,
) -> bool:
    """Whether `simulated_power`'s lower bound at n is >= target: the same studies, the same
    answer, decided in batches of BATCH studies and stopped once the rest cannot change it (the
    hits already reach the count needed, or cannot reach it with every remaining study a hit):
    curtailed, not sequentially tested, so no error rate changes."""
    want, need = target_outcome(delta, margin), hits_needed(replicates, target)
    if not want or need > replicates:
        return False
    xa, xb = _draw_studies(arm_a, arm_b, delta, n, replicates, seed)
    hits = 0
    for lo in range(0, replicates, BATCH):
        hits += _hits(xa[lo : lo + BATCH], xb[lo : lo + BATCH], margin, level, want)
        left = replicates - min(lo + BATCH, replicates)
        if hits >= need or hits + left < need:
            break
    return hits >= need


def jackknife_var(x: np.ndarray) -> np.ndarray:
    """family.jackknife_var for distinct seeds (n >= 3) on a batch (B, n, G), computed from the
    all-seed sum: the replicate without seed j selects held-out seed s on sum - x_j - x_s (the
    argmin of the mean of the n - 2 others), a running minimum over the grid for every (j, s)
    at once (a tie keeps the lower lr, as argmin), updated in place. Equal to it to rounding (a
    test holds them together) and many times faster, which is where the simulation spends its
    time."""
    n = x.shape[-2]
    flat = x.reshape(-1, n, x.shape[-1])
    out = np.empty(len(flat))
    step = max(1, CHUNK // (n * n))
    for lo in range(0, len(flat), step):
        out[lo : lo + step] = _jackknife_chunk(flat[lo : lo + step])
    return out.reshape(x.shape[:-2])


def _jackknife_chunk(x: np.ndarray) -> np.ndarray:
    n = x.shape[-2]
    rest = np.moveaxis(x.sum(axis=-2)[:, None, :] - x, -1, 0).copy()  # [g, b, j]: sum without j
    by_lr = np.moveaxis(x, -1, 0).copy()  # [g, b, s]
    best = np.full((len(x), n, n), np.inf)  # [b, j, s]: running min of rest_j - x_s
    y = np.zeros_like(best)  # held-out seed s's loss at that minimum
    t, lower = np.empty_like(best), np.empty(best.shape, dtype=bool)
    for rest_g, x_g in zip(rest, by_lr, strict=True):
        np.subtract(rest_g[:, :, None], x_g[:, None, :], out=t)
        np.less(t, best, out=lower)
        np.copyto(best, t, where=lower)
        np.copyto(y, np.broadcast_to(x_g[:, None, :], y.shape), where=lower)
    diag = np.arange(n)
    reps = (y.sum(axis=-1) - y[:, diag, diag]) / (n - 1)
    dev = reps - reps.mean(axis=-1, keepdims=True)
    return (n - 1) / n * (dev**2).sum(axis=-1)


def loss_claim_p3(xa: np.ndarray, xb: np.ndarray, margin: float) -> np.ndarray:
    """family.claim_p3 for claim (a) on distinct seeds (every simulated seed is one): the
    cross-fitted means, each arm's jackknife variance (var(y) / n at n = 2), Welch, the three
    rows' p-values."""
    ya, yb = vc.cross_fitted(xa)[0], vc.cross_fitted(xb)[0]
    na, nb = ya.shape[-1], yb.shape[-1]
    va = jackknife_var(xa) if na >= 3 else ya.var(axis=-1, ddof=1) / na
    vb = jackknife_var(xb) if nb >= 3 else yb.var(axis=-1, ddof=1) / nb
    scale = np.maximum(np.abs(ya).max(axis=-1), np.abs(yb).max(axis=-1))
    w = st.welch_from(ya.mean(axis=-1) - yb.mean(axis=-1), va, vb, na - 1, nb - 1, scale)
    return st.margin_pvalues(w.p_below, w.p_above, margin)


def smallest_n(
    passes: Callable[[int], bool], start: int, low: int = 2, high: int = MAX_SIMULATED
) -> int | None:
    """The smallest n in [low, high] with passes(n) (power rises with n), searching from `start`:
    steps of 1, 2, 4, ... down from a pass or up from a failure until the answer is bracketed,
    then bisection; None: not even `high` passes."""
    n = min(max(start, low), high)
    step = 1
    if passes(n):
        hi = n
        while True:
            if hi == low:
                return low
            cand = max(hi - step, low)
            if not passes(cand):
                lo = cand
                break
            hi, step = cand, step * 2
    else:
        lo = n
        while True:
            if lo == high:
                return None
            cand = min(lo + step, high)
            if passes(cand):
                hi = cand
                break
            lo, step = cand, step * 2
    while hi - lo > 1:  # fails at lo, passes at hi
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return hi


def normal_guess(delta: float, sd: float, margin: float, level: float, target: float) -> int:
    """Where the search starts: the normal approximation n = 2 (z_{1-level} + z)^2 sd^2 / e^2,
    e = |delta| - m and z = z_{target} for a minimum-effect test, e = m - |delta| and
    z = z_{(1+target)/2} for TOST (Chow, Shao & Wang 2008 3.2), in [2, MAX_SIMULATED]."""
    gap = abs(abs(delta) - margin) if margin > 0 else abs(delta)
    if not gap > 0:
        return MAX_SIMULATED
    z = stats.norm.ppf(target if abs(delta) > margin else (1 + target) / 2)
    n = 2 * (stats.norm.ppf(1 - level) + z) ** 2 * sd**2 / gap**2
    return int(min(max(math.ceil(n), 2), MAX_SIMULATED))


def seeds_for_models(
    models: list[tuple[ArmModel, ArmModel]],
    delta: float,
    margin: float,
    level: float,
    target: float = st.POWER,
    replicates: int = REPLICATES,
    seed: int = 0,
) -> int | None:
    """Smallest n per arm at which every (A, B) noise model gives claim (a) `target` power (lower
    confidence bound) at true difference delta; None when no n <= MAX_SIMULATED does."""
    if not target_outcome(delta, margin) or not math.isfinite(delta):
        return None
    found = 2
    for arm_a, arm_b in models:
        sd = math.sqrt((arm_a.sd_at_best**2 + arm_b.sd_at_best**2) / 2)
        guess = normal_guess(delta, sd, margin, level, target)

        def passes(n: int, a: ArmModel = arm_a, b: ArmModel = arm_b) -> bool:
            reps = replicates_at(n, replicates)
            return reaches(a, b, delta, n, margin, level, target, reps, seed)

        n = smallest_n(passes, max(guess, found), low=found)
        if n is None:
            return None
        found = n
    return found


def seeds_for_cells(
    a: Cell,
    b: Cell,
    delta: float,
    margin: float,
    level: float,
    target: float = st.POWER,
    seed: int = 0,
) -> int | None:
    """Claim (a)'s seeds per arm from two pilot cells (>= 2 seeds each): their curves and
    spreads, correlated across the grid as observed and independent per lr, the larger n."""
    models = [
        (ArmModel.correlated(a), ArmModel.correlated(b)),
        (ArmModel.independent(a), ArmModel.independent(b)),
    ]
    return seeds_for_models(models, delta, margin, level, target, seed=seed)
