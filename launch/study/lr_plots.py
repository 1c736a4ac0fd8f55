"""The LR-sensitivity figures: one panel per size, one line per recipe, learning rate on a log x.

lr_loss.png: final eval loss capped at l_0 (mean over seeds, bars: min..max); grid points with a
failed (diverged or stopped) seed are ringed in red; the grey dashed line is the measured l_0;
where the plateau is known, the black dashed line is the unigram plateau and the dotted one the
trained threshold below it, and a curve that did not train is labelled 'did not train' and drawn
faded (launch.lr_sensitivity.curves: Curve.trained).
lr_logits.png: top row, the max attention logit over training (mean over seeds, log y); bottom
row, the output logits' log Z = logsumexp(z): the mean over tokens at the last logged step
(solid) and the minimum over training (dotted): the output-logit divergence signal.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from normlab.launch.lr_sensitivity.curves import DID_NOT_TRAIN, Curve  # noqa: E402
from normlab.launch.metric_keys import LOGZ_MAX, LOGZ_MIN, MAX_LOGIT  # noqa: E402
from normlab.launch.report.plots import (  # noqa: E402
    curve_style,
    draw_plateau,
    readable_log,
    save,
)


def _sizes(found: list[Curve]) -> list[str]:
    return list(dict.fromkeys(c.size for c in found))


def _recipes(found: list[Curve]) -> list[str]:
    return list(dict.fromkeys(c.recipe for c in found))


def _mean(values: list[float]) -> float:
    ok = [v for v in values if math.isfinite(v)]
    return float(np.mean(ok)) if ok else math.nan


def _panels(n_rows: int, n_cols: int) -> tuple[plt.Figure, np.ndarray]:
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(4.6 * n_cols, 3.4 * n_rows), squeeze=False, sharex=True
    )
    return fig, axes


def _finish(fig: plt.Figure, axes: np.ndarray) -> None:
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False)
    fig.tight_layout()


def loss_figure(found: list[Curve]) -> plt.Figure:
    sizes, recipes = _sizes(found), _recipes(found)
    fig, axes = _panels(1, len(sizes))
    for j, size in enumerate(sizes):
        ax = axes[0, j]
        for i, recipe in enumerate(recipes):
            curve = next((c for c in found if c.recipe == recipe and c.size == size), None)
            if curve is None:
                continue
            lrs = [p.lr for p in curve.points]
            means = np.array([p.mean for p in curve.points])
            low = means - [min(p.capped) for p in curve.points]
            high = [max(p.capped) for p in curve.points] - means
            style = curve_style(i)
            untrained = curve.trained is False
            label = f"{recipe} ({DID_NOT_TRAIN})" if untrained else recipe
            ax.errorbar(
                lrs, means, yerr=[low, high], label=label, capsize=2,
                alpha=0.45 if untrained else 1.0, **style,
            )  # fmt: skip
            bad = [(p.lr, p.mean) for p in curve.points if p.failed]
            if bad:
                ax.scatter(
                    *zip(*bad, strict=True),
                    s=120,
                    facecolors="none",
                    edgecolors="red",
                    linewidths=1.5,
                    zorder=5,
                )
        l0 = _mean([c.init_loss for c in found if c.size == size])
        ax.axhline(l0, color="grey", linestyle="--", linewidth=1)
        draw_plateau(ax, next((c.plateau for c in found if c.size == size), None))
        ax.set_xscale("log")
        ax.set_title(f"size {size}" if size != "-" else "final loss")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("final eval loss, capped at l_0")
    if any(p.failed for c in found for p in c.points):
        axes[0, 0].scatter(
            [], [], s=120, facecolors="none", edgecolors="red", label="a seed failed"
        )
    axes[0, 0].plot([], [], color="grey", linestyle="--", label="l_0 (measured at init)")
    _finish(fig, axes)
    return fig


def logits_figure(found: list[Curve]) -> plt.Figure | None:
    if not any(MAX_LOGIT in p.extra for c in found for p in c.points):
        return None
    sizes, recipes = _sizes(found), _recipes(found)
    fig, axes = _panels(4, len(sizes))
    for j, size in enumerate(sizes):
        measured = False  # any positive max attention logit to draw on the log axis
        for i, recipe in enumerate(recipes):
            curve = next((c for c in found if c.recipe == recipe and c.size == size), None)
            if curve is None:
                continue
            lrs = [p.lr for p in curve.points]
            style = curve_style(i)
            line = {"color": style["color"], "marker": style["marker"]}

            def stat(key: str, curve: Curve = curve) -> list[float]:
                return [_mean(p.extra.get(key, [math.nan])) for p in curve.points]

            top_values = stat(MAX_LOGIT)
            measured |= any(math.isfinite(v) and v > 0 for v in top_values)
            axes[0, j].plot(lrs, top_values, label=recipe, **style)
            axes[1, j].plot(lrs, stat("logz_mean_final"), linestyle="-", **line)
            axes[1, j].plot(lrs, stat(LOGZ_MIN), linestyle=":", alpha=0.7, **line)
            axes[1, j].plot(lrs, stat(LOGZ_MAX), linestyle="--", alpha=0.7, **line)
            axes[2, j].plot(lrs, stat("logit_mean_final"), **style)
            axes[3, j].plot(lrs, stat("head_mean_norm_final"), **style)
        top, bottom = axes[0, j], axes[1, j]
        top.set_xscale("log")
        if measured:
            top.set_yscale("log")
            readable_log(top)
        else:  # instruments.attention_logits off: an empty log axis cannot be drawn
            top.text(0.5, 0.5, "not measured", ha="center", va="center", transform=top.transAxes)
        top.set_title(f"size {size}" if size != "-" else "max attention logit")
        top.set_ylabel("max attention logit (over training)")
        bottom.set_ylabel("log Z: final mean (solid),\nmin (dotted), max (dashed)")
        bottom.axhline(0.0, color="grey", linewidth=0.8)
        axes[2, j].set_ylabel("mean output logit (final)")
        axes[2, j].axhline(0.0, color="grey", linewidth=0.8)
        axes[3, j].set_ylabel("||mean output embedding|| (final)")
        axes[3, j].set_xlabel("learning rate")
    _finish(fig, axes)
    return fig


def write_lr_plots(found: list[Curve], out: Path) -> list[Path]:
    paths = [save(loss_figure(found), out / "lr_loss.png")]
    paths.append(save(logits_figure(found), out / "lr_logits.png"))
    return [p for p in paths if p is not None]
