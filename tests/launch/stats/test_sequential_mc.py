"""Beyond the exact count: the sequential Monte-Carlo permutation p (Besag and Clifford 1991)
against the exact one (scipy.stats.permutation_test enumerating every relabelling, and the
verdicts' own enumeration for the cross-fitted claim (a)) within its stated MC error; the
stopping rule itself; the trained range's counted tails and its interval beyond enumeration
against the enumerated ones; the seed search against a linear search."""

from __future__ import annotations

import math

import numpy as np
import pytest
from normlab.launch.stats import sequential_mc as smc
from normlab.launch.stats import statistics as st
from normlab.launch.stats.permutation_counts import (
    cumulative_tails,
    integer_interval,
    integer_tails,
)
from normlab.launch.verdicts import decide as dc
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts.permutation_mc import mc_min_p
from scipy import stats

MC_SIGMAS = 4.0  # |MC p - exact p| allowed, in stated MC standard errors


def _mean_hits(a: np.ndarray, b: np.ndarray):
    pooled, na = np.concatenate([a, b]), a.size
    obs = a.mean() - b.mean()

    def hits(mask: np.ndarray) -> np.ndarray:
        d = (mask @ pooled) / na - ((~mask) @ pooled) / b.size
        return np.stack([d <= obs + 1e-12, d >= obs - 1e-12], axis=1)

    return hits


@pytest.mark.parametrize("case", range(6))
def test_sequential_p_agrees_with_scipy_exact_within_its_mc_error(case: int) -> None:
    rng = np.random.default_rng(case)
    a, b = rng.normal(0.4 * (case % 3), 1.0, 7), rng.normal(0.0, 1.0, 8)
    less, greater = smc.sequential_p(_mean_hits(a, b), 15, 7, seed=case)
    for got, alt in ((less, "less"), (greater, "greater")):
        ref = stats.permutation_test(
            (a, b), lambda x, y: x.mean() - y.mean(), permutation_type="independent",
            alternative=alt, n_resamples=np.inf,
        ).pvalue  # fmt: skip
        assert abs(got.p - ref) <= MC_SIGMAS * got.se + 1.0 / (got.draws + 1), (alt, got, ref)


def test_stopping_rule_and_its_standard_errors() -> None:
    rng = np.random.default_rng(7)
    same = smc.sequential_p(_mean_hits(rng.normal(0, 1, 20), rng.normal(0, 1, 20)), 40, 20)
    for tail in same:  # a null effect: both tails stop early at H exceedances, p = H / L
        assert tail.stopped_early and tail.p == smc.EXCEEDANCES / tail.draws
        assert tail.se == pytest.approx(tail.p * math.sqrt((1 - tail.p) / smc.EXCEEDANCES))
    far = smc.sequential_p(_mean_hits(np.full(20, 5.0) + rng.normal(0, 0.1, 20),
                                      rng.normal(0, 0.1, 20)), 40, 20)  # fmt: skip
    low = far[1]  # A far above B: no relabelling reaches it, all N drawn, p = 1 / (N + 1)
    assert not low.stopped_early and low.draws == smc.RESAMPLES
    assert low.p == 1 / (smc.RESAMPLES + 1)
    assert low.se == pytest.approx(math.sqrt(low.p * (1 - low.p) / (smc.RESAMPLES + 1)))


@pytest.mark.parametrize(("statistic", "seeds"), [(vc.LOSS, 7), (vc.SENS, 6)])
def test_claim_permutation_p_agrees_with_the_enumeration(statistic: str, seeds: int) -> None:
    rng = np.random.default_rng(seeds)
    g = np.arange(6)
    xa = 3.0 + 0.02 * (g - 2) ** 2 + rng.normal(0, 0.08, (seeds, 6))
    xb = 3.02 + 0.02 * (g - 3) ** 2 + rng.normal(0, 0.08, (seeds, 6))
    a, b = vc.per_seed(statistic, xa), vc.per_seed(statistic, xb)
    exact = dc._permutation_min_p(statistic, xa, xb, a, b, 0.05)  # every relabelling
    got = mc_min_p(statistic, xa, xb, 0.05)
    assert abs(got.p - exact) <= MC_SIGMAS * got.se + 1.0 / (got.draws + 1), (got, exact)


@pytest.mark.parametrize(("na", "nb"), [(4, 5), (7, 7), (3, 11), (9, 6)])
def test_range_tails_and_interval_beyond_enumeration_match_the_exact_ones(na, nb) -> None:
    rng = np.random.default_rng(na * 31 + nb)
    for case in range(5):
        a = rng.integers(0, 9, na).astype(float)
        b = rng.integers(1, 11, nb).astype(float)
        want = integer_tails(a, b, vc.RANGE_MARGIN, st.TOL)
        np.testing.assert_allclose(cumulative_tails(a, b, vc.RANGE_MARGIN, st.TOL), want,
                                   rtol=1e-12, atol=0)  # fmt: skip
        if case < 2 and math.comb(na + nb, na) <= st.EXACT_LIMIT:  # bisection, enumerated
            for alpha in (0.01, 0.05, 0.2):
                np.testing.assert_allclose(
                    integer_interval(a, b, alpha), st.permutation_interval(a, b, alpha), atol=1e-6
                )


def test_seed_search_is_the_smallest_n_a_linear_search_finds() -> None:
    rng = np.random.default_rng(3)
    for _ in range(25):
        delta, sd = rng.uniform(-0.09, 0.09), rng.uniform(0.02, 0.2)
        alpha = float(rng.choice([0.05, 0.005]))

        def power(n: int, d=delta, s=sd, a=alpha) -> float:
            return st.tost_power(n, d, s, 0.1, a)

        got = st.search_seeds(power, 0.8, 2)
        linear = next((n for n in range(2, min(got or 400, 400) + 1) if power(n) >= 0.8), None)
        assert got == linear or (got is not None and got > 400 and linear is None)
