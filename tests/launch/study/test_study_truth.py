"""The study's report tells the truth (issues 29 item 7, 30 item 6), on synthetic results:

- a curve that trained nowhere has an empty stable and trained range and says why;
- a run whose measured l_0 is NaN is reported (a note), not raised;
- diverged, failed and stopped runs count at l_0 in the verdicts as in the protocol;
- the unigram plateau is drawn in every loss figure (the figures' Line2D objects, not pixels);
- curves and runs that did not train are marked and left out of the ranking."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from normlab.launch.lr_sensitivity.curves import (
    PROTOCOL_LRS,
    Point,
    capped_loss,
    counts_as_l0,
    curves,
    ranking,
    summary_row,
    write_csvs,
)
from normlab.launch.lr_sensitivity.protocol import (
    HEAD,
    _cells,
    print_sensitivity,
    ranking_lines,
    ranks,
    row_cells,
)
from normlab.launch.report.plots import PLATEAU_LABEL, loss_figure
from normlab.launch.rundir.runs import Run
from normlab.launch.stats.separation import TRAINED_MARGIN
from normlab.launch.study import lr_plots
from normlab.launch.study.plots import LOSS, study_figure
from normlab.launch.study.report import group_table
from normlab.launch.verdicts.growth_claims import loss_of
from rich.console import Console

L0, PLATEAU = 8.3, 6.258


def points(losses: dict[int, list[float | None]], recipe: str = "pre", size: str = "-",
           failed: frozenset[tuple[int, int]] = frozenset()) -> list[Point]:  # fmt: skip
    """seed -> one loss per protocol lr; (seed, index) in `failed` marks a run that failed."""
    return [
        Point(recipe, size, lr, seed, loss, L0, failed=(seed, i) in failed)
        for seed, row in losses.items()
        for i, (lr, loss) in enumerate(zip(PROTOCOL_LRS, row, strict=True))
    ]


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=240)  # noqa: SIM115


# --- 1. a curve that trained nowhere ------------------------------------------------------------
def test_a_curve_that_trained_nowhere_has_empty_ranges_and_says_why() -> None:
    stalled = [6.20, 6.18, 6.15, 6.16, 6.19, 6.22, 6.25]  # DyT-like: at the plateau everywhere
    (c,) = curves(points({0: stalled, 1: [v + 0.01 for v in stalled]}), plateau=PLATEAU)
    assert c.best.mean == pytest.approx(6.155) and c.trained is False
    assert c.stable_range is None and c.trained_range is None  # not the whole grid
    assert c.range_note == (
        f"trained nowhere: best loss 6.155 > plateau 6.258 - {TRAINED_MARGIN:g}"
    )
    row = summary_row(c)
    assert (row["stable_lr_low"], row["stable_lr_high"], row["trained"]) == ("", "", "no")
    assert row["range_note"].startswith("trained nowhere")
    cells = _cells(c)
    assert cells["stable"] == f"none ({c.range_note})" and cells["trained"] == "nowhere"
    assert cells["rank"] == "-, did not train" and cells["recipe"] == "pre"
    # the same shape 0.2 nats lower trained (5.95 <= 6.058): every point lies within 0.1 of
    # l* = 5.95 (the largest is 6.05), so the whole grid is its stable range
    (ok,) = curves(points({0: [v - 0.2 for v in stalled]}), plateau=PLATEAU)
    assert ok.trained is True and ok.stable_range == (PROTOCOL_LRS[0], PROTOCOL_LRS[-1])
    assert ok.range_note == "" and summary_row(ok)["trained"] == "yes"


def test_without_a_plateau_a_curve_whose_every_run_failed_has_no_range() -> None:
    every = frozenset((0, i) for i in range(7))
    (c,) = curves(points({0: [5.0] * 7}, failed=every))  # every run at l_0
    assert c.best.mean == L0 and c.trained is False and c.stable_range is None
    assert c.range_note == f"trained nowhere: every run failed or ended at l_0 {L0:.3f}"
    (unknown,) = curves(points({0: [5.0] * 7}))  # no plateau, below l_0: unknown, range kept
    assert unknown.trained is None and unknown.stable_range == (PROTOCOL_LRS[0], PROTOCOL_LRS[-1])


# --- 2. a non-finite l_0 ------------------------------------------------------------------------
def test_a_nan_l0_of_a_failed_run_is_a_note_not_an_exception(tmp_path: Path) -> None:
    pts = points({0: [6.0, 5.2, 5.0, 5.1, 5.6, 7.0, 8.0], 1: [6.0, 5.4, 5.1, 5.0, 5.9, 7.0, 8.1]})
    pts[6].failed, pts[6].loss, pts[6].init_loss = True, None, math.nan  # seed 0 at 3e-1
    pts[7].init_loss = 8.5  # seed 1 at 3e-4: another measured l_0
    (c,) = curves(pts, plateau=PLATEAU)
    l0 = (L0 * 12 + 8.5) / 13  # the mean of the 13 finite l_0
    assert c.init_loss == pytest.approx(l0)
    assert c.points[-1].capped == pytest.approx([l0, 8.1])  # the NaN run counts at that mean
    means = [np.mean(p.capped) for p in c.points]
    assert c.sensitivity == pytest.approx(np.mean(means) - min(means), abs=1e-12)
    assert c.notes == [
        f"non-finite l_0 measured at lr 0.3 seed 0 (nan): counted at the curve's mean l_0 {l0:.3f}"
    ]
    console = Console(record=True, width=240)
    print_sensitivity([c], console)  # raised ValueError: max() arg is an empty sequence
    assert "non-finite l_0 measured at lr 0.3 seed 0" in console.export_text()
    write_csvs([c], tmp_path)
    assert lr_plots.write_lr_plots([c], tmp_path)[0].stat().st_size > 10_000


def test_a_curve_without_any_finite_l0_is_left_out_with_a_note() -> None:
    good = points({0: [5.0] * 7})
    bad = points({0: [5.0] * 7}, recipe="broken")
    for p in bad:
        p.init_loss = math.nan
    left_out: list[str] = []
    found = curves(good + bad, plateau=PLATEAU, left_out=left_out)
    assert [c.recipe for c in found] == ["pre"]
    assert len(left_out) == 1 and left_out[0].startswith(
        "broken at size -: left out of the LR-sensitivity protocol: no run measured a finite l_0"
    )


# --- 3. one rule for failed and stopped runs ---------------------------------------------------
@pytest.mark.parametrize("status", ["diverged", "failed", "interrupted", "preempted", None])
def test_failed_and_stopped_runs_count_at_l0_in_verdicts_and_protocol(status: str | None) -> None:
    """A run stopped mid-way with a good mid-run eval loss (5.0) counts at l_0 (8.3) in both."""
    row = {"recipe": "a", "lr": 1e-3, "seed": 0, "status": status, "eval_loss": 5.0,
           "init_loss": L0}  # fmt: skip
    assert counts_as_l0(status, 5.0) and loss_of(row) == L0
    assert capped_loss(5.0, L0, counts_as_l0(status, 5.0)) == L0  # the protocol's value
    done = {**row, "status": "completed"}
    assert loss_of(done) == 5.0 and loss_of({**done, "eval_loss": 9.0}) == L0  # capped


# --- 4. the plateau line in every loss figure --------------------------------------------------
def plateau_lines(fig: plt.Figure) -> list[float]:
    """The y of every line labelled as the plateau, over all axes."""
    return [
        float(line.get_ydata()[0])
        for ax in fig.axes
        for line in ax.get_lines()
        if str(line.get_label()).startswith(PLATEAU_LABEL)
    ]


def run(name: str, lr: float, seed: int, loss: float, status: str = "completed") -> Run:
    config = {"name": name, "optim": {"lr": lr}, "training": {"seed": seed, "steps": 20},
              "data": {"dataset": "tiny"}, "model": {"n_layers": 2, "d_model": 64}}  # fmt: skip
    train = [{"step": s, "loss": 8.0 - (8.0 - loss) * s / 20} for s in range(1, 21)]
    evals = [{"step": 20, "eval_loss": loss}]
    return Run(Path(f"/runs/{name}_s{seed}"), config, {"status": status}, train, evals)


def test_compare_loss_png_draws_the_plateau_and_marks_runs_that_did_not_train() -> None:
    runs = [run("pre", 1e-3, 0, 5.1), run("post", 1e-3, 0, 6.2), run("dyt", 1e-3, 0, 5.0, "failed")]
    fig = loss_figure(runs, plateau=PLATEAU)
    assert plateau_lines(fig) == [PLATEAU]
    labels = [str(x.get_label()) for x in fig.axes[0].get_lines()]
    assert labels[:3] == ["pre_s0", "post_s0 (did not train)", "dyt_s0 (did not train)"]
    assert f"trained below: plateau - {TRAINED_MARGIN:g}" in labels
    plt.close(fig)
    fig = loss_figure(runs)  # no plateau known: no line, no mark
    assert plateau_lines(fig) == [] and "post_s0" in [x.get_label() for x in fig.axes[0].lines]
    plt.close(fig)


def test_study_loss_png_draws_the_plateau_in_every_panel() -> None:
    runs = [run(r, lr, s, loss) for r, loss in (("pre", 5.1), ("dyt", 6.2))
            for lr in (1e-3, 1e-2) for s in (0, 1)]  # fmt: skip
    draw, ylabel, title = LOSS
    from functools import partial

    fig = study_figure(runs, partial(draw, plateau=PLATEAU), ylabel, title)
    assert plateau_lines(fig) == [PLATEAU, PLATEAU]  # one per learning-rate panel
    labels = {str(x.get_label()) for ax in fig.axes for x in ax.get_lines()}
    assert {"pre", "dyt (did not train)"} <= labels
    plt.close(fig)


def test_lr_loss_png_draws_the_plateau_and_fades_a_curve_that_did_not_train() -> None:
    found = curves(
        points({0: [6.0, 5.2, 5.0, 5.1, 5.6, 7.0, 8.0]})
        + points({0: [6.2, 6.15, 6.1, 6.12, 6.2, 6.3, 6.4]}, recipe="dyt"),
        plateau=PLATEAU,
    )
    fig = lr_plots.loss_figure(found)
    assert plateau_lines(fig) == [PLATEAU]
    labels = [str(x.get_label()) for x in fig.axes[0].containers]
    assert labels == ["pre", "dyt (did not train)"]
    assert fig.axes[0].containers[1].lines[0].get_alpha() == pytest.approx(0.45)
    plt.close(fig)


# --- 5. marked in tables, left out of rankings --------------------------------------------------
def test_a_curve_that_did_not_train_is_not_ranked_however_flat() -> None:
    trained_a = points({0: [6.0, 5.2, 5.0, 5.1, 5.6, 7.0, 8.0]}, recipe="a")
    trained_b = points({0: [5.4, 5.1, 5.0, 5.05, 5.2, 5.5, 6.0]}, recipe="b")
    flat = points({0: [6.15] * 7}, recipe="dyt")  # sensitivity 0: would rank first
    found = curves(trained_a + flat + trained_b, plateau=PLATEAU)
    sens = {c.recipe: c.sensitivity for c in found}
    assert sens["dyt"] == 0.0 < sens["b"] < sens["a"]
    assert [c.recipe for c in ranking(found)] == ["b", "a"]
    order = ranks(found)
    assert [order.get(id(c)) for c in found] == [2, None, 1]
    assert [_cells(c, order.get(id(c)))["rank"] for c in found] == ["2", "-, did not train", "1"]
    at = [key for key, _ in HEAD].index("rank")  # the cells follow the header's order
    assert [row_cells(c, order.get(id(c)))[: at + 1] for c in found][1] == [
        "dyt",
        "-",
        "0.000",
        "-, did not train",
    ]
    assert ranking_lines(found) == [
        f"ranked by LR sensitivity (curves that trained): b ({sens['b']:.3f}) < a "
        f"({sens['a']:.3f}); did not train, not ranked: dyt"
    ]


def test_the_grid_point_table_counts_the_seeds_that_trained() -> None:
    rows = [
        {"recipe": "post", "lr": 1e-3, "seed": 0, "status": "completed", "eval_loss": 5.9},
        {"recipe": "post", "lr": 1e-3, "seed": 1, "status": "completed", "eval_loss": 6.2},
        {"recipe": "pre", "lr": 1e-3, "seed": 0, "status": "completed", "eval_loss": 5.0},
        {"recipe": "pre", "lr": 1e-3, "seed": 1, "status": "failed", "eval_loss": 5.0},
    ]
    head, cells = group_table(rows, PLATEAU)
    at = head.index("trained")
    assert [c[at] for c in cells] == ["1/2 (did not train)", "1/2 (did not train)"]
    assert cells[1][head.index("eval loss")] == "failed 1/2, others 5.000"
    head, _ = group_table(rows)  # no plateau: no column
    assert "trained" not in head
