"""statistics.py against scipy and the tables of SCIENCE.md 22.3 and 22.5."""

from __future__ import annotations

import math

import numpy as np
import pytest
from normlab.launch.stats import statistics as st
from scipy import stats

SAMPLES = [
    (np.array([5.1, 5.3, 5.0]), np.array([5.6, 5.2, 5.9, 6.1])),
    (np.array([2.0, 2.4]), np.array([2.1, 2.2, 2.0, 2.5, 2.3])),
    (np.array([0.3, 0.1, 0.4, 0.15, 0.2]), np.array([0.9, 0.2])),
]


@pytest.mark.parametrize("a, b", SAMPLES)
def test_welch_matches_scipy(a: np.ndarray, b: np.ndarray) -> None:
    w = st.welch(a, b)
    for bound in (0.0, -0.1, 0.1):
        less = stats.ttest_ind(a - bound, b, equal_var=False, alternative="less")
        greater = stats.ttest_ind(a - bound, b, equal_var=False, alternative="greater")
        assert float(w.p_below(bound)) == pytest.approx(less.pvalue, rel=1e-10)
        assert float(w.p_above(bound)) == pytest.approx(greater.pvalue, rel=1e-10)
        assert float(w.df) == pytest.approx(less.df, rel=1e-10)
    for alpha in (0.05, 0.0167, 0.025):
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(1 - 2 * alpha)
        lo, hi = w.interval(alpha)
        assert (float(lo), float(hi)) == pytest.approx((ci.low, ci.high), rel=1e-10)


def test_welch_batches_and_zero_spread() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(50, 3)), rng.normal(size=(50, 4))
    batch = st.welch(a, b).p_below(0.0)
    one = [
        stats.ttest_ind(x, y, equal_var=False, alternative="less").pvalue
        for x, y in zip(a, b, strict=True)
    ]
    np.testing.assert_allclose(batch, one, rtol=1e-9)
    w = st.welch(np.array([1.0, 1.0]), np.array([3.0, 3.0]))  # no seed spread: no test
    assert float(w.p_below(0.0)) == 1.0 and float(w.p_above(0.0)) == 1.0
    assert w.interval(0.05) == (-math.inf, math.inf)


def test_interval_rows_agree_with_pvalues() -> None:
    """hi < -m exactly when the one-sided p of H0 delta >= -m is below alpha (22.3)."""
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 0.1, size=(4000, 3)), rng.normal(0.15, 0.1, size=(4000, 3))
    w, m, alpha = st.welch(a, b), 0.1, 0.0167
    lo, hi = w.interval(alpha)
    by_interval = np.array(
        [st.OUTCOMES.index(st.outcome(x, y, m)) for x, y in zip(lo, hi, strict=True)]
    )
    by_p = st.outcome_from_p(st.margin_pvalues(w.p_below, w.p_above, m), alpha)
    np.testing.assert_array_equal(by_interval, by_p)
    assert set(by_p.tolist()) >= {0, 3}  # both A lower and inconclusive occur


def test_outcome_rows() -> None:
    assert st.outcome(-0.5, -0.2, 0.1) == st.A_LOWER
    assert st.outcome(0.2, 0.5, 0.1) == st.B_LOWER
    assert st.outcome(-0.05, 0.08, 0.1) == st.EQUIVALENT
    assert st.outcome(-0.3, 0.05, 0.1) == st.INCONCLUSIVE


@pytest.mark.parametrize(
    "n, one, two",
    [
        (2, 0.1667, 0.333),
        (3, 0.05, 0.1),
        (4, 0.0143, 0.0286),
        (5, 0.00397, 0.00794),
        (6, 0.00108, 0.00216),
        (8, 7.8e-5, 1.6e-4),
    ],
)
def test_permutation_floor_table(n: int, one: float, two: float) -> None:
    # the table rounds to 2-3 significant figures (1.554e-4 shows as 1.6e-4)
    assert st.permutation_floor(n, n) == pytest.approx(one, rel=0.035)
    assert st.permutation_floor(n, n, sided=2) == pytest.approx(two, rel=0.035)
    assert st.permutation_floor(n, n) == 1 / math.comb(2 * n, n)
    # the test reaches its floor on fully separated data
    a, b = np.arange(n, dtype=float), np.arange(n, dtype=float) + 100
    assert st.shifted_permutation_p(a, b, 0.0, lower=True) == pytest.approx(1 / math.comb(2 * n, n))


def test_floor_needs_n4_one_sided_n5_two_sided_at_holm_level() -> None:
    assert st.permutation_floor_n(0.05 / 3) == 4
    assert st.permutation_floor_n(0.05 / 3, sided=2) == 5


def test_permutation_matches_scipy_exact() -> None:
    a, b = np.array([5.1, 5.3, 5.0, 4.8]), np.array([5.6, 5.2, 5.9, 6.1, 5.5])

    def diff(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    for shift in (0.0, -0.1, 0.1):
        for lower, alt in ((True, "less"), (False, "greater")):
            ref = stats.permutation_test(
                (a - shift, b),
                diff,
                permutation_type="independent",
                alternative=alt,
                n_resamples=np.inf,
                vectorized=True,
            )
            assert st.shifted_permutation_p(a, b, shift, lower) == pytest.approx(ref.pvalue)


def test_permutation_interval_inverts_the_test() -> None:
    a, b = np.array([1.0, 1.2, 0.9, 1.1, 1.0]), np.array([2.0, 2.3, 1.8, 2.1, 2.2])
    lo, hi = st.permutation_interval(a, b, 0.025)
    assert lo < a.mean() - b.mean() < hi
    assert st.shifted_permutation_p(a, b, hi + 1e-6, lower=True) <= 0.025
    assert st.shifted_permutation_p(a, b, hi - 1e-3, lower=True) > 0.025
    assert st.shifted_permutation_p(a, b, lo - 1e-6, lower=False) <= 0.025
    assert st.permutation_interval(a[:2], b[:2], 0.05) == (-math.inf, math.inf)  # floor 1/6


def test_holm_hand_example() -> None:
    # sorted: 0.005 <= .05/4, 0.01 <= .05/3, 0.03 > .05/2: stop; 0.04 not rejected either
    rejected, level = st.holm(np.array([0.01, 0.04, 0.03, 0.005]))
    assert rejected.tolist() == [True, False, False, True]
    np.testing.assert_allclose(level, [0.05 / 3, 0.025, 0.025, 0.0125])
    rejected, _ = st.holm(np.array([0.001, 0.02, 0.04]))  # .001<=.0167, .02<=.025, .04<=.05
    assert rejected.tolist() == [True, True, True]
    rejected, _ = st.holm(np.array([0.02, 0.001, 0.001]))  # .02 > .05 / 1? no: .02 <= .05
    assert rejected.tolist() == [True, True, True]
    rejected, _ = st.holm(np.array([0.03, 0.001, 0.002]))  # 0.03 > 0.05/1? no -> all
    assert rejected.all()
    rejected, _ = st.holm(np.array([0.02, 0.018, 0.5]))  # .018 > .0167: nothing
    assert not rejected.any()


def test_benjamini_hochberg_hand_example() -> None:
    # m = 5, q .05: thresholds .01 .02 .03 .04 .05; largest j with p_(j) <= q j/m is j = 3
    p = np.array([0.045, 0.001, 0.5, 0.025, 0.019])
    assert st.benjamini_hochberg(p).tolist() == [False, True, False, True, True]
    # step-up: p_(1) = .015 > .05/4 but p_(3) = .03 <= .05*3/4, so the three smallest go
    assert st.benjamini_hochberg(np.array([0.015, 0.016, 0.03, 0.9])).tolist() == [
        True,
        True,
        True,
        False,
    ]


def test_seed_table_of_22_5() -> None:
    ds = (0.5, 1, 1.5, 2, 2.5, 3, 4)
    assert [st.seeds_for_effect(d, 0.05) for d in ds] == [64, 17, 9, 6, 4, 4, 3]
    assert [st.seeds_for_effect(d, 0.05 / 3) for d in (1, 2, 3, 4)] == [23, 7, 5, 4]


@pytest.mark.parametrize("d", [0.5, 1.0, 1.5, 2.0])
def test_seed_count_closed_form(d: float) -> None:
    """Guenther: n ~ 2 (z + z_.8)^2 / d^2 + z^2 / 4, rounded up, within one seed (22.5)."""
    z = stats.norm.ppf(0.975)
    approx = 2 * (z + stats.norm.ppf(0.8)) ** 2 / d**2 + z**2 / 4
    assert abs(st.seeds_for_effect(d, 0.05) - math.ceil(approx)) <= 1


def test_seeds_needed_forms() -> None:
    # SCIENCE.md 22.5 example: sd 0.03, delta 0.2, m 0.1 -> d 3.3 -> 4-5 seeds at alpha' .0167
    assert st.seeds_needed(0.2, 0.03, 0.1, 0.05 / 3) in (4, 5)
    assert st.seeds_needed(-0.2, 0.03, 0.1, 0.05 / 3) == st.seeds_needed(0.2, 0.03, 0.1, 0.05 / 3)
    # plain difference = two-sided effect size form
    assert st.seeds_needed(0.3, 0.1, 0.0, 0.05) == st.seeds_for_effect(3.0, 0.05)
    # TOST at true 0: the normal formula 2 (z_{1-a} + z_{1-b/2})^2 sd^2 / m^2 within a seed
    sd, m, a = 0.05, 0.1, 0.05
    normal = 2 * (stats.norm.ppf(1 - a) + stats.norm.ppf(0.9)) ** 2 * sd**2 / m**2
    n = st.seeds_needed(0.0, sd, m, a)
    assert normal <= n <= normal + 2
    assert st.tost_power(n, 0.0, sd, m, a) >= 0.8 > st.tost_power(n - 1, 0.0, sd, m, a)
    # raised to the permutation floor
    assert st.seeds_needed(5.0, 0.1, 1.0, 0.05 / 3, permutation=True) == 4
    assert st.seeds_needed(0.1, 0.03, 0.1, 0.05) is None  # |delta| == m: never
