"""compare's PNG plots, one line per run: loss, gradient norm, residual RMS by depth at several
steps, maximum attention logit over time."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from launch.instruments.common import (  # noqa: E402
    MAX_LOGIT,
    PRE_NORM,
    RESID,
    parse_block_key,
)
from launch.report.runs import Run  # noqa: E402

DEPTH_PANELS = 4


def _clean(values: list[float]) -> list[float]:
    """Non-finite points become gaps."""
    return [v if isinstance(v, float | int) and math.isfinite(v) else math.nan for v in values]


def _line_plot(runs: list[Run], key: str, title: str, path: Path, log_y: bool) -> Path | None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    for run in runs:
        steps, values = run.series(key)
        if steps:
            ax.plot(steps, _clean(values), label=run.label, linewidth=1.2)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(title=title, xlabel="step", ylabel=key)
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _depth_steps(runs: list[Run]) -> list[int]:
    """Up to DEPTH_PANELS steps spread over the longest run's steps that logged the stream RMS."""
    steps = max(
        ([int(r["step"]) for r in run.train if run.blocks(RESID, r)] for run in runs),
        key=len,
        default=[],
    )
    if not steps:
        return []
    n = min(DEPTH_PANELS, len(steps))
    picks = [steps[round(i * (len(steps) - 1) / max(n - 1, 1))] for i in range(n)]
    return sorted(set(picks))


def _depth_plot(runs: list[Run], path: Path) -> Path | None:
    targets = _depth_steps(runs)
    if not targets:
        return None
    fig, axes = plt.subplots(1, len(targets), figsize=(4 * len(targets), 4), squeeze=False)
    for ax, target in zip(axes[0], targets, strict=True):
        for run in runs:
            rows = [r for r in run.train if run.blocks(RESID, r) and int(r["step"]) <= target]
            if rows:
                rms = run.blocks(RESID, rows[-1])
                (line,) = ax.plot(range(1, len(rms) + 1), _clean(rms), marker="o", label=run.label)
                _pre_norm_line(ax, run, rows[-1], line.get_color())
        ax.set(title=f"step {target}", xlabel="block", ylabel="residual RMS")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(
        "residual-stream RMS by depth (output of each block; dashed: post-norm blocks' sum "
        "before their closing norm)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pre_norm_line(ax: plt.Axes, run: Run, row: dict[str, float], color: str) -> None:
    """Post-LN/DeepNorm/Mix-LN post blocks: the pre-norm sum (the output is ~1 by construction)."""
    found = sorted(
        (parsed[1], value)
        for key, value in row.items()
        if (parsed := parse_block_key(key)) and parsed[0] == PRE_NORM and parsed[2] is None
    )
    if found:
        blocks = [i + 1 for i, _ in found]
        values = _clean([v for _, v in found])
        label = f"{run.label} (before norm)"
        ax.plot(blocks, values, linestyle="--", marker="x", color=color, label=label)


def write_plots(runs: list[Run], out: Path) -> list[Path]:
    made = [
        _line_plot(runs, "loss", "training loss", out / "loss.png", log_y=False),
        _line_plot(
            runs, "grad_norm", "gradient norm (before clipping)", out / "grad_norm.png", log_y=True
        ),
        _depth_plot(runs, out / "resid_rms_by_depth.png"),
        _line_plot(runs, MAX_LOGIT, "maximum attention logit", out / "max_logit.png", log_y=False),
    ]
    return [p for p in made if p is not None]
