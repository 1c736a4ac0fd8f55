"""The family of SCIENCE.md 22.2 on hand-made tables: cross-fitting, l_0, seeds, Holm, claims."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from normlab.launch.stats import statistics as st
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts.decide import Claim, decide
from normlab.launch.verdicts.rank_flips import rank_flips
from normlab.launch.verdicts.results_table import build_cells, read_results
from scipy import stats

from tests.launch.verdicts.tables import rows_of, write_table

# recipe A, 3 seeds x 3 lrs; seed 2 diverged at the first lr (counts as l_0 = 10)
A = np.array([[3.0, 2.0, 2.5], [2.8, 2.4, 1.8], [np.nan, 2.1, 2.6]])
LRS3 = (1e-3, 1e-2, 1e-1)


def _cells(tmp_path: Path, *tables: list[dict], l0: float | None = None) -> dict:
    rows = [r for t in tables for r in t]
    return build_cells(read_results(write_table(tmp_path / "runs.csv", rows)), l0)


def test_cross_fitting_by_hand(tmp_path: Path) -> None:
    cells = _cells(tmp_path, rows_of("A", A, LRS3, status={(2, 0): "diverged"}))
    x = cells[("A", "-")].loss
    assert x[2, 0] == 10.0  # diverged = l_0
    # leave seed 0 out: mean(s1, s2) = [6.4, 2.25, 2.2] -> lr index 2 -> y0 = 2.5
    # leave seed 1 out: mean(s0, s2) = [6.5, 2.05, 2.55] -> index 1 -> y1 = 2.4
    # leave seed 2 out: mean(s0, s1) = [2.9, 2.2, 2.15] -> index 2 -> y2 = 2.6
    y, pick = vc.cross_fitted(x)
    assert pick.tolist() == [2, 1, 2]
    np.testing.assert_allclose(y, [2.5, 2.4, 2.6])
    # the naive in-sample best is lower (winner's curse): min of [5.27, 2.1667, 2.3]
    assert float(vc.naive_best(x)) == pytest.approx(6.5 / 3)
    # sensitivity per seed: mean - min, the diverged point at l_0
    np.testing.assert_allclose(vc.seed_sensitivity(x), [2.5 - 2.0, 7.0 / 3 - 1.8, 14.7 / 3 - 2.1])
    # trained width at plateau 2.6 (threshold 2.4): s0 [F T F] 1, s1 [F T T] 2, s2 [F T F] 1
    assert vc.trained_width(x, 2.6).tolist() == [1, 2, 1]


def test_loss_claim_uses_the_jackknife_of_the_cross_fitted_mean(tmp_path: Path) -> None:
    b = A.copy()
    b[2, 0] = 3.2
    b = b + 0.5
    cells = _cells(
        tmp_path, rows_of("A", A, LRS3, status={(2, 0): "diverged"}), rows_of("B", b, LRS3)
    )
    [v] = decide(cells, [Claim("A", "B", vc.LOSS)])
    # B: leave-out means: s0 out [3.7, 2.75, 2.7] -> 2; s1 out [3.6, 2.55, 3.05] -> 1;
    #    s2 out [3.4, 2.7, 2.65] -> 2
    np.testing.assert_allclose(vc.cross_fitted(cells[("B", "-")].loss)[0], [3.0, 2.9, 3.1])
    assert (v.mean_a, v.mean_b, v.delta) == pytest.approx((2.5, 3.0, -0.5))
    # jackknife of A's cross-fitted mean, each replicate cross-fitted on the two seeds left:
    # drop s0 -> (2.4 + 2.6) / 2 = 2.5; drop s1 -> (2.0 + 2.1) / 2 = 2.05; drop s2 -> 2.45
    reps = np.array([2.5, 2.05, 2.45])
    var = 2 / 3 * ((reps - reps.mean()) ** 2).sum()
    assert float(vc.jackknife_var(cells[("A", "-")].loss)) == pytest.approx(var)
    assert float(vc.jackknife_var(cells[("B", "-")].loss)) == pytest.approx(var)  # B = A + .5
    se, df = math.sqrt(2 * var), 4.0  # equal variances, n - 1 = 2 each: Welch df 4
    half = stats.t.ppf(0.95, df) * se
    assert v.level == pytest.approx(0.05)  # one claim: Holm level alpha
    assert v.interval == pytest.approx((-0.5 - half, -0.5 + half))
    assert v.p == pytest.approx(stats.t.cdf((-0.5 + 0.1) / se, df))
    assert v.verdict == st.INCONCLUSIVE and v.test == "Welch t, jackknife SE"
    # var(y) / n would have claimed "A lower": y_A = [2.5, 2.4, 2.6], y_B = y_A + 0.5
    naive = stats.ttest_ind([2.5, 2.4, 2.6], [3.0, 2.9, 3.1], equal_var=False)
    assert naive.confidence_interval(0.9).high < -0.1
    assert v.naive_a == pytest.approx(6.5 / 3) and v.best_lr_a == 1e-2


def test_cross_fitting_leaves_out_copies() -> None:
    """A/A draws may repeat a seed-run: its copies are not 'other seeds' for the selection."""
    x = np.array([[[1.0, 5.0], [3.0, 2.0], [1.0, 5.0]]])  # rows 0 and 2: the same seed-run
    y, pick = vc.cross_fitted(x, np.array([[0, 1, 0]]))
    assert pick[0].tolist() == [1, 0, 1] and y[0].tolist() == [5.0, 3.0, 5.0]
    y, _ = vc.cross_fitted(x[:, [0, 2]], np.array([[0, 0]]))
    assert np.isnan(y).all()  # no other seed-run: undefined, and no test follows


def _noisy(mu: np.ndarray, n: int, sd: float, seed: int) -> np.ndarray:
    return mu + np.random.default_rng(seed).normal(0, sd, size=(n, len(mu)))


MU = np.array([6.0, 5.2, 4.6, 4.3, 4.5, 5.5, 7.0])


def test_family_holm_and_permutation_floor(tmp_path: Path) -> None:
    cells = _cells(
        tmp_path, rows_of("A", _noisy(MU, 4, 0.02, 1)), rows_of("B", _noisy(MU + 1.1, 4, 0.02, 2))
    )
    found = decide(cells, plateau=6.0)
    assert [v.statistic for v in found] == list(vc.STATISTICS)
    loss, sens, rng = found
    assert loss.verdict == st.A_LOWER and loss.level == pytest.approx(0.05 / 3)
    assert sens.verdict == st.EQUIVALENT  # a constant shift leaves the sensitivity alone
    assert rng.test.startswith("exact permutation") and rng.verdict == st.B_LOWER
    # widths: A trains where MU <= 5.8 (5 points), B where MU + 1.1 <= 5.8 (3 points); the
    # 2-step difference beats the 1-step margin at the floor p = 1/C(8, 4)
    assert (rng.mean_a, rng.mean_b) == (5.0, 3.0)
    assert rng.p == pytest.approx(1 / 70) and rng.interval[0] > 1.0
    assert loss.p_permutation == pytest.approx(1 / 70)  # cross-fitted, every relabelling
    # two seeds: the permutation floor 1/6 cannot reach any Holm level: said so
    cells2 = _cells(
        tmp_path, rows_of("A", _noisy(MU, 2, 0.02, 1)), rows_of("B", _noisy(MU + 1.1, 2, 0.02, 2))
    )
    rng2 = decide(cells2, plateau=6.0)[2]
    assert rng2.verdict == st.INCONCLUSIVE and rng2.p == pytest.approx(1 / 6)
    need = st.permutation_floor_n(rng2.level)
    assert need in (3, 4)
    assert f"verdict impossible at n = 2: needs n >= {need} seeds per arm" in rng2.note


def test_one_seed_never_decides_and_missing_recipe_is_not_tested(tmp_path: Path) -> None:
    cells = _cells(
        tmp_path, rows_of("A", _noisy(MU, 1, 0.02, 1)), rows_of("B", _noisy(MU + 1, 3, 0.02, 2))
    )
    claims = [
        Claim("A", "B", vc.LOSS, "a_lower"),
        Claim("A", "C", vc.SENS),
        Claim("A", "B", vc.RANGE),
    ]
    loss, missing, rng = decide(cells, claims)
    assert loss.verdict == st.INCONCLUSIVE and "needs >= 2 seeds" in loss.note
    assert missing.verdict == "not_tested" and "C" in missing.note
    assert rng.verdict == "not_tested" and "--plateau" in rng.note


def test_non_finite_l0_does_not_raise(tmp_path: Path) -> None:
    rows = rows_of("A", _noisy(MU, 2, 0.02, 1), l0=math.nan, status={(0, 6): "failed"})
    rows += rows_of("B", _noisy(MU, 2, 0.02, 2), l0=math.nan)
    cells = _cells(tmp_path, rows)
    [v] = decide(cells, [Claim("A", "B", vc.SENS)])
    assert v.verdict == st.INCONCLUSIVE and "pass --l0" in v.note
    # with --l0 the failed run counts as l_0 and the claim is decided
    [v] = decide(_cells(tmp_path, rows, l0=8.0), [Claim("A", "B", vc.SENS)])
    assert math.isfinite(v.delta) and v.n_a == 2


def test_rank_flip_flagged(tmp_path: Path) -> None:
    rows = []
    for recipe, final, early in (("A", 4.0, 5.0), ("B", 4.3, 4.6)):
        x = _noisy(MU - MU.min() + final, 3, 0.01, len(rows))
        for r in rows_of(recipe, x):
            i = list(MU - MU.min() + final).index(min(MU - MU.min() + final))
            at_best = float(r["lr"]) == 1e-2 and i == 3
            r["eval_loss_25"] = early if at_best else 9.0
            r["eval_loss_50"] = early if at_best else 9.0
            r["eval_loss_75"] = r["eval_loss"]
            rows.append(r)
    cells = _cells(tmp_path, rows)
    [flip] = rank_flips(cells, [("A", "B", "-")], 0.1)
    assert flip.deltas[0.25] == pytest.approx(0.4)  # A worse early by 5.0 - 4.6
    assert flip.deltas[1.0] == pytest.approx(-0.3, abs=0.03)
    assert flip.flipped == [0.25, 0.5]


def test_unmeasured_fractions_skip_the_rank_flips(tmp_path: Path) -> None:
    """Empty eval_loss_25/50/75 cells of completed runs (a study that evaluated at none of those
    steps) are unknown, not l_0: the rank flips say so instead of finding none."""
    rows = []
    for recipe, final in (("A", 4.0), ("B", 4.3)):
        for r in rows_of(recipe, _noisy(MU - MU.min() + final, 3, 0.01, len(rows))):
            r["eval_loss_25"] = r["eval_loss_50"] = r["eval_loss_75"] = ""
            rows.append(r)
    cells = _cells(tmp_path, rows)
    assert cells[("A", "-")].at == {}
    [flip] = rank_flips(cells, [("A", "B", "-")], 0.1)
    assert flip.flipped == [] and flip.note.startswith("skipped: no eval loss at fractions")


def test_seeds_plan_stated_and_pilot(tmp_path: Path) -> None:
    from normlab.launch.verdicts.decide import pilot_sd, seeds_plan

    # SCIENCE.md 22.5's example: SD 0.03, true 0.2, margin 0.1, 3 claims: d = 3.33 at .0167
    n, text = seeds_plan(vc.LOSS, 0.03, 0.2)
    assert n == st.seeds_needed(0.2, 0.03, 0.1, 0.05 / 3) == 4
    assert text.startswith("this claim needs 4 seeds per arm at a 0.1-nat margin")
    assert seeds_plan(vc.RANGE, 0.5, 3.0)[0] == 4  # raised to the permutation floor at .0167
    cells = _cells(tmp_path, rows_of("A", A, LRS3, status={(2, 0): "diverged"}))
    var = 2 / 3 * ((np.array([2.5, 2.05, 2.45]) - 7.0 / 3) ** 2).sum()  # the hand jackknife
    assert pilot_sd(cells[("A", "-")], vc.LOSS) == pytest.approx(math.sqrt(3 * var))
    s = vc.seed_sensitivity(cells[("A", "-")].loss)
    assert pilot_sd(cells[("A", "-")], vc.SENS) == pytest.approx(s.std(ddof=1))
