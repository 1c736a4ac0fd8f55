"""Claim (a)'s seed count delivers the power it prints (issue 49 item 2, SCIENCE.md 22.5).

The calculator (launch.verdicts.power) is given a true world (curves and seed noise); the test
then simulates, with its own random numbers and through the verdict's own code
(family.claim_p3, statistics.outcome_from_p), how often the verdict finds the true difference at
the seed count the calculator printed. That share must be >= 0.8 up to Monte-Carlo error
(conservatively: 0.8 minus 2.33 binomial standard errors, one-sided 1 %). The noncentral-t count
that the calculator replaces is checked to fall short where the issue measured it did.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from normlab.launch.stats import statistics as st
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts import power as pw
from normlab.launch.verdicts.decide import Claim, decide
from normlab.launch.verdicts.report import line
from normlab.launch.verdicts.results_table import build_cells, read_results
from scipy import stats

from tests.launch.verdicts.tables import rows_of, write_table

PEAKED = np.array([6.1, 5.3, 4.7, 4.4, 4.5, 5.4, 6.9])  # tests/.../test_aa_simulation's curve
MILD = np.array([4.9, 4.6, 4.45, 4.4, 4.5, 4.7, 5.1])  # a shallow optimum: selection errs
LEVEL = 0.05 / 3  # Holm's first level over three claims
CHECK = 4000  # replicate studies of the delivered-power check


def delivered(
    curve: np.ndarray, sd: float, shared: float, delta: float, n: int, seed: int
) -> float:
    """Share of CHECK studies (n seeds per arm; seed noise = a per-seed shift of SD `shared` plus
    independent per-lr noise of SD `sd`; B's curve = A's - delta) in which the verdict's code
    finds delta: its direction beyond the margin, or equivalence within it."""
    rng = np.random.default_rng(seed)

    def arm(shift: float) -> np.ndarray:
        common = rng.normal(0.0, shared, size=(CHECK, n, 1))
        return curve + shift + common + rng.normal(0.0, sd, size=(CHECK, n, len(curve)))

    xa, xb = arm(0.0), arm(-delta)
    codes = st.outcome_from_p(vc.claim_p3(vc.LOSS, xa, xb, None, vc.LOSS_MARGIN), LEVEL)
    want = 0 if delta < -vc.LOSS_MARGIN else 1 if delta > vc.LOSS_MARGIN else 2
    return float((codes == want).mean())


def tolerance(p: float = st.POWER, b: int = CHECK) -> float:
    return 2.326 * math.sqrt(p * (1 - p) / b)


def truth(curve: np.ndarray, sd: float, shared: float) -> pw.ArmModel:
    """The world of `delivered` as the calculator's model: factor rows = the shared shift (all
    lrs) and one independent row per lr."""
    factor = np.vstack([np.full((1, len(curve)), shared), np.eye(len(curve)) * sd])
    return pw.ArmModel(curve.astype(float), factor)


@pytest.mark.parametrize(
    ("curve", "sd", "shared", "delta"),
    [
        (PEAKED, 0.1, 0.0, -0.5),  # the noncentral t names 3 here and delivers about 0.5
        (PEAKED, 0.05, 0.05, 0.3),  # correlated seed noise, B higher
        (MILD, 0.05, 0.0, -0.3),  # a shallow optimum: the lr is often mis-selected
        (MILD, 0.03, 0.03, 0.0),  # equivalence (TOST) at a true difference of 0
    ],
)
def test_printed_seed_count_delivers_its_power(
    curve: np.ndarray, sd: float, shared: float, delta: float
) -> None:
    arm = truth(curve, sd, shared)
    k = pw.seeds_for_models([(arm, arm)], delta, vc.LOSS_MARGIN, LEVEL)
    assert k is not None and 2 <= k <= 16, k
    power = delivered(curve, sd, shared, delta, k, seed=12345)
    assert power >= st.POWER - tolerance(), (k, power)
    # the count is the smallest: one seed fewer falls short of the bound the calculator requires
    hits, reps = (
        pw.simulated_power(arm, arm, delta, k - 1, vc.LOSS_MARGIN, LEVEL) if k > 2 else (0, 1)
    )
    assert pw.lower_bound(hits, reps) < st.POWER


def test_the_noncentral_t_count_falls_short() -> None:
    """Issue 49: the noncentral t at the per-seed SD names too few seeds for claim (a) (the
    jackknife interval is wider than the SD of the difference it estimates)."""
    old = st.seeds_needed(-0.5, 0.1, vc.LOSS_MARGIN, LEVEL)
    assert old is not None
    assert delivered(PEAKED, 0.1, 0.0, -0.5, old, seed=7) < st.POWER - tolerance()


def test_fast_jackknife_is_the_verdicts_jackknife() -> None:
    """power.loss_claim_p3 (the simulation's fast path) gives family.claim_p3's p-values, ties at
    l_0 included."""
    rng = np.random.default_rng(3)
    for n in (2, 3, 5, 8):
        xa = np.minimum(rng.normal(5.0, 0.5, size=(300, n, 5)), 5.4)  # capped: ties at l_0
        xb = rng.normal(5.0, 0.5, size=(300, n, 5))
        if n >= 3:
            np.testing.assert_allclose(pw.jackknife_var(xa), vc.jackknife_var(xa), rtol=1e-10)
        np.testing.assert_allclose(
            pw.loss_claim_p3(xa, xb, 0.1), vc.claim_p3(vc.LOSS, xa, xb, None, 0.1), atol=1e-12
        )


def test_lower_bound_is_clopper_pearson() -> None:
    for hits, b in ((1640, 2000), (0, 500), (500, 500)):
        ci = stats.binomtest(hits, b).proportion_ci(confidence_level=0.90, method="exact")
        assert pw.lower_bound(hits, b) == pytest.approx(ci.low, abs=1e-12)


def test_search_finds_the_smallest_passing_count() -> None:
    for answer in (2, 3, 7, 20, 64):
        for start in (2, 5, 30, 64):
            calls: list[int] = []

            def passes(n: int, answer: int = answer, calls: list[int] = calls) -> bool:
                calls.append(n)
                return n >= answer

            assert pw.smallest_n(passes, start) == answer
            assert len(calls) <= 16
    assert pw.smallest_n(lambda n: False, 5) is None


def test_deterministic_and_none_at_the_margin() -> None:
    arm = truth(MILD, 0.05, 0.0)
    first = pw.seeds_for_models([(arm, arm)], -0.3, 0.1, LEVEL)
    assert first == pw.seeds_for_models([(arm, arm)], -0.3, 0.1, LEVEL)
    assert pw.seeds_for_models([(arm, arm)], -0.1, 0.1, LEVEL) is None  # |delta| == m


@pytest.fixture(scope="module")
def pilot(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two recipes, 3 seeds each on a 7-point grid, B higher by 0.5 nats: inconclusive at n 3."""
    rng = np.random.default_rng(11)
    rows = []
    for recipe, shift in (("A", 0.0), ("B", 0.5)):
        x = PEAKED + shift + rng.normal(0.0, 0.1, size=(3, 7)) + rng.normal(0, 0.05, (3, 1))
        rows += rows_of(recipe, x)
    path = write_table(tmp_path_factory.mktemp("power") / "pilot.csv", rows)
    return build_cells(read_results(path))


def test_inconclusive_verdict_prints_the_simulated_count_and_what_to_run(pilot: dict) -> None:
    claim = [v for v in decide(pilot) if v.statistic == vc.LOSS][0]
    assert claim.verdict == st.INCONCLUSIVE
    ca, cb = pilot[("A", "-")], pilot[("B", "-")]
    k = pw.seeds_for_cells(ca, cb, claim.delta, claim.margin, claim.level)
    assert k is not None and claim.seeds_needed == max(k, 4)
    assert claim.note == (
        f"needs {claim.seeds_needed} seeds per arm for 80% power (simulated) at the observed "
        f"difference and spread: {claim.seeds_needed - 3} more seed-runs of A and "
        f"{claim.seeds_needed - 3} of B, each at every lr 0.0003, 0.001, 0.003, 0.01, 0.03, "
        "0.1, 0.3"
    )
    # at the printed count, both of the calculator's noise models deliver the power (fresh
    # random numbers, the verdict's own code path)
    for model in (pw.ArmModel.correlated, pw.ArmModel.independent):
        a, b = model(ca), model(cb)
        hits, reps = pw.simulated_power(
            a, b, claim.delta, claim.seeds_needed, claim.margin, claim.level, CHECK, seed=99
        )
        assert hits / reps >= st.POWER - tolerance(), (model, hits / reps)


def test_directional_verdict_says_lower_by_more_than_the_margin(tmp_path: Path) -> None:
    x = np.array([PEAKED + d for d in (0.0, 0.02, -0.02, 0.01)])
    rows = rows_of("A", x) + rows_of("B", x + 0.6)
    cells = build_cells(read_results(write_table(tmp_path / "t.csv", rows)))
    (claim,) = decide(cells, [Claim("A", "B", vc.LOSS)])
    assert claim.verdict == st.A_LOWER
    assert claim.meaning == "A lower than B by more than 0.1 nats"
    assert ": A lower (A lower than B by more than 0.1 nats): " in line(claim)


def test_curtailed_search_answers_as_the_full_simulation() -> None:
    """`reaches` stops a seed count's studies once the rest cannot change the answer; over
    counts on both sides of 80 % power and every outcome kind it answers as the lower bound on
    all of `simulated_power`'s studies does, and `hits_needed` is the bound's inverse."""
    for reps, target in ((2000, 0.8), (500, 0.8), (700, 0.9), (10, 0.8)):
        need = pw.hits_needed(reps, target)
        if need <= reps:
            assert pw.lower_bound(need, reps) >= target
        assert need == 0 or pw.lower_bound(need - 1, reps) < target
    arm = truth(PEAKED, 0.1, 0.03)
    mild = truth(MILD, 0.05, 0.0)
    answers = set()
    for a, delta in ((arm, -0.5), (arm, 0.3), (mild, -0.3), (mild, 0.0), (arm, 0.1)):
        for n in (2, 3, 4, 6, 9):
            for reps in (2000, 333):
                hits, _ = pw.simulated_power(a, a, delta, n, vc.LOSS_MARGIN, LEVEL, reps, seed=5)
                full = pw.lower_bound(hits, reps) >= st.POWER
                fast = pw.reaches(a, a, delta, n, vc.LOSS_MARGIN, LEVEL, st.POWER, reps, seed=5)
                assert fast == full, (delta, n, reps, hits)
                answers.add(full)
    assert answers == {True, False}  # counts on both sides of the target
