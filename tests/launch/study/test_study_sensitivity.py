"""The LR-sensitivity protocol (SCIENCE.md 19) on synthetic results: the formula by hand, capping
at the measured l_0 (diverged, NaN, stopped, above-l_0 points), seeds, the stable range, the CSV
columns and the figures."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from normlab.launch.lr_sensitivity.curves import (
    PROTOCOL_LRS,
    Point,
    capped_loss,
    curves,
    lr_sensitivity,
    stable_range,
    summary_row,
    write_csvs,
)
from normlab.launch.stats.separation import TRAINED_MARGIN
from normlab.launch.study.lr_plots import write_lr_plots

L0 = 8.3


def points(losses: dict[int, list[float | None]], failed: set[tuple[int, int]] = frozenset(),
           recipe: str = "pre", size: str = "-", l0: float = L0) -> list[Point]:  # fmt: skip
    """seed -> one loss per protocol lr; (seed, index) in `failed` marks a diverged run."""
    return [
        Point(recipe, size, lr, seed, loss, l0, failed=(seed, i) in failed,
              extra={"max_logit": 10.0 * (i + 1), "logz_mean_final": 7.0 - i, "logz_min": 6.0})
        for seed, row in losses.items()
        for i, (lr, loss) in enumerate(zip(PROTOCOL_LRS, row, strict=True))
    ]  # fmt: skip


def test_formula_on_one_seed_with_a_diverged_a_nan_and_an_above_l0_point() -> None:
    raw = [6.0, 5.2, 5.0, 5.05, 9.5, math.nan, 4.0]  # 9.5 > l_0; nan; last one diverged
    (c,) = curves(points({0: raw}, failed={(0, 6)}))
    capped = [6.0, 5.2, 5.0, 5.05, L0, L0, L0]  # min(l, l_0), failures at l_0
    assert [p.capped[0] for p in c.points] == capped
    assert c.best.lr == 3e-3 and c.best.mean == 5.0
    expected = sum(capped) / 7 - 5.0
    assert c.sensitivity == pytest.approx(expected, abs=1e-12)
    assert c.sensitivity == pytest.approx(46.15 / 7 - 5.0, abs=1e-12)  # by hand: sum 46.15
    assert c.stable_range == (3e-3, 1e-2)  # 5.0 and 5.05 within 0.1; 5.2 is not
    assert [p.failed for p in c.points] == [0, 0, 0, 0, 0, 1, 1]  # NaN and diverged


def test_two_seeds_mean_curve_and_per_seed_spread() -> None:
    s0 = [6.0, 5.2, 5.0, 5.1, 5.6, 7.0, 8.0]
    s1 = [6.2, 5.4, 5.1, 5.0, 5.9, None, 8.1]  # None: never evaluated -> l_0
    (c,) = curves(points({0: s0, 1: s1}, failed={(1, 6)}))
    c1 = [6.2, 5.4, 5.1, 5.0, 5.9, L0, L0]
    mean = (np.array(s0) + np.array(c1)) / 2
    assert [p.mean for p in c.points] == pytest.approx(list(mean))
    assert c.sensitivity == pytest.approx(mean.mean() - mean.min())
    assert c.best.lr == 3e-3 and c.best.sd == pytest.approx(np.std([5.0, 5.1], ddof=1))
    per_seed = c.seed_sensitivities()
    assert per_seed == pytest.approx([np.mean(s0) - 5.0, np.mean(c1) - 5.0])
    assert c.stable_range == (3e-3, 1e-2)  # means 5.05, 5.05 (within 0.1 of 5.05)


def test_flat_curve_has_zero_sensitivity_and_full_stable_range() -> None:
    (c,) = curves(points({0: [5.0] * 7, 1: [5.0] * 7}))
    assert c.sensitivity == 0.0 and c.stable_range == (3e-4, 3e-1)


def test_everything_diverged_is_zero_sensitivity_at_l0() -> None:
    """Bounded by construction: every point at l_0 -> l* = l_0, sensitivity 0 (the report shows
    'failed runs 7/7' beside it, so this does not read as stable)."""
    (c,) = curves(points({0: [math.inf] * 7}, failed={(0, i) for i in range(7)}))
    assert c.sensitivity == 0.0 and c.best.mean == L0
    assert sum(p.failed for p in c.points) == 7


def test_stable_range_widest_contiguous_run() -> None:
    assert stable_range([5.0, 5.05, 6.0, 5.02, 5.03, 5.04]) == (3, 5)  # 3 wide beats 2 wide
    assert stable_range([5.05, 5.0, 6.0, 5.02, 5.03]) == (0, 1)  # a tie: the run holding l*
    assert stable_range([5.0, 5.1000001], margin=0.1) == (0, 0)
    assert stable_range([5.0]) == (0, 0)


def test_capped_loss_and_the_mean() -> None:
    assert capped_loss(3.0, 8.0, False) == 3.0 and capped_loss(9.0, 8.0, False) == 8.0
    assert capped_loss(None, 8.0, False) == 8.0 and capped_loss(math.inf, 8.0, False) == 8.0
    assert capped_loss(3.0, 8.0, True) == 8.0
    assert lr_sensitivity([1.0, 2.0, 3.0]) == pytest.approx(1.0)


def test_l0_of_a_run_that_did_not_measure_it_is_the_curves_mean() -> None:
    pts = points({0: [5.0] * 7, 1: [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, None]})
    for p in pts:
        p.init_loss = 8.0 if p.seed == 0 else None
    (c,) = curves(pts)
    assert c.init_loss == 8.0 and c.points[-1].capped == [5.0, 8.0]
    for p in pts:
        p.init_loss = None
    with pytest.raises(ValueError, match="no run measured its loss at init"):
        curves(pts)


def test_csvs_and_figures(tmp_path: Path) -> None:
    pts = points({0: [6, 5.2, 5, 5.1, 5.6, 7, 8], 1: [6, 5.3, 5, 5.2, 5.7, 7, 8.2]},
                 failed={(0, 6)}, size="n_layers=2")  # fmt: skip
    pts += points({0: [6, 5.0, 4.8, 4.9, 5.0, 5.2, 5.4], 1: [6, 5, 4.8, 4.9, 5, 5.2, 5.4]},
                  recipe="pre_qknorm_head", size="n_layers=2")  # fmt: skip
    pts += points({0: [6, 5.1, 4.9, 5.4, 7, 8.3, 8.3]}, size="n_layers=4")
    found = curves(pts)
    summary, grid = write_csvs(found, tmp_path)
    rows = list(csv.DictReader(summary.open()))
    need = {"recipe", "size", "lr_sensitivity", "best_loss", "best_lr", "stable_lr_low",
            "stable_lr_high", "seeds"}  # fmt: skip
    assert need <= set(rows[0])
    assert [(r["recipe"], r["size"]) for r in rows] == [
        ("pre", "n_layers=2"), ("pre_qknorm_head", "n_layers=2"), ("pre", "n_layers=4")
    ]  # fmt: skip
    assert float(rows[0]["lr_sensitivity"]) == pytest.approx(found[0].sensitivity, abs=1e-4)
    assert float(rows[1]["lr_sensitivity"]) < float(rows[0]["lr_sensitivity"])
    assert rows[0]["seeds"] == "0 1" and rows[2]["seeds"] == "0" and rows[0]["failed_runs"] == "1"
    grid_rows = list(csv.DictReader(grid.open()))
    assert len(grid_rows) == 21 and grid_rows[0]["max_logit_mean"] == "10.0"
    paths = write_lr_plots(found, tmp_path)
    assert [p.name for p in paths] == ["lr_loss.png", "lr_logits.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_trained_range_needs_every_seed_below_the_plateau_by_the_margin() -> None:
    plateau = 6.258
    edge = plateau - TRAINED_MARGIN  # exactly the margin: trained
    s0 = [6.25, 5.5, edge, 5.2, 6.3, 5.0, 6.26]
    s1 = [5.3, 5.6, 5.4, 5.1, 5.0, 5.1, 6.26]  # trains at index 0 and 4, where seed 0 does not
    pts = points({0: s0, 1: s1}, failed={(1, 5)})  # index 5: seed 1 diverged (counts as l_0)
    (c,) = curves(pts, plateau=plateau)
    assert c.trained_range == (PROTOCOL_LRS[1], PROTOCOL_LRS[3])  # 5 fails on seed 1
    row = summary_row(c)
    assert (row["trained_lr_low"], row["trained_lr_high"]) == ("0.001", "0.01")
    assert row["plateau"] == 6.258
    # LR sensitivity cannot tell a curve that trains nowhere from a stable one; this range can
    (flat,) = curves(points({0: [6.25] * 7, 1: [6.26] * 7}), plateau=plateau)
    assert flat.sensitivity < 0.01 and flat.trained_range is None
    assert summary_row(flat)["trained_lr_low"] == ""
    (unknown,) = curves(points({0: s1}))  # no plateau given: no range, not a guess
    assert unknown.trained_range is None and summary_row(unknown)["plateau"] == ""


def test_logit_plots_without_attention_logits_measured(tmp_path: Path) -> None:
    """instruments.attention_logits off: every max_logit is NaN, which a log axis cannot draw
    (it raised from inside matplotlib); the panel says so and the figure is written."""
    pts = points({0: [6, 5.1, 4.9, 5.4, 7, 8.3, 8.3], 1: [6, 5.2, 5.0, 5.3, 7, 8.3, 8.3]})
    for p in pts:
        p.extra.update(max_logit=math.nan, logz_max=9.0, head_mean_norm_final=3.0)
    paths = write_lr_plots(curves(pts), tmp_path)
    assert [p.name for p in paths] == ["lr_loss.png", "lr_logits.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_best_lr_at_an_end_of_the_grid_is_named() -> None:
    """A minimum at the grid's largest (or smallest) rate is not bracketed: the report says so,
    per size; an interior minimum, a curve that did not train and a 2-point grid are not named."""
    from normlab.launch.lr_sensitivity.protocol import at_grid_edge, edge_lines

    rising = [5.9, 5.7, 5.5, 5.3, 5.2, 5.1, 5.0]  # best at 3e-1, the largest
    falling = rising[::-1]  # best at 3e-4, the smallest
    valley = [6.0, 5.2, 5.0, 5.05, 5.6, 7.0, 8.0]  # best at 3e-3
    found = curves(
        points({0: rising, 1: rising}, recipe="a", size="s1")
        + points({0: valley, 1: valley}, recipe="b", size="s1")
        + points({0: falling, 1: falling}, recipe="c", size="s2")
        + points({0: [8.2] * 7, 1: [8.2] * 7}, recipe="d", size="s2"),
        plateau=7.6,
    )
    assert [at_grid_edge(c) for c in found] == ["largest", None, "smallest", None]
    lines = edge_lines(found)
    assert len(lines) == 2
    assert lines[0].startswith("size s1: best lr at an end of the grid")
    assert lines[0].endswith(": a (0.3, the largest)")
    assert lines[1].endswith(": c (0.0003, the smallest)")  # d did not train: not named
    two = [p for p in points({0: rising}, recipe="e") if p.lr in PROTOCOL_LRS[-2:]]
    assert at_grid_edge(curves(two)[0]) is None
