"""The study's own report: mean and spread per (recipe, size, lr), the LR-sensitivity protocol,
the verdicts (per size), study.md and figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from normlab.launch.report.claims import (
    LOSS_MARGIN,
    Verdict,
    group_rows,
    growth_of,
    loss_of,
    verdicts,
)
from normlab.launch.report.runs import Run, load_run
from normlab.launch.report.sensitivity import write_csvs
from normlab.launch.report.study_lr_plots import write_lr_plots
from normlab.launch.report.study_plots import write_study_plots
from normlab.launch.report.study_protocol import (
    print_sensitivity,
    protocol_curves,
    sensitivity_markdown,
)
from normlab.launch.report.table import summarize
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from normlab.launch.commands.study_plan import Planned
    from normlab.launch.config.study import StudySpec

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
    """Header and cells: one line per (recipe, size, lr) with every statistic over its seeds."""
    sized = any(r.get("size", "-") != "-" for r in rows)
    head = ["recipe", *(["size"] if sized else []), "lr", "seeds", "non-finite"]
    head += [h for _, h, _ in STATS]
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for row in rows:
        key = (str(row["recipe"]), str(row.get("size", "-")), float(row["lr"]))
        groups.setdefault(key, []).append(row)
    cells = []
    for (recipe, size, lr), group in groups.items():
        seeds = ",".join(str(r.get("seed")) for r in group)
        bad = sum(int(r.get("nonfinite") or 0) for r in group)
        stats = [_spread([read(r) for r in group]) for _, _, read in STATS]
        cells.append([recipe, *([size] if sized else []), f"{lr:g}", seeds, str(bad), *stats])
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
    rows: list[dict[str, Any]],
    found: dict[str, list[Verdict]],
    runs: list[Run],
    total_s: float,
    jobs: int = 1,
    protocol: list[str] | None = None,
    title: str = "normlab study",
) -> str:
    head, cells = group_table(rows)
    lines = [
        f"# {title}",
        "",
        f"Setting: {_setting(runs)}; {len(runs)} runs in {total_s:.0f} s"
        + (f" ({jobs} at a time)." if jobs > 1 else "."),
        "",
        *(protocol or []),
        "## Every grid point",
        "",
        "Over seeds: mean +- sd [min, max] (eval loss: the last evaluation; 'failed': diverged "
        "or never evaluated).",
        "",
        *_md_table(head, cells),
        "",
    ]
    for size, verdicts_of_size in found.items():
        lines += [
            "## Verdicts" + (f" at {size}" if size != "-" else ""),
            "",
            "| claim | verdict | rule | evidence |",
            "|---|---|---|---|",
            *(
                f"| {v.claim} | **{v.verdict}** | {v.rule} | {v.evidence} |"
                for v in verdicts_of_size
            ),
            "",
        ]
    if found:
        lines += [
            f"Loss comparisons: 'higher'/'lower' need a mean gap over {LOSS_MARGIN} nats with "
            "every seed on one side; 'same' a gap within it; 'unclear' otherwise.",
            "",
        ]
    if len({r.get("size", "-") for r in rows}) == 1:
        lines += [
            "![mean training loss per recipe](study_loss.png)",
            "",
            "![residual RMS by depth per recipe](study_depth.png)",
            "",
        ]
    lines += ["Every run: [compare.md](compare.md).", ""]
    return "\n".join(lines)


def print_verdicts(
    rows: list[dict[str, Any]], found: dict[str, list[Verdict]], console: Console
) -> None:
    head, cells = group_table(rows)
    table = Table(title="normlab study: mean +- sd [min, max] over seeds")
    for h in head:
        table.add_column(h, justify="left" if h in ("recipe", "size", "seeds") else "right")
    for c in cells:
        table.add_row(*c)
    console.print(table)
    for size, verdicts_of_size in found.items():
        claims = Table(title="claims" + (f" at {size}" if size != "-" else ""), show_lines=True)
        for h in ("claim", "verdict", "rule", "evidence"):
            claims.add_column(h)
        for v in verdicts_of_size:
            colour = "green" if v.verdict == "reproduced" else "yellow"
            claims.add_row(v.claim, f"[{colour}]{v.verdict}", v.rule, v.evidence)
        console.print(claims)


def write_study_report(
    planned: list[Planned],
    spec: StudySpec,
    out: Path,
    total_s: float,
    console: Console,
    jobs: int = 1,
) -> dict[str, Any]:
    """Read every run; the LR-sensitivity protocol, the claims (per size), study.md, figures.

    Returns {'verdicts': {size: [Verdict]}, 'curves': [Curve]}."""
    runs = [load_run(p.cfg.run_dir) for p in planned if p.cfg.run_dir]
    rows = []
    for p, run in zip(planned, runs, strict=True):
        rows.append({**summarize(run), "recipe": p.recipe, "size": p.size, "lr": p.lr})
    found: dict[str, list[Verdict]] = {}
    if spec.protocol["claims"]:
        for size in dict.fromkeys(r["size"] for r in rows):
            found[size] = verdicts(group_rows([r for r in rows if r["size"] == size]))
    print_verdicts(rows, found, console)
    curves, section = [], []
    if spec.protocol["lr_sensitivity"]:
        curves = protocol_curves(planned, runs, spec.protocol["margin"])
        write_csvs(curves, out)
        write_lr_plots(curves, out)
        print_sensitivity(curves, console)
        section = sensitivity_markdown(curves, spec)
    if len({r["size"] for r in rows}) == 1:
        write_study_plots(runs, out)
    title = f"normlab study {spec.name}" + (f": {spec.description}" if spec.description else "")
    (out / "study.md").write_text(markdown(rows, found, runs, total_s, jobs, section, title))
    return {"verdicts": found, "curves": curves}
