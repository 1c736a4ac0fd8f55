"""What `normlab warnings` prints and writes: a table per signal, warnings.md, warnings.json and
the recall-versus-false-alarm figure, with the words that say when no signal beats the loss."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from normlab.launch.rundir.runs import Run
from normlab.launch.warning.evaluate import (
    ALPHA,
    FA_BUDGET,
    TUNE_SEEDS,
    Result,
    RunData,
    evaluate,
    load,
)
from normlab.launch.warning.scoring import HORIZON_CAP, HORIZON_SHARE, MERGE
from normlab.launch.warning.signals import BASELINE

FIGURE = "recall_vs_false_alarms.png"
HEAD = [
    "signal", "k", "level", "events", "lead median [IQR]", "recall@1", "recall@10 [Wilson 95%]",
    "recall@50", "false / 1k healthy", "precision", "McNemar p", "McNemar p, Holm", "Wilcoxon p",
    "beats loss (Holm)",
]  # fmt: skip


def _f(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def cells(row: dict[str, Any]) -> list[str]:
    lead = (
        f"{row['lead_median']:.0f} [{row['lead_q25']:.0f}, {row['lead_q75']:.0f}]"
        if row["lead_median"] is not None
        else "-"
    )
    lo, hi = row["recall@10_ci"]
    base = row["signal"] == BASELINE
    return [
        row["signal"], f"{row['k']:g}" + ("" if row["budget_met_on_tuning"] else " (over budget)"),
        "off" if row["level"] is None else f"{row['level']:.4g}", str(row["events"]), lead,
        _f(row["recall@1"]),
        f"{_f(row['recall@10'])} [{_f(lo)}, {_f(hi)}]", _f(row["recall@50"]),
        _f(row["false_per_1000"]), _f(row["precision"]),
        "baseline" if base else _f(row["mcnemar_p"], ".3g"),
        "baseline" if base else _f(row["holm_p"], ".3g"),
        "baseline" if base else _f(row["wilcoxon_p"], ".3g"),
        "baseline" if base else ("yes" if row["beats_loss"] else "no"),
    ]  # fmt: skip


def conclusion(results: Sequence[Result], held: Sequence[RunData]) -> str:
    events = sum(r.event is not None for r in held)
    if not held:
        return f"No held-out runs (seeds other than {TUNE_SEEDS}): nothing can be reported."
    if not events:
        return "No held-out run had an event: recall cannot be measured, only false alarms."
    if not any(r.signal.name == BASELINE for r in results):
        return "The loss was not logged by every run: no baseline, no verdict."
    compared = [r for r in results if r.signal.name != BASELINE and not math.isnan(r.holm_p)]
    m = len(compared)
    raw = [r.signal.name for r in compared if r.mcnemar_p < ALPHA]
    winners = [r.signal.name for r in results if r.beats_loss]
    rule = (
        f"recall@10 higher with McNemar p < {ALPHA} after Holm over the {m} signals compared, "
        "false alarms no higher"
    )
    if not winners:
        text = (
            f"No signal warns earlier than the loss itself on these {events} held-out events "
            f"({rule})."
        )
        if raw:
            ps = ", ".join(
                f"{r.signal.name} p {r.mcnemar_p:.3g} (Holm {r.holm_p:.3g})"
                for r in compared
                if r.mcnemar_p < ALPHA
            )
            text += f" Uncorrected only, not a finding: {ps}."
        return text
    return (
        f"Warns earlier than the loss on {events} held-out events ({rule}): {', '.join(winners)}."
    )


def markdown(results: Sequence[Result], tuning: Sequence[RunData], held: Sequence[RunData]) -> str:
    rows = [r.row() for r in results]
    kinds: dict[str, int] = {}
    for r in held:
        if r.event_kind:
            kinds[r.event_kind] = kinds.get(r.event_kind, 0) + 1
    lines = [
        "# Divergence early warning (SCIENCE.md 23)",
        "",
        f"Runs: {len(tuning)} for tuning (seeds {TUNE_SEEDS}), {len(held)} held out "
        f"({sum(r.event is not None for r in held)} with an event: "
        + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none")
        + "). Every number below is from the held-out runs.",
        "",
        f"Detector: robust z of log x over the previous 100 logged values (k tuned; a level "
        f"alarm tuned too: off, SCIENCE.md 23.2's level, or a quantile of the tuning runs' "
        f"values); horizon {HORIZON_SHARE:.0%} of the run's steps (at most {HORIZON_CAP}); "
        f"alarms within {MERGE} steps merge; thresholds tuned for the best recall@10 with at "
        f"most {FA_BUDGET:g} false alarm per 1,000 healthy steps.",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
        *("| " + " | ".join(cells(r)) + " |" for r in rows),
        "",
        conclusion(results, held),
        "",
        f"![recall versus false alarms]({FIGURE})",
        "",
    ]
    return "\n".join(lines)


def plot(results: Sequence[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for r in results:
        pts = [(fa, rec) for _, fa, rec in r.curve if not (math.isnan(fa) or math.isnan(rec))]
        if pts:
            xs, ys = zip(*sorted(pts), strict=True)
            style = "k--" if r.signal.name == BASELINE else "-"
            ax.plot(xs, ys, style, marker="o", markersize=3, label=r.signal.name)
            drawn = True
    ax.axvline(FA_BUDGET, color="grey", lw=0.8)
    ax.set_xlabel("false alarms per 1,000 healthy steps (held-out seeds)")
    ax.set_ylabel("recall@10")
    ax.set_title("each point one k of the detector")
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no held-out event: no curve", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_warnings(paths: Sequence[str | Path | Run], out: str | Path) -> list[str]:
    """Evaluate the runs below `paths`; write warnings.md/json and the figure into `out`;
    return the lines to print."""
    from normlab.launch.progress import Stages

    with Stages("warnings") as stages:
        with stages.stage("reading runs") as tick:
            runs = load(paths)
            tick(len(runs))
        if not runs:
            from normlab.launch.errors import RunDirError

            raise RunDirError(f"no normlab runs under {', '.join(map(str, paths))}")
        with stages.stage("scoring signals on tuning and held-out runs", len(runs)) as tick:
            results, tuning, held = evaluate(runs)
            tick(len(runs))
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    text = markdown(results, tuning, held)
    (outdir / "warnings.md").write_text(text)
    data = {
        "tuning_runs": [r.name for r in tuning],
        "held_out_runs": [r.name for r in held],
        "signals": [r.row() for r in results],
        "curves": {r.signal.name: r.curve for r in results},
        "conclusion": conclusion(results, held),
    }
    (outdir / "warnings.json").write_text(json.dumps(data, indent=1, default=_json) + "\n")
    if results:
        plot(results, outdir / FIGURE)
    return [text, f"written: {outdir / 'warnings.md'}, warnings.json, {FIGURE}"]


def _json(x: Any) -> Any:
    return float(x)
