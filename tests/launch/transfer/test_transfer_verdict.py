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
    MARGIN,
    MOVES_DOWN,
    MOVES_UP,
    TRANSFERS,
    decide_transfer,
    one_sample_seeds,
    seed_shifts,
    shift_bounds,
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


# the grid's edge: LRS spans log2 η in [-12, -7]; an optimum beyond it is clipped to the edge


def test_clipped_optima_make_the_shift_a_bound_of_the_right_kind() -> None:
    small = rung(2, [-9.5, -13.0, -13.0, -6.0])
    large = rung(16, [-5.0, -9.0, -13.0, -9.0])
    bounds, edges = shift_bounds(small, large)
    # seed 0: large at the top (lower bound); 1: small at the bottom (lower bound);
    # 2: both at the bottom (clipped both ways); 3: small at the top (upper bound)
    assert bounds == [1, 1, 2, -1]
    assert edges == [
        "seed 0: 16 at the top edge",
        "seed 1: 2 at the bottom edge",
        "seed 2: 2 at the bottom edge and 16 at the bottom edge",
        "seed 3: 2 at the top edge",
    ]
    assert shift_bounds(*ladder([-1.0, 0.5]))[0] == [0, 0]


def test_a_clipped_transfer_is_inconclusive_and_more_seeds_do_not_help() -> None:
    # measured D_s = -7 - small ≈ +0.3 on every seed: inside the margin, but the large rung's
    # optimum lies past the grid's top, so the true shift is larger by an unknown amount
    small = rung(2, [-7.3, -7.35, -7.28, -7.32])
    large = rung(16, [-6.0, -6.5, -5.5, -6.2])
    (v,) = decide_transfer({"r": [small, large]})
    assert v.interval[0] > -MARGIN and v.interval[1] < MARGIN  # the test alone says transfers
    assert v.verdict == INCONCLUSIVE and v.seeds_needed is None
    assert "widen the learning-rate grid" in v.note and "seed 0: 16 at the top edge" in v.note


def test_a_clipped_move_in_the_bounds_direction_stands() -> None:
    # up: the large rung clipped at the top makes each D_s a lower bound, already > +0.5
    small, large = rung(2, [-9.5, -9.3, -9.7, -9.4]), rung(16, [-6.0, -6.5, -5.5, -6.2])
    (up,) = decide_transfer({"r": [small, large]})
    assert up.bounds == [1] * 4
    assert up.verdict == MOVES_UP and "the verdict holds" in up.note
    # down, with the small rung clipped at the top: upper bounds, already < -0.5
    small, large = rung(2, [-6.0, -6.5, -5.5, -6.2]), rung(16, [-9.5, -9.4, -9.6, -9.5])
    (down,) = decide_transfer({"r": [small, large]})
    assert down.verdict == MOVES_DOWN and "the verdict holds" in down.note
    assert down.bounds == [-1] * 4
    # the large rung clipped at the bottom (upper bounds) and the small at the bottom (lower)
    small, large = rung(2, [-9.5, -9.3, -9.7, -9.4]), rung(16, [-13.0, -13.5, -12.5, -13.2])
    (clipped_down,) = decide_transfer({"r": [small, large]})
    assert clipped_down.bounds == [-1] * 4 and clipped_down.verdict == MOVES_DOWN
    small, large = rung(2, [-12.5, -13.0, -12.8, -13.2]), rung(16, [-9.0, -9.3, -8.9, -9.1])
    (clipped_up,) = decide_transfer({"r": [small, large]})
    assert clipped_up.bounds == [1] * 4 and clipped_up.verdict == MOVES_UP
    # a bound against the verdict's direction undoes it: six seeds move down by 2 octaves, the
    # seventh's optimum at 16 lies past the top, so its D_s >= +0.3 could be anything above
    small = rung(2, [-9.5] * 6 + [-7.3])
    large = rung(16, [-11.5, -11.6, -11.4, -11.5, -11.3, -11.7, -6.0])
    (mixed,) = decide_transfer({"r": [small, large]})
    assert mixed.bounds == [0] * 6 + [1] and mixed.interval[1] < -MARGIN
    assert mixed.verdict == INCONCLUSIVE and mixed.seeds_needed is None
