"""Group-sequential boundaries against published constants, scipy's multivariate normal and
simulation (launch/stats/group_sequential.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from normlab.launch.errors import ConfigError
from normlab.launch.stats import group_sequential as gs
from scipy import stats

# Jennison & Turnbull (2000), Table 2.1 (Pocock C_P) and Table 2.3 (O'Brien-Fleming C_B),
# two-sided alpha 0.05, K equally spaced looks
POCOCK_CP = {2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413}
OBF_CB = {2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040}
# Lan-DeMets spending, K = 5 equally spaced, two-sided 0.05 (DeMets & Lan 1994, Stat Med 13,
# Table I; the same in gsDesign's sfLDOF/sfLDPocock)
LD_OBF5 = [4.877, 3.357, 2.680, 2.290, 2.031]
LD_POCOCK5 = [2.438, 2.427, 2.410, 2.397, 2.386]


@pytest.mark.parametrize("k", sorted(POCOCK_CP))
def test_classical_constants_match_jennison_turnbull(k: int) -> None:
    assert gs.classical_constant(k, 0.05, gs.POCOCK) == pytest.approx(POCOCK_CP[k], abs=6e-4)
    assert gs.classical_constant(k, 0.05, gs.OBRIEN_FLEMING) == pytest.approx(OBF_CB[k], abs=6e-4)


def test_lan_demets_boundaries_match_published() -> None:
    t = np.arange(1, 6) / 5
    np.testing.assert_allclose(gs.boundaries(t, 0.05, gs.OBRIEN_FLEMING, 2), LD_OBF5, atol=6e-4)
    np.testing.assert_allclose(gs.boundaries(t, 0.05, gs.POCOCK, 2), LD_POCOCK5, atol=6e-4)
    # one-sided at alpha/2 gives the same boundaries to the precision tabled (the lower side's
    # crossings are negligible)
    np.testing.assert_allclose(gs.boundaries(t, 0.025, gs.OBRIEN_FLEMING, 1), LD_OBF5, atol=6e-4)


@pytest.mark.parametrize("spending", gs.SPENDING)
def test_crossings_spend_the_function_and_match_scipy(spending: str) -> None:
    t = np.array([0.25, 0.6, 1.0])
    alpha = 0.025
    z = gs.boundaries(t, alpha, spending)
    spent = np.array([gs.spent(spending, x, alpha) for x in t])
    cross = gs.crossing_probabilities(z, t)
    np.testing.assert_allclose(np.cumsum(cross), spent, rtol=1e-7, atol=1e-12)
    # the same probabilities from scipy's multivariate normal of (Z_1, Z_2, Z_3),
    # corr(Z_i, Z_j) = sqrt(t_i / t_j)
    corr = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    no_cross = [
        stats.multivariate_normal.cdf(z[:k], np.zeros(k), corr[:k, :k], abseps=1e-8, releps=0)
        for k in (2, 3)
    ]
    assert 1 - no_cross[-1] == pytest.approx(alpha, abs=2e-6)
    assert float(stats.norm.cdf(z[0])) - no_cross[0] == pytest.approx(cross[1], abs=2e-6)


@pytest.mark.parametrize("spending", gs.SPENDING)
def test_type_one_error_by_simulation(spending: str) -> None:
    """Brownian motion in information time under H0: the plan rejects at rate alpha, and reading
    every look at the full level does not."""
    rng = np.random.default_rng(49)
    t = np.array([0.25, 0.5, 1.0])
    alpha, reps = 0.025, 400_000
    steps = rng.standard_normal((reps, 3)) * np.sqrt(np.diff(t, prepend=0.0))
    z = np.cumsum(steps, axis=1) / np.sqrt(t)
    rate = (z >= gs.boundaries(t, alpha, spending)).any(axis=1).mean()
    se = math.sqrt(alpha * (1 - alpha) / reps)
    assert abs(rate - alpha) < 4 * se
    assert (z >= stats.norm.isf(alpha)).any(axis=1).mean() > alpha + 20 * se  # uncorrected


def test_two_looks_at_the_full_level_inflate_alpha() -> None:
    """Looks at information 1/4 and 1, each at one-sided 0.025 (docs/SCIENCE.md 22.8 quotes it):
    the error is 1 - P(Z_1 < z, Z_2 < z), corr 1/2, from the integration and from scipy."""
    z = stats.norm.isf(0.025)
    found = gs.crossing_probabilities(np.array([z, z]), np.array([0.25, 1.0])).sum()
    ref = 1 - stats.multivariate_normal.cdf([z, z], np.zeros(2), [[1.0, 0.5], [0.5, 1.0]])
    assert found == pytest.approx(ref, abs=1e-7)
    assert round(found, 3) == 0.045


def test_t_looks_by_significance_level_hold_alpha() -> None:
    """The transfer study's looks (one-sample t at n 2, then n 8), each read at its Pocock-type
    nominal level on its own df (Jennison & Turnbull 3.8): type I error near alpha; at the
    uncorrected level each look it is well above."""
    rng = np.random.default_rng(7)
    reps, alpha = 200_000, 0.025
    x = rng.standard_normal((reps, 8))
    plan = gs.Plan(gs.POCOCK, (2, 8))
    levels = [gs.nominal_level(alpha, gs.look_at(plan, n)) for n in (2, 8)]

    def p_at(n: int) -> np.ndarray:
        d = x[:, :n]
        tstat = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
        return stats.t.sf(tstat, n - 1)

    p2, p8 = p_at(2), p_at(8)
    rate = ((p2 <= levels[0]) | (p8 <= levels[1])).mean()
    se = math.sqrt(alpha * (1 - alpha) / reps)
    assert abs(rate - alpha) < 4 * se
    assert ((p2 <= alpha) | (p8 <= alpha)).mean() > alpha + 10 * se


def test_looks_planned_unplanned_and_past_the_plan() -> None:
    plan = gs.Plan(gs.POCOCK, (3, 8))
    first, last = gs.look_at(plan, 3), gs.look_at(plan, 8, 8)
    assert first.fractions == (3 / 8,) and last.fractions == (3 / 8, 1.0)
    assert not first.note and not last.note and last.index == 2
    # the last look's level is the second boundary of the plan
    z = gs.boundaries([3 / 8, 1.0], 0.01, gs.POCOCK)
    assert gs.nominal_level(0.01, last) == pytest.approx(stats.norm.sf(z[1]), rel=1e-12)
    assert gs.nominal_level(0.01, None) == 0.01
    mid = gs.look_at(plan, 5)
    assert mid.fractions == (3 / 8, 5 / 8) and "not a planned look" in mid.note
    past = gs.look_at(plan, 9)
    assert gs.nominal_level(0.05, past) == 0.0 and "no alpha is left" in past.note
    # unequal arms: the harmonic mean is the information
    assert gs.look_at(plan, 4, 12).n == pytest.approx(6.0)
    late = gs.look_at(gs.Plan(gs.POCOCK, (2, 8), registered=False), 8)
    assert "without a pre-registered plan" in late.note and "recorded after" in late.words()


def test_sequential_p_inverts_the_nominal_level() -> None:
    look = gs.look_at(gs.Plan(gs.POCOCK, (2, 8)), 8)
    q = gs.sequential_p(0.01, look, 0.05)
    assert 0.01 < q < 0.05
    assert gs.nominal_level(q, look) == pytest.approx(0.01, rel=1e-8)
    assert gs.sequential_p(0.04, look, 0.05) > 1.0  # cannot reject at any Holm step of 0.05
    assert gs.sequential_p(0.03, None, 0.05) == 0.03


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([2, 8], "mapping"),
        ({"spending": "pocock", "seeds": [2, 8], "when": 1}, "unknown key 'looks.when'"),
        ({"spending": "haybittle", "seeds": [2, 8]}, "looks.spending must be one of"),
        ({"spending": "pocock", "seeds": [8, 2]}, "increasing"),
        ({"spending": "pocock", "seeds": [8]}, "increasing"),
        ({"spending": "pocock", "seeds": [1, 8]}, "each >= 2"),
        ({"spending": "pocock", "seeds": [2, 8], "registered": "no"}, "true or false"),
    ],
)
def test_plan_from_data_refuses_in_one_line(value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        gs.plan_from_data(value, "x.yaml: ")
    assert "\n" not in str(err.value) and str(err.value).startswith("x.yaml: ")


def test_plan_from_data() -> None:
    plan = gs.plan_from_data({"spending": "obrien_fleming", "seeds": [3, 8], "registered": False})
    assert plan == gs.Plan(gs.OBRIEN_FLEMING, (3, 8), False)
