"""Ladder fits (issue 31 item 5) on synthetic ladders with known exponents: the power laws of the
best loss, the best lr, the LR sensitivity and the max logit come back inside their bootstrap
intervals, the forecast interval holds the true value, and the hold-out of the largest rung
covers its measurement; a ladder whose form breaks at the top is caught by the hold-out."""

from __future__ import annotations

import math

import numpy as np
import pytest
from normlab.launch.transfer import ladder as ld

SIZES = (64, 256, 1024, 4096)  # lr* moves one octave per 4x: on the half-octave grid
GRID = 2.0 ** (np.arange(-16, -3) / 2)  # half octaves, 2^-8 .. 2^-2
A, B = 6.0, -0.08  # best loss = A x^B
K, E = 2.0**-1, -0.5  # lr* = K x^E
S, H = 0.05, 0.3  # curvature c(x) = S x^H (sensitivity exponent B + H with lr* fixed)
C, G = 2.0, 0.25  # max logit = C x^G


def _rung(x: float, seeds: int, rng, moving: bool = True, noise: float = 1e-4) -> ld.Rung:
    star = math.log2(K * x**E) if moving else -5.0
    base = A * x**B * (1 + S * x**H * (np.log2(GRID) - star) ** 2)
    losses = base * (1 + noise * rng.standard_normal((seeds, len(GRID))))
    logits = C * x**G * (1 + noise * rng.standard_normal((seeds, len(GRID))))
    return ld.Rung(float(x), GRID, losses, logits)


def test_known_exponents_come_back_inside_their_intervals() -> None:
    rng = np.random.default_rng(0)
    rungs = [_rung(x, 4, rng) for x in SIZES]
    fits = ld.fit_ladder(rungs, target=16384, n_boot=300)
    for q, want in (("best_loss", B), ("best_lr", E), ("max_logit", G)):
        f = fits[q]
        assert f.exponent == pytest.approx(want, abs=2e-3), q
        assert f.exponent_ci[0] <= want <= f.exponent_ci[1], (q, f.exponent_ci)
    loss = fits["best_loss"]
    assert loss.forecast == pytest.approx(A * 16384**B, rel=1e-3)
    assert loss.forecast_ci[0] <= A * 16384**B <= loss.forecast_ci[1]
    assert fits["best_lr"].forecast == pytest.approx(K * 16384**E, rel=1e-2)


def test_sensitivity_exponent_with_a_fixed_optimum() -> None:
    """lr* fixed on the grid: S(x) = A x^B · S x^H · mean (log2 η - log2 η*)^2 ∝ x^(B + H)."""
    rng = np.random.default_rng(1)
    fits = ld.fit_ladder([_rung(x, 3, rng, moving=False) for x in SIZES], n_boot=200)
    f = fits["lr_sensitivity"]
    assert f.exponent == pytest.approx(B + H, abs=2e-3)
    assert f.exponent_ci[0] <= B + H <= f.exponent_ci[1]


def test_quadratic_fit_finds_the_optimum_between_grid_points() -> None:
    lrs = 2.0 ** np.arange(-10, -3, dtype=float)
    mean = (np.log2(lrs) + 6.5) ** 2  # optimum at 2^-6.5, between two grid points
    assert ld.best_lr(lrs, mean) == pytest.approx(2**-6.5)


def test_hold_out_covers_a_clean_ladder_and_catches_a_broken_top() -> None:
    rng = np.random.default_rng(2)
    rungs = [_rung(x, 4, rng, noise=1e-3) for x in SIZES]
    held = {h.quantity: h for h in ld.hold_out_largest(rungs, n_boot=300)}
    assert held["best_loss"].covered and held["best_lr"].covered and held["max_logit"].covered
    # the largest rung 5 % worse than the power law: the forecast interval must miss it
    rungs[-1].losses *= 1.05
    held = {h.quantity: h for h in ld.hold_out_largest(rungs, n_boot=300)}
    assert held["best_loss"].covered is False
    rows = ld.ladder_rows("r", ld.fit_ladder(rungs, n_boot=50), list(held.values()))
    assert ld.coverage(rows)[1] == 4


def test_bootstrap_resamples_whole_seed_runs() -> None:
    """One noisy seed moves every lr of its run together: intervals widen with it."""
    rng = np.random.default_rng(3)
    rungs = [_rung(x, 4, rng) for x in SIZES]
    narrow = ld.fit_ladder(rungs, n_boot=200)["best_loss"].exponent_ci
    for r in rungs:
        r.losses[0] *= 1 + 0.02 * rng.standard_normal()
    wide = ld.fit_ladder(rungs, n_boot=200)["best_loss"].exponent_ci
    assert wide[1] - wide[0] > 5 * (narrow[1] - narrow[0])


def test_study_curves_become_ladder_csv_and_png(tmp_path) -> None:
    """The study glue: sensitivity Points -> curves -> ladder.csv/png with one row per quantity."""
    import csv

    from normlab.launch.lr_sensitivity.curves import Point, curves
    from normlab.launch.transfer.ladder_report import write_ladder

    rng = np.random.default_rng(4)
    points = []
    for x in SIZES[:3]:
        rung = _rung(x, 2, rng)
        for i, lr in enumerate(GRID):
            for s in range(2):
                loss = float(rung.losses[s, i])
                extra = {"max_logit": float(rung.logits[s, i])}
                size = f"d_model={x}"  # the study's size label
                points.append(Point("r", size, float(lr), s, loss, 99.0, extra=extra))
    lines = write_ladder(curves(points), tmp_path, target=4096)
    rows = list(csv.DictReader((tmp_path / "ladder.csv").open()))
    assert [r["quantity"] for r in rows] == list(ld.QUANTITIES)
    by_q = {r["quantity"]: r for r in rows}
    assert float(by_q["best_loss"]["exponent"]) == pytest.approx(B, abs=2e-3)
    assert float(by_q["best_loss"]["forecast"]) == pytest.approx(A * 4096**B, rel=1e-3)
    assert by_q["best_loss"]["holdout_covered"] in ("True", "False")
    assert (tmp_path / "ladder.png").stat().st_size > 0
    assert any("Hold-out coverage" in line for line in lines)


def test_best_lr_shift_in_octaves() -> None:
    """lr* ∝ x^-1/2 over 64 -> 4096 (64x): D = -3 octaves, inside its interval."""
    rng = np.random.default_rng(5)
    f = ld.fit_ladder([_rung(x, 3, rng) for x in SIZES], n_boot=200)["best_lr"]
    assert f.shift == pytest.approx(-3.0, abs=1e-2)
    assert f.shift_ci[0] <= -3.0 <= f.shift_ci[1] or abs(f.shift_ci[0] + 3) < 1e-2


def _one_replicate(rung: ld.Rung, rows: np.ndarray) -> list[float]:
    """The module docstring's four statistics for one replicate, written out directly."""
    mean = rung.losses[rows].mean(axis=0)
    i = int(np.argmin(mean))
    x = np.log2(rung.lrs)
    near = np.sort(np.argsort(np.abs(np.arange(len(x)) - i), kind="stable")[:5])
    c2, c1, _ = np.polyfit(x[near], mean[near], 2)
    vertex = -c1 / (2 * c2) if c2 > 0 else math.nan
    inside = c2 > 0 and x[near].min() <= vertex <= x[near].max()
    column = rung.logits[rows][:, i]
    logit = float(np.nanmean(column)) if np.isfinite(column).any() else math.nan
    best = 2.0**vertex if inside else rung.lrs[i]
    return [float(mean[i]), float(best), float((mean - mean[i]).mean()), logit]


def _one_power(sizes: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    ok = np.isfinite(values) & (values > 0)
    if ok.sum() < 2 or len(set(sizes[ok])) < 2:
        return math.nan, math.nan
    b, log_a = np.polyfit(np.log(sizes[ok]), np.log(values[ok]), 1)
    return math.exp(log_a), b


def test_the_batched_bootstrap_equals_the_per_replicate_statistics() -> None:
    """`_replicates` (one solve per argmin or usable-rung pattern) gives, replicate by replicate,
    the statistics and power laws computed one at a time from their definitions on the same
    draws: noisy rungs so the argmin, the parabola's sign and the vertex test vary, NaN max
    logits on some seeds."""
    rng = np.random.default_rng(3)
    rungs = [_rung(x, 5, rng, noise=0.05) for x in SIZES]
    for r in rungs[1:3]:
        r.logits[rng.random(r.logits.shape) < 0.4] = np.nan
    n, seed = 300, 11
    got = ld._replicates(rungs, n, seed)
    draw = np.random.default_rng(seed)
    want = np.empty_like(got)
    for b in range(n):
        for j, rung in enumerate(rungs):
            rows = draw.integers(0, rung.losses.shape[0], size=rung.losses.shape[0])
            want[b, j] = _one_replicate(rung, rows)
    assert len(np.unique(got[:, 0, 1])) > 10  # the vertex moves between replicates
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, equal_nan=True)
    sizes = np.array(SIZES, dtype=float)
    for k in range(len(ld.QUANTITIES)):
        values = got[:, :, k].copy()
        values[::7, 1] = np.nan  # rows with another usable-rung pattern
        values[::11, 2] = -1.0
        batched = ld.fit_powers(sizes, values)
        single = np.array([_one_power(sizes, v) for v in values])
        np.testing.assert_allclose(batched, single, rtol=1e-10, atol=0, equal_nan=True)
