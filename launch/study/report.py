"""The study's own report: mean and spread per (recipe, size, lr), the LR-sensitivity protocol,
the verdicts (per size), study.md and figures.

Every statistic counts a run by one rule (launch.lr_sensitivity.curves `counts_as_l0`): its final
eval loss when it completed, l_0 (its measured init_loss) when it diverged, failed or stopped.
The tables mark what did not train: per grid point the seeds that trained ('trained k/n', a
seed's loss <= plateau - TRAINED_MARGIN), per curve 'did not train'; the figures draw the
plateau and mark the same."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from normlab.data.errors import DataError
from normlab.launch.lr_sensitivity.curves import counts_as_l0, write_csvs
from normlab.launch.lr_sensitivity.protocol import (
    LOGITS_FIGURE,
    init_loss_of,
    print_sensitivity,
    protocol_curves,
    run_metrics,
    sensitivity_markdown,
)
from normlab.launch.metric_keys import MAX_LOGIT
from normlab.launch.report.domains import domain_stats
from normlab.launch.report.table import summarize
from normlab.launch.rundir.runs import Run, load_run
from normlab.launch.stats.separation import TRAINED_MARGIN, trained
from normlab.launch.study.fp8_section import fp8_section
from normlab.launch.study.lr_plots import write_lr_plots
from normlab.launch.study.plots import write_study_plots
from normlab.launch.study.sections import (
    FIGURES,
    FOOTER,
    FP8,
    GRID,
    GROWTH,
    HEAD,
    PROTOCOL,
    VERDICTS,
    Section,
    write_report,
)
from normlab.launch.study.setup import setup_of
from normlab.launch.study.study_verdicts import (
    RESULTS_CSV,
    decide_study,
    losses_at_fractions,
    print_decided,
    verdict_section,
    write_results_csv,
    write_verdicts,
)
from normlab.launch.study.unigram import runs_plateau
from normlab.launch.verdicts.growth_claims import (
    CLAIMS,
    Verdict,
    decide_all,
    group_rows,
    growth_of,
    loss_of,
    point_label,
)
from normlab.launch.warning.events import CODES
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from normlab.launch.lr_sensitivity.curves import Curve
    from normlab.launch.stats.group_sequential import Plan
    from normlab.launch.study.plan import Planned
    from normlab.launch.study.spec import StudySpec


def shown_loss(row: dict[str, Any]) -> float:
    """The eval loss as the table shows it: +inf ('failed') for a run that counts as l_0."""
    value = row.get("eval_loss")
    loss = float(value) if isinstance(value, int | float) else None
    return math.inf if counts_as_l0(row.get("status"), loss) else float(value)


# key, header, how one value is read from a row
STATS = [
    ("eval", "eval loss", shown_loss),
    ("growth", "act. growth", growth_of),
    (MAX_LOGIT, "max logit", lambda r: _num(r.get(MAX_LOGIT))),
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


def event_cell(group: list[dict[str, Any]]) -> str:
    """Seeds with each event kind (SCIENCE.md 23.1), 'E2 2/3, E1 1/3'; 'none' without any."""
    counts = {
        code: sum(kind in (r.get("event_kinds") or []) for r in group)
        for kind, code in CODES.items()
    }
    shown = [f"{code} {n}/{len(group)}" for code, n in counts.items() if n]
    return ", ".join(shown) or "none"


def trained_cell(group: list[dict[str, Any]], plateau: float) -> str:
    """'k/n' seeds that trained (loss_of <= plateau - margin), marked when not all did."""
    ok = sum(trained(loss_of(r), plateau) for r in group)
    return f"{ok}/{len(group)}" + ("" if ok == len(group) else " (did not train)")


def group_table(
    rows: list[dict[str, Any]], plateau: float | None = None
) -> tuple[list[str], list[list[str]]]:
    """Header and cells: one line per (recipe, grid point: size, lr) with every statistic over
    its seeds; with a plateau, a 'trained' column (seeds that trained)."""
    stats = STATS + domain_stats(rows)  # one column per validation domain of a mixture
    head = ["recipe", "grid point", "seeds", "non-finite", "events"]
    head += ["trained"] if plateau is not None else []
    head += [h for _, h, _ in stats]
    cells = []
    for (recipe, point), group in group_rows(rows).items():
        seeds = ",".join(str(r.get("seed")) for r in group)
        bad = sum(int(r.get("nonfinite") or 0) for r in group)
        mark = [trained_cell(group, plateau)] if plateau is not None else []
        spread = [_spread([read(r) for r in group]) for _, _, read in stats]
        cells.append(
            [recipe, point_label(point), seeds, str(bad), event_cell(group), *mark, *spread]
        )
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


def time_line(
    n: int, total_s: float, jobs: int = 1, invocations: int = 1, last_s: float | None = None
) -> str:
    """'24 runs in 2034 s (2 at a time), over 2 invocations of the command (the last 14 s).'"""
    over = (
        f", over {invocations} invocations of the command (the last {last_s:.0f} s)"
        if invocations > 1 and last_s is not None
        else ""
    )
    at_once = f" ({jobs} at a time)" if jobs > 1 else ""
    return f"{n} runs in {total_s:.0f} s{at_once}{over}."


def report_sections(
    rows: list[dict[str, Any]],
    found: list[Verdict],
    runs: list[Run],
    total_s: float,
    jobs: int = 1,
    protocol: Section | None = None,
    title: str = "normlab study",
    invocations: int = 1,
    last_s: float | None = None,
    plateau: float | None = None,
    verdicts: list[str] | None = None,
    fp8: list[str] | None = None,
) -> list[Section]:
    """study.md as its named sections (launch.study.sections), in the order the report writes
    them; a section with nothing to say has no lines."""
    head, cells = group_table(rows, plateau)
    setting = (
        f"Setting: {_setting(runs)}; {time_line(len(runs), total_s, jobs, invocations, last_s)}"
    )
    grid = [
        "## Every grid point",
        "",
        "Over seeds: mean +- sd [min, max] (eval loss: the last evaluation; 'failed': diverged, "
        "failed, stopped or never evaluated; every statistic counts such a run at l_0). "
        "Events: seeds with each event of SCIENCE.md 23.1 (E1 non-finite, E2 0.5-nat excursion "
        "for 100 steps, E3 return to the initial loss)."
        + (
            f" Trained: the seeds whose loss ended <= the unigram plateau {plateau:.3f} - "
            f"{TRAINED_MARGIN:g} nats."
            if plateau is not None
            else ""
        ),
        "",
        *_md_table(head, cells),
        "",
    ]
    return [
        Section(HEAD, [f"# {title}", "", setting, ""]),
        protocol or Section(PROTOCOL, []),
        Section(GRID, grid),
        Section(FP8, fp8 or []),
        Section(VERDICTS, verdicts or []),
        Section(GROWTH, growth_lines(found)),
        Section(FIGURES, _figures(rows)),
        Section(FOOTER, ["Every run: [compare.md](compare.md).", ""]),
    ]


def growth_lines(found: list[Verdict]) -> list[str]:
    """The descriptive growth claims' section (none without claims)."""
    if not found:
        return []
    return [
        "## Growth claims (descriptive: a per-grid-point rule, not a SCIENCE.md 22 verdict)",
        "",
        "| claim | outcome | why | numbers | rule |",
        "|---|---|---|---|---|",
        *(f"| {v.claim} | {v.word} | {v.why} | {v.numbers} | {v.rule} |" for v in found),
        "",
        "Rules: launch/verdicts/growth_claims.py (growth of groups that trained; 'not tested': "
        "its recipes were not run).",
        "",
    ]


def _figures(rows: list[dict[str, Any]]) -> list[str]:
    """The study's loss and depth figures: drawn for a study of one size only."""
    if len({r.get("size") for r in rows}) != 1:
        return []
    return [
        "![mean training loss per recipe](study_loss.png)",
        "",
        "![residual RMS by depth per recipe](study_depth.png)",
        "",
    ]


def protocol_section(
    curves: list[Curve],
    margin: float,
    out: Path,
    ladder_target: float | None,
    looks: Plan | None = None,
    left_out: list[str] | None = None,
    stale: str = "",
) -> Section:
    """The LR-sensitivity protocol's section (SCIENCE.md 19) and the size ladder's after it
    (writes ladder.csv and ladder.png where the study has 2+ sizes); `stale`: why lr_logits.png
    was not redrawn, said under it."""
    from normlab.launch.transfer.ladder_report import write_ladder

    lines = sensitivity_markdown(curves, margin, left_out)
    if stale:
        at = lines.index(LOGITS_FIGURE) + 1
        lines[at:at] = ["", f"*{stale}.*"]
    return Section(PROTOCOL, lines + write_ladder(curves, out, ladder_target, looks))


def print_verdicts(
    rows: list[dict[str, Any]],
    found: list[Verdict],
    console: Console,
    plateau: float | None = None,
) -> None:
    head, cells = group_table(rows, plateau)
    table = Table(title="normlab study: mean +- sd [min, max] over seeds")
    for h in head:
        table.add_column(h, justify="left" if h in ("recipe", "seeds") else "right")
    for c in cells:
        table.add_row(*c)
    console.print(table)
    if not found:
        return
    claims = Table(title="growth claims (descriptive, not SCIENCE.md 22)", show_lines=True)
    for h in ("claim", "verdict", "numbers", "rule"):
        claims.add_column(h)
    for v in found:
        colour = {"reproduced": "green", "not tested": "dim"}.get(v.word, "yellow")
        claims.add_row(v.claim, f"[{colour}]{v.word}[/] ({v.why})", v.numbers, v.rule)
    console.print(claims)


def _plateau(configs: list[dict[str, Any]]) -> float | None:
    """The runs' unigram plateau for the trained range; None where they have no single one (a
    mixture, several datasets) or their data is gone: the range is then left out, not guessed."""
    try:
        return runs_plateau(configs)
    except (DataError, OSError, KeyError, ValueError):
        return None


def study_plateau(configs: list[dict[str, Any]], spec: StudySpec) -> float | None:
    """The plateau the study's report and figures use, from the runs' configs (as dicts):
    required (an error when the runs have no single one) when the study decides claims, else
    None where it cannot be read."""
    if spec.protocol["claims"]:
        return runs_plateau(configs)
    return _plateau(configs)


def write_study_report(
    planned: list[Planned],
    spec: StudySpec,
    out: Path,
    total_s: float,
    console: Console,
    jobs: int = 1,
    invocations: int = 1,
    last_s: float | None = None,
    plateau: float | None = None,
) -> dict[str, Any]:
    """Read every run; the LR-sensitivity protocol, the claims (per size), study.md, figures.
    `plateau`: the data's unigram loss when the caller read it already (study_plateau).

    Returns {'verdicts': [Verdict] (descriptive growth claims), 'decided': Decided (the claims
    by SCIENCE.md 22; None when the study decides none), 'seconds': the time deciding them
    took (A/A self-test included), 'curves': [Curve]}. Rows carry the grid point (size, lr)."""
    runs = [load_run(p.cfg.run_dir) for p in planned if p.cfg.run_dir]
    rows = []
    for p, run in zip(planned, runs, strict=True):
        size = None if p.size == "-" else p.size
        rows.append(
            {
                **summarize(run),
                "recipe": p.recipe,
                "size": size,
                "lr": p.lr,
                "init_loss": init_loss_of(run),  # l_0: where a failed run counts (claims)
                "metrics": run_metrics(run),  # into results.csv: what lr_logits.png reads
                "setup": setup_of(run.config),  # into results.csv: what --merge checks
                "at": losses_at_fractions(
                    run.evals, int(run.config.get("training", {}).get("steps") or 0)
                ),
            }
        )
    found: list[Verdict] = []
    if plateau is None:  # read once: it scans the whole prepared dataset
        plateau = study_plateau([r.config for r in runs], spec)
    write_results_csv(rows, out)  # every study's runs: what `--merge` and `verdicts` read
    decided, seconds, section = None, 0.0, []
    claims = spec.claims_to_decide()
    if claims:
        assert plateau is not None
        start = time.perf_counter()
        decided = decide_study(
            rows, claims, plateau, spec.protocol["margin"], source=RESULTS_CSV, plan=spec.looks
        )
        seconds = time.perf_counter() - start
        write_verdicts(decided, out)
        section = verdict_section(decided)
        if spec.claims is None:  # the seed articles' claims: their growth claims, descriptive
            found = decide_all(rows, plateau, CLAIMS)
    print_verdicts(rows, found, console, plateau)
    if decided is not None:
        print_decided(decided, console, seconds)
    curves, protocol = [], None
    if spec.protocol["lr_sensitivity"]:
        left_out: list[str] = []
        curves = protocol_curves(planned, runs, spec.protocol["margin"], plateau, left_out)
        write_csvs(curves, out)
        write_lr_plots(curves, out)
        print_sensitivity(curves, console, left_out)
        protocol = protocol_section(
            curves,
            spec.protocol["margin"],
            out,
            spec.protocol.get("ladder_target"),
            spec.looks,
            left_out,
        )
    if len({r["size"] for r in rows}) == 1:
        write_study_plots(runs, out, plateau)
    title = f"normlab study {spec.name}" + (f": {spec.description}" if spec.description else "")
    fp8 = fp8_section(planned, out / "compare.csv")  # compare.csv: written before this report
    sections = report_sections(
        rows, found, runs, total_s, jobs, protocol, title, invocations, last_s, plateau,
        section, fp8,
    )  # fmt: skip
    write_report(out / "study.md", sections)
    return {"verdicts": found, "decided": decided, "seconds": seconds, "curves": curves}
