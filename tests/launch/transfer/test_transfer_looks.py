"""The transfer verdict under the plan of looks completep_depth followed (n 2, then n 8;
docs/SCIENCE.md 22.8): the committed per-seed shifts re-decided, the level checked against the
boundary computed independently from scipy's bivariate normal."""

from __future__ import annotations

import numpy as np
import pytest
from normlab.launch.stats import group_sequential as gs
from normlab.launch.transfer.transfer_verdict import INCONCLUSIVE, TRANSFERS, decide_transfer
from scipy import optimize, stats

from tests.launch.transfer.test_transfer_verdict import ladder

# docs/study/completep_depth/transfer.csv: CompleteP's 8 seeds and sp's 2, octaves
COMPLETEP = [0.368869, 0.492269, 0.199864, -0.380732, -0.321431, 0.769487, -0.000838687, -0.915685]
SP = [1.6043, 0.0247299]


def pocock_second_level(alpha: float, t1: float) -> float:
    """Phi-bar(c_2) of Pocock-type spending at looks t1, 1, from scipy's bivariate normal."""
    a1 = alpha * np.log(1 + (np.e - 1) * t1)
    c1 = stats.norm.isf(a1)
    corr = np.array([[1.0, np.sqrt(t1)], [np.sqrt(t1), 1.0]])

    def excess(c2: float) -> float:
        stay = stats.multivariate_normal.cdf([c1, c2], np.zeros(2), corr)
        return (1 - stay) - alpha

    return float(stats.norm.sf(optimize.brentq(excess, 1.0, 5.0, xtol=1e-10)))


def test_completep_transfer_uncorrected_and_under_its_looks() -> None:
    ladders = {"sp": ladder(SP), "completep": ladder(COMPLETEP)}
    plain = {v.recipe: v for v in decide_transfer(ladders)}
    assert plain["completep"].verdict == TRANSFERS
    assert plain["completep"].p == pytest.approx(0.022, abs=5e-4)
    late = gs.Plan(gs.POCOCK, (2, 8), registered=False)
    seq = {v.recipe: v for v in decide_transfer(ladders, plan=late)}
    cp = seq["completep"]
    # Holm's first step fails at alpha/2 (the corrected p is above it), so both get alpha/2
    assert cp.verdict == INCONCLUSIVE
    assert cp.level == pytest.approx(pocock_second_level(0.025, 2 / 8), rel=1e-5)
    ref = stats.ttest_1samp(COMPLETEP, 0.0).confidence_interval(1 - 2 * cp.level)
    assert cp.interval == pytest.approx((ref.low, ref.high), abs=1e-9)
    assert cp.interval[1] > 0.5 > cp.interval[0] > -0.5
    assert "without a pre-registered plan" in cp.note and "new study" in cp.note
    sp = seq["sp"]
    assert sp.level == pytest.approx(0.025 * np.log(1 + (np.e - 1) * 0.25), rel=1e-9)
    assert "next look is at n 8" in sp.note
    # an O'Brien-Fleming plan, had it been pre-registered, would have kept the verdict: the reason
    # a plan chosen after the looks must not be the one most favourable to the last look
    obf = {v.recipe: v for v in decide_transfer(ladders, plan=gs.Plan(gs.OBRIEN_FLEMING, (2, 8)))}
    assert obf["completep"].verdict == TRANSFERS


def test_seeds_past_the_plan_get_no_level_and_no_seed_count() -> None:
    (v,) = decide_transfer({"r": ladder([0.1, -0.2, 0.05, 0.3])}, plan=gs.Plan(gs.POCOCK, (2, 3)))
    assert v.level == 0.0 and v.verdict == INCONCLUSIVE and v.seeds_needed is None
    assert v.interval == (-np.inf, np.inf)
    assert "past the plan's last look (n 3)" in v.note and "seeds for 80%" not in v.note
