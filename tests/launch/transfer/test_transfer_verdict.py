"""The transfer verdict (SCIENCE.md 21.6 decided by 22; launch.transfer.transfer_verdict): per-seed
best-lr shifts recovered from curves whose optimum is known, the interval against scipy's
one-sample t, Holm over the recipes, and the seed calculator against a simulation of the test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from normlab.launch.transfer.ladder import Rung
from normlab.launch.transfer.transfer_verdict import (
    INCONCLUSIVE,
    MOVES_DOWN,
    MOVES_UP,
    TRANSFERS,
    decide_transfer,
    one_sample_seeds,
    seed_shifts,
)
from scipy import stats

LRS = 2.0 ** np.arange(-12, -6.5, 0.5)  # half-octave grid


def rung(size: float, optima: list[float], seeds: tuple[int, ...] = ()) -> Rung:
    """Seed curves that are exact parabolas in log2 η with their vertex at log2 η = optima[s]."""
    x = np.log2(LRS)
    losses = np.array([5.0 + 0.1 * (x - o) ** 2 for o in optima])
    return Rung(size, LRS, losses, None, seeds)


def ladder(shifts: list[float], base: float = -9.5) -> list[Rung]:
    return [rung(2, [base] * len(shifts)), rung(16, [base + d for d in shifts])]


def test_per_seed_shift_is_the_vertex_distance_in_octaves() -> None:
    seeds, d = seed_shifts(*ladder([-1.3, 0.2, 0.75]))
    assert seeds == [0, 1, 2]
    np.testing.assert_allclose(d, [-1.3, 0.2, 0.75], atol=1e-9)


def test_only_seeds_run_at_both_ends_enter() -> None:
    small = rung(2, [-9.5, -9.5, -9.5], seeds=(0, 1, 2))
    large = rung(16, [-10.0, -9.0], seeds=(1, 2))
    seeds, d = seed_shifts(small, large)
    assert seeds == [1, 2]
    np.testing.assert_allclose(d, [-0.5, 0.5], atol=1e-9)


def test_interval_is_scipys_one_sample_t_at_the_holm_level() -> None:
    shifts = [-0.31, 0.12, 0.05, -0.08]
    (v,) = decide_transfer({"r": ladder(shifts)})
    assert v.level == pytest.approx(0.05)  # one claim: Holm's level is alpha
    ref = stats.ttest_1samp(shifts, 0.0).confidence_interval(confidence_level=1 - 2 * 0.05)
    assert v.interval == pytest.approx((ref.low, ref.high), abs=1e-9)
    assert v.mean == pytest.approx(np.mean(shifts))
    assert v.sd == pytest.approx(np.std(shifts, ddof=1))


def test_the_four_rows_and_holm_over_the_recipes() -> None:
    found = {
        v.recipe: v
        for v in decide_transfer(
            {
                "down": ladder([-2.0, -2.1, -1.9]),
                "up": ladder([1.6, 1.5, 1.7]),
                "flat": ladder([0.01, -0.02, 0.0, 0.02]),
                "noisy": ladder([-0.6, 0.6]),
            }
        )
    }
    assert found["down"].verdict == MOVES_DOWN and found["up"].verdict == MOVES_UP
    assert found["flat"].verdict == TRANSFERS
    noisy = found["noisy"]
    assert noisy.verdict == INCONCLUSIVE and noisy.seeds_needed is not None
    assert f"needs {noisy.seeds_needed} seeds" in noisy.note
    # Holm step-down: levels alpha/4, alpha/3, alpha/2 for the three decided, in order of p
    decided = sorted((v.p, v.level) for v in found.values() if v.verdict != INCONCLUSIVE)
    assert [lv for _, lv in decided] == pytest.approx([0.05 / 4, 0.05 / 3, 0.05 / 2])
    for v in found.values():  # the interval row and the verdict agree (22.3)
        lo, hi = v.interval
        if v.verdict == TRANSFERS:
            assert lo > -0.5 and hi < 0.5
        elif v.verdict == MOVES_DOWN:
            assert hi < -0.5


def test_one_seed_is_never_a_verdict() -> None:
    (v,) = decide_transfer({"r": ladder([-3.0])})
    assert v.verdict == INCONCLUSIVE and math.isnan(v.level) and "one" in v.note


def _simulated_power(n: int, mean: float, sd: float, alpha: float, equivalence: bool) -> float:
    rng = np.random.default_rng(0)
    d = rng.normal(mean, sd, size=(20_000, n))
    m, se = d.mean(axis=1), d.std(axis=1, ddof=1) / math.sqrt(n)
    half = stats.t.ppf(1 - alpha, n - 1) * se
    if equivalence:
        return float(np.mean((m - half > -0.5) & (m + half < 0.5)))
    return float(np.mean(m + half < -0.5))


@pytest.mark.parametrize(
    ("mean", "sd", "equivalence"), [(-1.2, 0.5, False), (-0.9, 0.3, False), (0.1, 0.3, True)]
)
def test_seed_calculator_reaches_eighty_percent_power_in_simulation(
    mean: float, sd: float, equivalence: bool
) -> None:
    """The calculator's n gives >= 80 % power when the test is simulated at that n (TOST: its
    power formula is a lower bound), and n - 1 seeds do not (the minimum-effect test is exact)."""
    n = one_sample_seeds(mean, sd, 0.5, 0.05)
    assert n is not None and n >= 2
    assert _simulated_power(n, mean, sd, 0.05, equivalence) >= 0.79
    if not equivalence and n > 2:
        assert _simulated_power(n - 1, mean, sd, 0.05, equivalence) < 0.8
