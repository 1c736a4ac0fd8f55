"""The study's figures: one panel per learning rate, one curve per recipe averaged over seeds.

study_loss.png: mean training loss (band: min..max over seeds) with the mean eval loss as markers;
where the data's unigram plateau is known, its line and the trained threshold below it, and a
recipe whose seeds did not train at a learning rate is marked in the legend ('did not train', or
'k/n trained' when some did; launch.report.plots.run_trained).
study_depth.png: mean residual-stream RMS by block at the last logged step. Panels share their y
range so learning rates compare at a glance; the legend sits outside the data.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from normlab.launch.instruments.common import RESID  # noqa: E402
from normlab.launch.report.plots import (  # noqa: E402
    DID_NOT_TRAIN,
    curve_style,
    draw_plateau,
    readable_log,
    run_trained,
    save,
)
from normlab.launch.report.table import dataset_label  # noqa: E402
from normlab.launch.rundir.runs import Run  # noqa: E402


def _key(run: Run) -> tuple[str, float]:
    return str(run.config.get("name")), float((run.config.get("optim") or {}).get("lr", math.nan))


def _by_lr(runs: list[Run]) -> tuple[list[float], list[str], dict[tuple[str, float], list[Run]]]:
    groups: dict[tuple[str, float], list[Run]] = {}
    for run in runs:
        groups.setdefault(_key(run), []).append(run)
    lrs = sorted({lr for _, lr in groups})
    recipes = list(dict.fromkeys(r for r, _ in groups))
    return lrs, recipes, groups


def _stack(series: list[tuple[list[int], list[float]]]) -> tuple[list[int], np.ndarray]:
    """Values at the steps every seed logged (rows: seeds)."""
    common = sorted(set.intersection(*(set(s) for s, _ in series)))
    table = [dict(zip(s, v, strict=True)) for s, v in series]
    return common, np.array([[t[k] for k in common] for t in table], dtype=float)


def _caption(runs: list[Run]) -> str:
    cfg = runs[0].config
    t, m = cfg.get("training", {}), cfg.get("model", {})
    seeds = sorted({(r.config.get("training") or {}).get("seed") for r in runs})
    data = ", ".join(sorted({dataset_label(r.config) for r in runs}))
    return (
        f"dataset {data}; {m.get('n_layers')} blocks, d {m.get('d_model')}; "
        f"{t.get('steps')} steps; seeds {', '.join(str(s) for s in seeds)}"
    )


def group_label(recipe: str, runs: list[Run], plateau: float | None) -> str:
    """The recipe's legend label at one learning rate, marked when its seeds did not train."""
    if plateau is None:
        return recipe
    ok = sum(run_trained(r, plateau) for r in runs)
    if ok == len(runs):
        return recipe
    return f"{recipe} ({DID_NOT_TRAIN})" if ok == 0 else f"{recipe} ({ok}/{len(runs)} trained)"


def _loss_panel(
    ax: plt.Axes, lr: float, recipes: list[str], groups: dict, plateau: float | None = None
) -> None:
    for i, recipe in enumerate(recipes):
        runs = groups.get((recipe, lr))
        if not runs:
            continue
        style = curve_style(i)
        steps, values = _stack([r.series("loss") for r in runs])
        if not steps:
            continue
        with np.errstate(invalid="ignore"):
            mean = values.mean(0)
        every = max(1, len(steps) // 8)
        label = group_label(recipe, runs, plateau)
        ax.plot(steps, mean, label=label, markevery=every, markersize=4, **style)
        ax.fill_between(steps, values.min(0), values.max(0), color=style["color"], alpha=0.15)
        evals = _stack([_eval_series(r) for r in runs])
        if evals[0]:
            ax.plot(
                evals[0],
                evals[1].mean(0),
                linestyle="none",
                marker=style["marker"],
                markersize=8,
                markerfacecolor="white",
                color=style["color"],
            )
    draw_plateau(ax, plateau)
    ax.set(title=f"lr {lr:g}", xlabel="step")
    ax.grid(alpha=0.3)


def _eval_series(run: Run) -> tuple[list[int], list[float]]:
    return [int(r["step"]) for r in run.evals], [float(r["eval_loss"]) for r in run.evals]


def _depth_panel(ax: plt.Axes, lr: float, recipes: list[str], groups: dict) -> None:
    for i, recipe in enumerate(recipes):
        profiles = []
        for run in groups.get((recipe, lr), []):
            row = next((r for r in reversed(run.train) if run.blocks(RESID, r)), None)
            if row is not None:
                profiles.append(run.blocks(RESID, row))
        if not profiles or len({len(p) for p in profiles}) != 1:
            continue
        mean = np.mean(np.array(profiles, dtype=float), axis=0)
        ax.plot(range(1, len(mean) + 1), mean, label=recipe, **curve_style(i))
    ax.set(title=f"lr {lr:g}", xlabel="block", yscale="log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def study_figure(runs: list[Run], draw, ylabel: str, title: str) -> plt.Figure | None:  # noqa: ANN001
    lrs, recipes, groups = _by_lr(runs)
    if not lrs:
        return None
    fig, axes = plt.subplots(
        1, len(lrs), figsize=(4.2 * len(lrs) + 2, 4.2), sharey=True, squeeze=False
    )
    for ax, lr in zip(axes[0], lrs, strict=True):
        draw(ax, lr, recipes, groups)
    for ax in axes[0]:
        readable_log(ax)  # after every panel is drawn: the shared range is final
    axes[0][0].set_ylabel(ylabel)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        h, lab = ax.get_legend_handles_labels()
        handles += [x for x, n in zip(h, lab, strict=True) if n not in labels]
        labels += [n for n in lab if n not in labels]
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(f"{title}\n{_caption(runs)}", fontsize=10)
    fig.tight_layout()
    return fig


LOSS = (
    _loss_panel,
    "training loss (mean; band: seeds)",
    "training loss per recipe (line: mean over seeds; open markers: eval loss)",
)
DEPTH = (
    _depth_panel,
    "residual RMS (output of block)",
    "residual-stream RMS by depth at the last logged step (mean over seeds)",
)


def write_study_plots(runs: list[Run], out: Path, plateau: float | None = None) -> list[Path]:
    """study_loss.png (with the plateau when known) and study_depth.png."""
    draw, ylabel, title = LOSS
    made = [
        save(
            study_figure(runs, partial(draw, plateau=plateau), ylabel, title),
            out / "study_loss.png",
        ),
        save(study_figure(runs, *DEPTH), out / "study_depth.png"),
    ]
    return [p for p in made if p is not None]
