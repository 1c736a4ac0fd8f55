"""A study's size ladder (issue 31 item 5): its LR-sensitivity curves as rungs, the fits of
launch.transfer.ladder per recipe, ladder.csv, ladder.png and the study.md lines."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from normlab.launch.metric_keys import MAX_LOGIT
from normlab.launch.transfer.ladder import (
    QUANTITIES,
    Rung,
    coverage,
    fit_ladder,
    hold_out_largest,
    ladder_rows,
    rung_stats,
    write_ladder_csv,
)
from normlab.launch.transfer.transfer_verdict import (
    decide_transfer,
    transfer_lines,
    write_transfer_csv,
)

if TYPE_CHECKING:
    from normlab.launch.lr_sensitivity.curves import Curve
    from normlab.launch.stats.group_sequential import Plan

LABELS = {
    "best_loss": "best loss",
    "best_lr": "best lr",
    "lr_sensitivity": "LR sensitivity",
    MAX_LOGIT: "max attention logit",
}


def size_value(size: str | None) -> float | None:
    """The number of a study size label ('64', or 'd_model=64' as the study writes it)."""
    try:
        return float(str(size).rsplit("=", 1)[-1])
    except ValueError:
        return None


def rungs_by_recipe(curves: list[Curve]) -> dict[str, list[Rung]]:
    """Per recipe, one rung per numeric size: the seeds present at every learning rate."""
    out: dict[str, list[Rung]] = {}
    for c in curves:
        size = size_value(c.size)
        if size is None:
            continue
        common = sorted(set.intersection(*(set(p.seeds) for p in c.points)))
        if not common:
            continue
        losses = np.array([[p.capped[p.seeds.index(s)] for p in c.points] for s in common])
        logits = np.array(
            [
                [p.extra.get(MAX_LOGIT, [math.nan] * len(p.seeds))[p.seeds.index(s)]
                 for p in c.points]
                for s in common
            ]
        )  # fmt: skip
        lrs = np.array([p.lr for p in c.points])
        out.setdefault(c.recipe, []).append(Rung(size, lrs, losses, logits, tuple(common)))
    return {r: v for r, v in out.items() if len({x.size for x in v}) >= 2}


def write_ladder(
    curves: list[Curve], out: Path, target: float | None, plan: Plan | None = None
) -> list[str]:
    """ladder.csv and ladder.png for every recipe with 2+ sizes; the study.md lines ([] none);
    `plan`: the study's plan of looks, which the transfer verdict decides under."""
    ladders = rungs_by_recipe(curves)
    if not ladders:
        return []
    rows, fitted = [], {}
    for recipe, rungs in ladders.items():
        fits = fit_ladder(rungs, target=target)
        held = hold_out_largest(rungs)
        rows += ladder_rows(recipe, fits, held)
        fitted[recipe] = (rungs, fits, held)
    write_ladder_csv(rows, out / "ladder.csv")
    plot_ladder(fitted, out / "ladder.png")
    hit, decided = coverage(rows)
    lines = ["", "## Ladder fits (power laws over the size axis)", ""]
    lines += [
        "Per recipe, y = a · size^b with a 95 % bootstrap interval over seed-runs (seed noise "
        "only); the hold-out refits without the largest size and forecasts it "
        "(ladder.csv, ladder.png).",
        "",
        "| recipe | quantity | exponent b [95 %] | hold-out forecast [95 %] | measured | inside |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not math.isfinite(r["exponent"]) and r["holdout_covered"] not in (True, False):
            continue  # a quantity the runs did not log (max_logit without its instrument)
        inside = {True: "yes", False: "no"}.get(r["holdout_covered"], "-")
        shown = (
            f"{r['holdout_forecast']:.4g} [{r['holdout_lo']:.4g}, {r['holdout_hi']:.4g}]"
            if r["holdout_forecast"] != ""
            else "-"
        )
        measured = f"{r['holdout_measured']:.4g}" if r["holdout_measured"] != "" else "-"
        lines.append(
            f"| {r['recipe']} | {LABELS[r['quantity']]} | {r['exponent']:.3f} "
            f"[{r['exponent_lo']:.3f}, {r['exponent_hi']:.3f}] | {shown} | {measured} | {inside} |"
        )
    lines += ["", f"Hold-out coverage: {hit} of {decided} forecasts held their measurement.", ""]
    for r in rows:
        if r["quantity"] == "best_lr":
            lines.append(
                f"- {r['recipe']}: best-lr shift over the ladder D = {r['shift_log2']:+.2f} "
                f"octaves [{r['shift_lo']:+.2f}, {r['shift_hi']:+.2f}] (transfer: |D| <= 0.5)"
            )
    if target is not None:
        lines.append(f"Forecasts at size {target:g}: the `forecast*` columns of ladder.csv.")
    verdicts = decide_transfer(ladders, plan=plan)
    write_transfer_csv(verdicts, out / "transfer.csv")
    return [*lines, *transfer_lines(verdicts, plan)]


def plot_ladder(fitted: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def measured(q: str) -> bool:  # a quantity the runs logged (max_logit needs its instrument)
        return any(
            math.isfinite(rung_stats(r)[q]) and rung_stats(r)[q] > 0
            for rungs, _, _ in fitted.values()
            for r in rungs
        )

    shown = [q for q in QUANTITIES if measured(q)]
    fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.4), squeeze=False)
    axes = axes[0]
    for ax, q in zip(axes, shown, strict=True):
        for k, (recipe, (rungs, fits, held)) in enumerate(fitted.items()):
            colour = f"C{k}"
            xs = np.array([r.size for r in rungs])
            ys = np.array([rung_stats(r)[q] for r in rungs])
            ax.plot(xs, ys, "o", color=colour, label=recipe)
            f = fits[q]
            if math.isfinite(f.exponent):
                grid = np.geomspace(xs.min(), xs.max() * 1.5, 50)
                ax.plot(grid, f.coef * grid**f.exponent, "-", color=colour, alpha=0.6)
            for h in held:
                if h.quantity == q and math.isfinite(h.forecast):
                    lo, hi = h.forecast_ci
                    ax.errorbar([h.size * 1.05], [h.forecast], yerr=[[h.forecast - lo],
                                [hi - h.forecast]], fmt="x", color=colour, capsize=3)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(LABELS[q], fontsize=9)
        ax.set_xlabel("size")
    axes[0].legend(fontsize=7)
    fig.suptitle("ladder: points measured, lines fitted, x = hold-out forecast of the largest "
                 "size (95 % bootstrap)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
