"""The study's own report: mean and spread per (recipe, lr), the verdicts, study.md and figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from normlab.launch.report.claims import (
    Verdict,
    decide_all,
    group_rows,
    growth_of,
    loss_of,
    point_label,
)
from normlab.launch.report.runs import Run, load_run
from normlab.launch.report.study_plots import write_study_plots
from normlab.launch.report.table import summarize
from normlab.launch.report.unigram import runs_plateau
from rich.console import Console
from rich.table import Table

# key, header, how one value is read from a row
STATS = [
    ("eval", "eval loss", loss_of),
    ("growth", "act. growth", growth_of),
    ("max_logit", "max logit", lambda r: _num(r.get("max_logit"))),
    ("grad_spikes", "grad spike %", lambda r: _num(r.get("spike_grad"))),
]


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def _spread(values: list[float]) -> str:
    """'mean +- sd [min, max]' over seeds; 'inf' counts a run that did not train."""
    if not values or all(math.isnan(v) for v in values):
        return "-"
    if any(math.isinf(v) for v in values):
        ok = [v for v in values if math.isfinite(v)]
        return f"failed {len(values) - len(ok)}/{len(values)}" + (
            f", others {np.mean(ok):.3f}" if ok else ""
        )
    if len(values) == 1:
        return f"{values[0]:.3f}"
    mean, sd = np.mean(values), np.std(values, ddof=1)
    return f"{mean:.3f} +- {sd:.3f} [{min(values):.3f}, {max(values):.3f}]"


def group_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells: one line per (recipe, lr) with every statistic over its seeds."""
    head = ["recipe", "grid point", "seeds", "non-finite", *(h for _, h, _ in STATS)]
    cells = []
    for (recipe, point), group in group_rows(rows).items():
        seeds = ",".join(str(r.get("seed")) for r in group)
        bad = sum(int(r.get("nonfinite") or 0) for r in group)
        stats = [_spread([read(r) for r in group]) for _, _, read in STATS]
        cells.append([recipe, point_label(point), seeds, str(bad), *stats])
    return head, cells


def _md_table(head: list[str], cells: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(c) + " |" for c in cells),
    ]


def _setting(runs: list[Run]) -> str:
    """What every run shares: dataset, model shape, steps, batch (from the first run's config)."""
    cfg = runs[0].config
    m, d, t = cfg.get("model", {}), cfg.get("data", {}), cfg.get("training", {})
    return (
        f"dataset {d.get('dataset')}, {m.get('n_layers')} blocks of d {m.get('d_model')}, "
        f"{t.get('steps')} steps of {d.get('batch_size')} x {d.get('seq_len')} tokens"
    )


def markdown(
    rows: list[dict[str, Any]], found: list[Verdict], runs: list[Run], total_s: float, jobs: int = 1
) -> str:
    head, cells = group_table(rows)
    lines = [
        "# normlab study: the claims, decided",
        "",
        f"Setting: {_setting(runs)}; {len(runs)} runs in {total_s:.0f} s"
        + (f" ({jobs} at a time)." if jobs > 1 else "."),
        "",
        "Per recipe and learning rate, over seeds: mean +- sd [min, max] (eval loss: the last "
        "evaluation; 'failed': diverged or never evaluated).",
        "",
        *_md_table(head, cells),
        "",
        "## Verdicts",
        "",
        "| claim | verdict | why | numbers | rule |",
        "|---|---|---|---|---|",
        *(f"| {v.claim} | **{v.word}** | {v.why} | {v.numbers} | {v.rule} |" for v in found),
        "",
        "Rules: launch/report/claims.py (a claim rests only on groups that trained; 'not "
        "tested': its recipes were not run).",
        "",
        "![mean training loss per recipe](study_loss.png)",
        "",
        "![residual RMS by depth per recipe](study_depth.png)",
        "",
        "Every run: [compare.md](compare.md).",
        "",
    ]
    return "\n".join(lines)


def print_verdicts(rows: list[dict[str, Any]], found: list[Verdict], console: Console) -> None:
    head, cells = group_table(rows)
    table = Table(title="normlab study: mean +- sd [min, max] over seeds")
    for h in head:
        table.add_column(h, justify="left" if h in ("recipe", "seeds") else "right")
    for c in cells:
        table.add_row(*c)
    console.print(table)
    claims = Table(title="claims", show_lines=True)
    for h in ("claim", "verdict", "numbers", "rule"):
        claims.add_column(h)
    for v in found:
        colour = {"reproduced": "green", "not tested": "dim"}.get(v.word, "yellow")
        claims.add_row(v.claim, f"[{colour}]{v.word}[/] ({v.why})", v.numbers, v.rule)
    console.print(claims)


def write_study_report(
    run_dirs: list[str | Path], out: Path, total_s: float, console: Console, jobs: int = 1
) -> list[Verdict]:
    """Read every run, decide the claims, print them and write study.md and the two figures."""
    runs = [load_run(p) for p in run_dirs]
    rows = [summarize(r) for r in runs]
    found = decide_all(rows, runs_plateau([r.config for r in runs]))
    print_verdicts(rows, found, console)
    write_study_plots(runs, out)
    (out / "study.md").write_text(markdown(rows, found, runs, total_s, jobs))
    return found
