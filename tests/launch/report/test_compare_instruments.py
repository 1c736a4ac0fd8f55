"""compare's view of the issue-11 instruments: the depth plot draws the pre-norm residual RMS of
post-norm blocks, a spike score with no scored point shows '-', and fp16 scaler skips are not
non-finite steps."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from normlab.launch.report.plots import _pre_norm_line
from normlab.launch.report.table import fmt, summarize
from normlab.launch.rundir.runs import Run


def run_of(rows: list[dict], dtype: str = "fp32") -> Run:
    config = {"name": "r", "model": {"placement": "mix"}, "precision": {"dtype": dtype}}
    return Run(path=Path("r"), config=config, summary={"status": "completed"}, train=rows)


def test_depth_plot_draws_the_pre_norm_sum_of_post_blocks() -> None:
    row = {"step": 10, "loss": 3.0, "resid_rms/00": 1.0, "resid_rms/01": 1.0}
    row |= {"resid_rms/02": 2.5, "pre_norm_rms/00": 1.7, "pre_norm_rms/01": 2.9}
    fig, ax = plt.subplots()
    _pre_norm_line(ax, run_of([row]), row, "C0")
    (line,) = ax.lines
    assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [1.7, 2.9]
    assert line.get_linestyle() == "--" and line.get_label() == "r (before norm)"
    plt.close(fig)
    fig, ax = plt.subplots()
    _pre_norm_line(ax, run_of([row]), {"resid_rms/00": 1.0}, "C0")  # a Pre-LN run: no line
    assert not ax.lines
    plt.close(fig)


def test_unscored_spike_score_is_not_measured_and_scaler_skips_are_not_failures() -> None:
    rows = [
        {"step": 1, "loss": 5.0, "grad_norm": math.inf, "spike_score/loss": math.nan},
        {"step": 2, "loss": 4.0, "grad_norm": 1.0, "spike_score/loss": math.nan},
    ]
    rows[-1] |= {"scaler_skips": 1.0, "nonfinite_steps": 0.0, "spike_score/window": 150.0}
    row = summarize(run_of(rows, dtype="fp16"))
    assert row["spike_loss"] is None and fmt(row["spike_loss"], ".3f") == "-"
    assert row["nonfinite"] == 0 and row["scaler_skips"] == 1.0 and row["spike_window"] == 150.0
    assert summarize(run_of(rows, dtype="fp32"))["nonfinite"] == 1  # outside fp16 it is a failure
