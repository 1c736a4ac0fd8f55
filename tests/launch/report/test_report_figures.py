"""The report figures as a researcher needs them (issue 12, item 6), checked on the figure objects:
eval loss on the loss plot, the clip threshold and a plain-number log axis on the gradient-norm
plot, one y-range and an outside legend on the depth panels, curves told apart by dash and marker,
and dataset, learning rate, steps and seeds in the titles."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.ticker import FormatStrFormatter
from normlab.launch.report.plots import depth_figure, grad_norm_figure, loss_figure, save
from normlab.launch.rundir.runs import Run
from normlab.launch.study.plots import DEPTH, LOSS, study_figure


def fake_run(name: str, lr: float, seed: int, scale: float, dataset: str = "bundled") -> Run:
    """Ten logged steps of loss, grad norm and a 3-block residual profile growing with `scale`."""
    train = [
        {
            "step": s,
            "loss": 8.0 - 0.1 * s * scale,
            "grad_norm": 0.5 + 0.2 * s * scale,
            **{f"resid_rms/{b:02d}": (1 + b) * scale * s / 10 for b in range(3)},
        }
        for s in range(10, 110, 10)
    ]
    evals = [{"step": 50, "eval_loss": 7.0 - scale}, {"step": 100, "eval_loss": 6.5 - scale}]
    config = {
        "name": name,
        "data": {"dataset": dataset},
        "model": {"n_layers": 3, "d_model": 16},
        "optim": {"lr": lr, "grad_clip": 1.0},
        "training": {"steps": 100, "seed": seed},
    }
    path = Path(f"{name}_lr{lr:g}_s{seed}")
    return Run(path=path, config=config, summary={}, train=train, evals=evals)


@pytest.fixture
def runs() -> list[Run]:
    return [fake_run("pre", 1e-3, 0, 1.0, "/data/prep/tinystories"), fake_run("post", 1e-3, 0, 3.0)]


def _legend_right_of(fig: plt.Figure, legend, ax: plt.Axes) -> bool:  # noqa: ANN001
    fig.canvas.draw()
    return legend.get_window_extent().x0 >= ax.get_window_extent().x1


def test_loss_figure_has_eval_markers_setting_and_outside_legend(runs: list[Run]) -> None:
    fig = loss_figure(runs)
    ax = fig.axes[0]
    evals = {line.get_label(): line for line in ax.lines if line.get_label().endswith("(eval)")}
    post = evals["post_lr0.001_s0 (eval)"]
    assert list(post.get_xdata()) == [50, 100] and list(post.get_ydata()) == [4.0, 3.5]
    assert post.get_linestyle() == "None" and post.get_marker() != "None"
    title = ax.get_title()
    assert "data bundled, tinystories" in title  # the prepared directory's name, not its path
    assert "lr 0.001" in title and "steps 100" in title and "seed 0" in title
    assert _legend_right_of(fig, ax.get_legend(), ax)
    train = [line for line in ax.lines if not line.get_label().endswith("(eval)")]
    styles = {(line.get_linestyle(), line.get_marker()) for line in train}
    assert len(styles) == len(train) == 2  # overlapping curves stay apart
    plt.close(fig)


def test_grad_norm_figure_draws_the_clip_threshold_on_a_readable_axis(runs: list[Run]) -> None:
    fig = grad_norm_figure(runs)
    ax = fig.axes[0]
    (clip,) = [line for line in ax.lines if line.get_label() == "clip threshold 1"]
    assert list(clip.get_ydata()) == [1.0, 1.0]
    assert ax.get_yscale() == "log" and "gradient L2 norm" in ax.get_ylabel()
    assert isinstance(ax.yaxis.get_major_formatter(), FormatStrFormatter)  # '2', not '2x10^0'
    assert _legend_right_of(fig, ax.get_legend(), ax)
    plt.close(fig)


def test_depth_panels_share_one_y_range_with_the_legend_outside(runs: list[Run]) -> None:
    fig = depth_figure(runs)
    axes = fig.axes
    assert len(axes) == 4 and len({ax.get_ylim() for ax in axes}) == 1
    assert [ax.get_title() for ax in axes] == ["step 10", "step 40", "step 70", "step 100"]
    last = axes[-1].lines[1]  # post at step 100: 3 x 10 x (1, 2, 3)
    assert list(last.get_ydata()) == pytest.approx([30.0, 60.0, 90.0])
    assert "lr 0.001" in fig._suptitle.get_text() and "seed 0" in fig._suptitle.get_text()
    assert _legend_right_of(fig, fig.legends[0], axes[-1])
    plt.close(fig)


def test_study_figures_average_seeds_per_lr_panel(tmp_path: Path) -> None:
    runs = [
        fake_run("pre", lr, seed, scale)
        for lr, scales in ((1e-3, (1.0, 2.0)), (3e-3, (3.0, 5.0)))
        for seed, scale in enumerate(scales)
    ]
    fig = study_figure(runs, *DEPTH)
    low, high = fig.axes
    assert low.get_ylim() == high.get_ylim()  # one y-range across learning rates
    assert isinstance(low.yaxis.get_major_formatter(), FormatStrFormatter)  # '40', not 4x10^1
    assert [low.get_title(), high.get_title()] == ["lr 0.001", "lr 0.003"]
    assert list(high.lines[0].get_ydata()) == pytest.approx(
        [40.0, 80.0, 120.0]
    )  # mean of 30 and 50
    caption = fig._suptitle.get_text()
    assert "dataset bundled" in caption and "100 steps" in caption and "seeds 0, 1" in caption
    assert _legend_right_of(fig, fig.legends[0], high)
    loss = study_figure(runs, *LOSS)
    (mean, evals) = loss.axes[0].lines
    assert mean.get_ydata()[-1] == pytest.approx(8.0 - 10 * 1.5)  # seeds 1.0 and 2.0 averaged
    assert list(evals.get_ydata()) == pytest.approx([5.5, 5.0])
    assert save(loss, tmp_path / "loss.png").stat().st_size > 0
    plt.close(fig)
