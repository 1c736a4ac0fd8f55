"""compare's PNG plots, one line per run: loss (with eval loss), gradient norm (with the clip
threshold), residual RMS by depth at several steps, maximum attention logit over time.

Every run gets its own colour, dash and marker so overlapping curves stay apart; legends sit
outside the data; each title names the dataset, learning rate, steps and seeds of the runs.
Where the data's unigram plateau is known (a study, quickstart), every loss figure draws it and
the line TRAINED_MARGIN below it (`draw_plateau`), and a run that did not train (its loss, l_0
when it did not complete, not <= plateau - margin) is marked '(did not train)' in the legend."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, MaxNLocator, NullFormatter  # noqa: E402
from normlab.launch.lr_sensitivity.curves import DID_NOT_TRAIN  # noqa: E402
from normlab.launch.metric_keys import (  # noqa: E402
    GRAD,  # noqa: E402
    MAX_LOGIT,
    PRE_NORM,
    RESID,
    S_MAX,  # noqa: E402
    parse_block_key,
)
from normlab.launch.report.table import dataset_label  # noqa: E402
from normlab.launch.rundir.runs import Run  # noqa: E402
from normlab.launch.stats.separation import TRAINED_MARGIN, trained  # noqa: E402

DEPTH_PANELS = 4
PLATEAU_LABEL = "unigram plateau"  # the legend label draw_plateau starts its line's with
LINESTYLES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def curve_style(i: int) -> dict[str, Any]:
    """Colour, dash and marker all change with i."""
    return {
        "color": plt.get_cmap("tab10")(i % 10),
        "linestyle": LINESTYLES[i % len(LINESTYLES)],
        "marker": MARKERS[i % len(MARKERS)],
    }


def _clean(values: list[float]) -> list[float]:
    """Non-finite points become gaps."""
    return [v if isinstance(v, float | int) and math.isfinite(v) else math.nan for v in values]


def _values(runs: list[Run], section: str, key: str) -> str:
    found = sorted({str((r.config.get(section) or {}).get(key)) for r in runs})
    return ", ".join(found)


def setting(runs: list[Run]) -> str:
    """Dataset, learning rate(s), steps and seed(s) of the runs, for a title."""
    data = ", ".join(sorted({dataset_label(r.config) for r in runs}))
    return (
        f"data {data}; lr {_values(runs, 'optim', 'lr')}; "
        f"steps {_values(runs, 'training', 'steps')}; seed {_values(runs, 'training', 'seed')}"
    )


def readable_log(ax: plt.Axes) -> None:
    """Plain numbers on a log axis ('0.4', not '4 x 10^-1'); minor labels only in a narrow range."""
    if ax.get_yscale() != "log":
        return
    low, high = ax.get_ylim()
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    narrow = low > 0 and high / low < 30
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g") if narrow else NullFormatter())


def _finish(fig: plt.Figure, ax: plt.Axes) -> plt.Figure:
    readable_log(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def draw_plateau(ax: plt.Axes, plateau: float | None) -> None:
    """The unigram plateau (dashed black) and the 'trained' threshold TRAINED_MARGIN below it
    (dotted), both labelled; nothing when the plateau is unknown."""
    if plateau is None or not math.isfinite(plateau):
        return
    ax.axhline(
        plateau, color="black", linestyle="--", linewidth=1.2,
        label=f"{PLATEAU_LABEL} {plateau:.3f}",
    )  # fmt: skip
    ax.axhline(
        plateau - TRAINED_MARGIN, color="black", linestyle=":", linewidth=1.0,
        label=f"trained below: plateau - {TRAINED_MARGIN:g}",
    )  # fmt: skip


def run_trained(run: Run, plateau: float) -> bool:
    """The run trained: it completed and its last eval loss is <= plateau - TRAINED_MARGIN
    (a run that did not complete counts as l_0, which lies above the plateau)."""
    value = run.evals[-1].get("eval_loss") if run.evals else None
    if run.summary.get("status") != "completed" or not isinstance(value, int | float):
        return False
    return trained(float(value), plateau)


def save(fig: plt.Figure | None, path: Path) -> Path | None:
    """Write a figure (legends outside the axes included) and free it; None stays None."""
    if fig is None:
        return None
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _line_plot(
    runs: list[Run],
    key: str | tuple[str, ...],
    title: str,
    ylabel: str,
    log_y: bool,
    labels: list[str] | None = None,
) -> tuple[plt.Figure, plt.Axes] | None:
    """One curve per run of `key` (a tuple: the first of its keys that the run logged);
    `labels`: the legend label of each run (default: its label)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    keys = (key,) if isinstance(key, str) else key
    for i, run in enumerate(runs):
        steps, values = next((found for k in keys if (found := run.series(k))[0]), ([], []))
        if steps:
            every = max(1, len(steps) // 10)
            ax.plot(
                steps,
                _clean(values),
                label=labels[i] if labels else run.label,
                linewidth=1.2,
                markersize=4,
                markevery=(i % every, every),
                **curve_style(i),
            )
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(title=f"{title}\n{setting(runs)}", xlabel="step", ylabel=ylabel)
    if log_y:
        ax.set_yscale("log")
    return fig, ax


def untrained_note(runs: list[Run], plateau: float | None) -> str | None:
    """One line naming the runs that did not train (None: all did, or no plateau)."""
    if plateau is None:
        return None
    out = [r.label for r in runs if not run_trained(r, plateau)]
    if not out:
        return None
    return (
        f"{DID_NOT_TRAIN} (last eval loss not <= unigram plateau {plateau:.3f} - "
        f"{TRAINED_MARGIN:g}, or the run did not complete): {', '.join(out)}"
    )


def loss_labels(runs: list[Run], plateau: float | None) -> list[str]:
    """Each run's legend label, '(did not train)' added where the plateau says so."""
    if plateau is None:
        return [r.label for r in runs]
    return [r.label + ("" if run_trained(r, plateau) else f" ({DID_NOT_TRAIN})") for r in runs]


def loss_figure(runs: list[Run], plateau: float | None = None) -> plt.Figure | None:
    """Training and eval loss per run; with `plateau`, its line and the trained threshold."""
    made = _line_plot(
        runs,
        "loss",
        "training loss (lines) and eval loss (open markers)",
        "cross-entropy (nats)",
        log_y=False,
        labels=loss_labels(runs, plateau),
    )
    if made is None:
        return None
    fig, ax = made
    for i, run in enumerate(runs):
        if run.evals:
            style = curve_style(i)
            ax.plot(
                [int(r["step"]) for r in run.evals],
                _clean([r["eval_loss"] for r in run.evals]),
                linestyle="none",
                marker=style["marker"],
                color=style["color"],
                markersize=8,
                markerfacecolor="white",
                label=f"{run.label} (eval)",
            )
    draw_plateau(ax, plateau)
    return _finish(fig, ax)


def grad_norm_figure(runs: list[Run]) -> plt.Figure | None:
    made = _line_plot(
        runs,
        GRAD,
        "global gradient norm before clipping",
        "gradient L2 norm (log scale)",
        log_y=True,
    )
    if made is None:
        return None
    fig, ax = made
    clips = sorted(
        {float((r.config.get("optim") or {}).get("grad_clip") or 0) for r in runs} - {0.0}
    )
    for clip in clips:
        ax.axhline(
            clip, color="black", linestyle=":", linewidth=1.2, label=f"clip threshold {clip:g}"
        )
    return _finish(fig, ax)


def max_logit_figure(runs: list[Run]) -> plt.Figure | None:
    made = _line_plot(
        runs,
        (MAX_LOGIT, S_MAX),  # the attention_logits instrument's, else QK-Clip's exact S_max
        "maximum attention logit (any head, any block)",
        "max q.k / sqrt(d_head)",
        log_y=False,
    )
    return None if made is None else _finish(*made)


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


def depth_figure(runs: list[Run]) -> plt.Figure | None:
    targets = _depth_steps(runs)
    if not targets:
        return None
    fig, axes = plt.subplots(
        1, len(targets), figsize=(3.6 * len(targets) + 1.5, 4), sharey=True, squeeze=False
    )
    for ax, target in zip(axes[0], targets, strict=True):
        for i, run in enumerate(runs):
            rows = [r for r in run.train if run.blocks(RESID, r) and int(r["step"]) <= target]
            if rows:
                rms = run.blocks(RESID, rows[-1])
                (line,) = ax.plot(
                    range(1, len(rms) + 1),
                    _clean(rms),
                    label=run.label,
                    markersize=4,
                    **curve_style(i),
                )
                _pre_norm_line(ax, run, rows[-1], line.get_color())
        ax.set(title=f"step {target}", xlabel="block")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in axes[0]:
        readable_log(ax)  # after every panel is drawn: the shared range is final
    axes[0][0].set_ylabel("residual RMS (output of each block)")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(
        "residual-stream RMS by depth, one y-range (x, dashed: post-norm blocks' sum before their "
        f"closing norm)\n{setting(runs)}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


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


def domain_figure(runs: list[Run]) -> plt.Figure | None:
    """Each validation domain's eval loss over steps (runs on a data.sources mixture): one
    colour per run, one line style per domain."""
    keys = list(
        dict.fromkeys(k for r in runs for row in r.evals for k in row if k.startswith("eval/"))
    )
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = ["-", "--", ":", "-."]
    for i, run in enumerate(runs):
        color = curve_style(i)["color"]
        for j, key in enumerate(keys):
            rows = [r for r in run.evals if key in r]
            if rows:
                ax.plot(
                    [int(r["step"]) for r in rows],
                    _clean([r[key] for r in rows]),
                    linestyle=styles[j % len(styles)],
                    marker="o",
                    markersize=3,
                    color=color,
                    label=f"{run.label}: {key.removeprefix('eval/')}",
                )
    ax.set(
        title=f"eval loss per validation domain\n{setting(runs)}",
        xlabel="step",
        ylabel="cross-entropy (nats)",
    )
    return _finish(fig, ax)


def write_plots(runs: list[Run], out: Path, plateau: float | None = None) -> list[Path]:
    """compare's figures; `plateau` (the data's unigram loss, when known) in loss.png."""
    made = [
        save(loss_figure(runs, plateau), out / "loss.png"),
        save(domain_figure(runs), out / "eval_by_domain.png"),
        save(grad_norm_figure(runs), out / "grad_norm.png"),
        save(depth_figure(runs), out / "resid_rms_by_depth.png"),
        save(max_logit_figure(runs), out / "max_logit.png"),
    ]
    return [p for p in made if p is not None]
