"""The simulated A/A self-test and the power check of the verdict pipeline (SCIENCE.md 22.6).

A/A: from a finished cell (recipe, size) take the mean curve mu(eta) and the seed residual
vectors r_s = (l(eta, s) - mu(eta)) sqrt(n / (n - 1)), whole (the across-lr correlation within a
seed kept; a diverged point stays l_0 in every draw of its vector). For b = 1..B draw n_a + n_b
vectors with replacement, form the A and B curves mu + r and run the entire pipeline (selection,
cross-fitting, the three claims, Holm: launch.verdicts.family, as `normlab verdicts`). The FPR is
the share of replicates with any directional verdict; it passes when FPR <= alpha +
2 sqrt(alpha (1 - alpha) / B) (0.0597 at B = 2000). Repeated with Gaussian residuals at the pooled
SD (independent per grid point), so that a pass is not owed to the residuals' shape.

Power: a synthetic curve, A and B = A + (margin + 3 seed-SDs) with Gaussian seed noise; at the
seed count the calculator names for claim (a) (launch.verdicts.power, simulated at alpha / K, K
the claims in the family) the pipeline must find "A lower" in >= 80 % of replicates.

All B replicates run as one batch of numpy arrays: seconds for a whole study at B = 2000.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from normlab.launch.stats import statistics as st
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts.results_table import Cell

B_DEFAULT = 2000


def fpr_threshold(alpha: float = st.ALPHA, b: int = B_DEFAULT) -> float:
    """alpha + 2 sqrt(alpha (1 - alpha) / B): 0.0597 at alpha 0.05, B 2000."""
    return alpha + 2 * math.sqrt(alpha * (1 - alpha) / b)


@dataclass
class AAResult:
    recipe: str
    size: str
    n: int  # seeds per arm
    replicates: int
    fpr: float  # empirical residual vectors
    fpr_gaussian: float  # Gaussian residuals at the pooled SD
    threshold: float
    seconds: float
    no_test: float = 0.0  # share of replicates where an arm drew one seed-run n times (no test)

    @property
    def passed(self) -> bool:
        return self.fpr <= self.threshold and self.fpr_gaussian <= self.threshold


def statistics_for(plateau: float | None) -> tuple[str, ...]:
    return vc.STATISTICS if plateau is not None else (vc.LOSS, vc.SENS)


def directional_share(
    xa: np.ndarray,
    xb: np.ndarray,
    plateau: float | None,
    loss_margin: float,
    alpha: float,
    units: tuple[np.ndarray, np.ndarray] | None = None,
) -> float:
    """Share of the batch (B, n, G) of studies where the family gives any directional verdict.
    `units`: which residual vector each drawn seed is (cross-fitting leaves out its copies)."""
    p3 = np.stack(
        [vc.claim_p3(s, xa, xb, plateau, loss_margin, units) for s in statistics_for(plateau)],
        axis=-2,
    )
    codes, _ = vc.decide_family(p3, alpha)
    return float(((codes == 0) | (codes == 1)).any(axis=-1).mean())


def simulate_aa(
    cell: Cell,
    n: int | None = None,
    replicates: int = B_DEFAULT,
    plateau: float | None = None,
    loss_margin: float = vc.LOSS_MARGIN,
    alpha: float = st.ALPHA,
    seed: int = 0,
) -> AAResult:
    """The A/A test of one cell with n seeds per arm (default: the cell's own n)."""
    start = time.perf_counter()
    k = cell.n
    if k < 2 or not cell.usable:
        raise ValueError(f"{cell.recipe}: the A/A test needs >= 2 seed-runs and a known l_0")
    n = n or k
    rng = np.random.default_rng(seed)
    x = cell.loss
    mu = x.mean(axis=0)
    resid = (x - mu) * math.sqrt(k / (k - 1))
    idx = rng.integers(0, k, size=(replicates, 2 * n))
    curves = mu + resid[idx]
    if math.isfinite(cell.l0):
        curves = np.where(cell.failed[idx], cell.l0, np.minimum(curves, cell.l0))
    units = (idx[:, :n], idx[:, n:])
    one_run = (idx[:, :n] == idx[:, :1]).all(axis=1) | (idx[:, n:] == idx[:, n : n + 1]).all(axis=1)
    fpr = directional_share(curves[:, :n], curves[:, n:], plateau, loss_margin, alpha, units)
    sd = math.sqrt(float(x.var(axis=0, ddof=1).mean()))
    gauss = mu + rng.normal(0.0, sd, size=(replicates, 2 * n, x.shape[1]))
    fpr_g = directional_share(gauss[:, :n], gauss[:, n:], plateau, loss_margin, alpha)
    return AAResult(
        cell.recipe,
        cell.size,
        n,
        replicates,
        fpr,
        fpr_g,
        fpr_threshold(alpha, replicates),
        time.perf_counter() - start,
        float(one_run.mean()),
    )


def aa_study(
    cells: dict[tuple[str, str], Cell],
    replicates: int = B_DEFAULT,
    plateau: float | None = None,
    loss_margin: float = vc.LOSS_MARGIN,
    alpha: float = st.ALPHA,
) -> list[AAResult]:
    """Every cell with >= 2 seeds and a known l_0, at every seed count the study used up to the
    cell's own. A cell's k residual vectors stand for k seed-runs: n > k draws from them make a
    world of k atoms, where most arms repeat one vector and Welch's spread is too small (the
    fp8 study's 3-seed HybridNorm cells drawn at 8: FPR 0.08, Gaussian at the same spread 0.0),
    which says nothing about n fresh seeds of the recipe."""
    ns = sorted({c.n for c in cells.values() if c.n >= 2})
    return [
        simulate_aa(c, n, replicates, plateau, loss_margin, alpha, seed=i)
        for i, c in enumerate(cells.values())
        if c.n >= 2 and c.usable
        for n in ns
        if n <= c.n
    ]


@dataclass
class PowerResult:
    n: int  # seeds per arm the calculator named
    power: float  # share of replicates with claim (a) = a_lower
    delta: float
    sd: float


def power_check(
    sd: float = 0.1,
    loss_margin: float = vc.LOSS_MARGIN,
    effect_sds: float = 3.0,
    replicates: int = B_DEFAULT,
    grid: int = 7,
    plateau: float | None = None,
    alpha: float = st.ALPHA,
    seed: int = 0,
) -> PowerResult:
    """A true difference of margin + effect_sds * sd on a peaked curve (1 nat per grid step away
    from the optimum, so the selection is right): the share found 'A lower' at the n the
    calculator names for claim (a) at alpha / K (launch.verdicts.power, told this world)."""
    from normlab.launch.verdicts.power import ArmModel, seeds_for_models

    k = len(statistics_for(plateau))
    delta = loss_margin + effect_sds * sd
    mu = 4.0 + np.abs(np.arange(grid) - grid // 2).astype(float)
    arm = ArmModel.stated(sd, mu)
    n = seeds_for_models([(arm, arm)], -delta, loss_margin, alpha / k)
    assert n is not None
    rng = np.random.default_rng(seed)
    xa = mu + rng.normal(0.0, sd, size=(replicates, n, grid))
    xb = mu + delta + rng.normal(0.0, sd, size=(replicates, n, grid))
    p3 = np.stack(
        [vc.claim_p3(s, xa, xb, plateau, loss_margin) for s in statistics_for(plateau)], axis=-2
    )
    codes, _ = vc.decide_family(p3, alpha)
    return PowerResult(n, float((codes[:, 0] == 0).mean()), delta, sd)
