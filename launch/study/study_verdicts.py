"""A study's claims decided by SCIENCE.md 22; a finished study's report rebuilt without training.

    decided = decide_study(rows, spec.claims_to_decide(), plateau, margin)  # a Decided
    section = verdict_section(decided)          # study.md's "Verdicts (SCIENCE.md 22)" lines
    rebuild(spec, out, console)                 # launch.study.rebuild: --report-only

`rows` are the study report's summary rows (recipe, size, lr, seed, eval_loss, status, init_loss,
and optionally 'at': {fraction: eval loss}); they become results_table.Run rows, so a study and
`normlab verdicts` decide the same table the same way. A run's status other than completed or
diverged (interrupted, preempted, no summary, failed) counts as "stopped"/"failed": every
statistic counts it at l_0 either way.

rebuild (launch.study.rebuild): from DIR/runs/<run> when every planned run is there (the full
report, no training); else from DIR/results.csv (the table the report writes: l_0 per run, eval
loss at 25/50/75 %); else from DIR/compare.csv (the runs' summary rows, all a study committed
before results.csv keeps), l_0 from DIR/sensitivity.csv's init_loss per (recipe, size) where it
is there. The plateau is read from the study's data. It writes verdicts.md, verdicts.json, the
LR-sensitivity summary sensitivity.csv (where l_0 is known) and the Verdicts section of
study.md. The A/A self-test (22.6, B = 2000) runs on every cell.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normlab.launch.csv_table import read_table
from normlab.launch.metric_keys import ACT_GROWTH, MAX_LOGIT
from normlab.launch.report.compare_csv import read_compare
from normlab.launch.verdicts.aa_simulation import B_DEFAULT
from normlab.launch.verdicts.decide import NOT_TESTED
from normlab.launch.verdicts.report import SHOWN, Decided, aa_line, decide_table, shown
from normlab.launch.verdicts.results_table import FRACTIONS, METRICS, NO_SIZE, Run

if TYPE_CHECKING:
    from normlab.launch.stats.group_sequential import Plan
    from normlab.launch.study.plan import Planned
    from rich.console import Console

SECTION = "## Verdicts (SCIENCE.md 22)"
STATUS = {"completed": "completed", "diverged": "diverged", "failed": "failed"}
NEAR = 0.1  # an eval counts for fraction f when its step is within 10 % of the steps of f


def status_of(status: Any) -> str:
    """A run's status as the results table knows it: interrupted, preempted or no summary is a
    stopped run, anything else unknown a failed one."""
    if status in STATUS:
        return STATUS[status]
    return "stopped" if status in ("interrupted", "preempted", "stopped") else "failed"


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def results_of(rows: list[dict[str, Any]]) -> list[Run]:
    """The study's summary rows as the verdicts' table."""
    out = []
    for r in rows:
        size = r.get("size")
        at = {f: _float(v) for f, v in (r.get("at") or {}).items()}
        metrics = {k: _float(v) for k, v in (r.get("metrics") or {}).items() if k in METRICS}
        out.append(
            Run(
                str(r["recipe"]),
                NO_SIZE if size in (None, "", "-") else str(size),
                float(r["lr"]),
                int(r["seed"]),
                _float(r.get("eval_loss")),
                status_of(r.get("status")),
                _float(r.get("init_loss")),
                at,
                metrics,
                str(r.get("setup") or ""),
            )
        )
    return out


def losses_at_fractions(evals: list[dict[str, float]], steps: int) -> dict[float, float]:
    """Eval loss at 25/50/75 % of the steps: the eval nearest each fraction, within NEAR of the
    steps; a fraction with no eval near it is left out (no rank flip is computed at it)."""
    out = {}
    for f in FRACTIONS:
        target = f * steps
        near = [e for e in evals if "step" in e and abs(e["step"] - target) <= NEAR * steps]
        if near and steps > 0:
            best = min(near, key=lambda e: abs(e["step"] - target))
            out[f] = float(best["eval_loss"])
    return out


def decide_study(
    rows: list[dict[str, Any]],
    claims: list[Any],
    plateau: float | None,
    margin: float,
    aa: int | None = B_DEFAULT,
    source: str = "the study's runs",
    plan: Plan | None = None,
) -> Decided:
    """The claims' verdicts on the study's rows, rank flips and the A/A self-test (aa: B);
    `plan`: the study file's `looks:` (launch.stats.group_sequential.Plan)."""
    return decide_table(results_of(rows), claims, plateau, None, margin, aa, source, plan=plan)


def _claim_name(v: Any) -> str:
    return v.claim or f"{v.a} vs {v.b}"


def verdict_rows(decided: Decided) -> list[list[str]]:
    """One row per verdict: claim, pair and size, statistic, verdict, expected, delta and its
    interval, level, seeds per arm for 80 % power."""
    out = []
    for v in decided.verdicts:
        lo, hi = v.interval
        if v.verdict == NOT_TESTED or math.isnan(v.delta):
            numbers, interval, level = "-", "-", "-"
        else:
            numbers = f"{v.mean_a:.3f} vs {v.mean_b:.3f} (n {v.n_a}/{v.n_b}): {v.delta:+.3f}"
            interval = f"[{_num(lo)}, {_num(hi)}]"
            level = f"{v.level:.3g}"
        need = str(v.seeds_needed) if v.seeds_needed is not None else "-"
        verdict = shown(v) + (f" ({v.note})" if v.note else "")
        expect = "any" if v.expect == "any" else f"{SHOWN[v.expect]} ({v.agrees})"
        out.append(
            [
                _claim_name(v),
                f"{v.a} vs {v.b}",
                v.size,
                v.statistic,
                verdict,
                expect,
                numbers,
                interval,
                level,
                need,
            ]
        )
    return out


HEAD = [
    "claim",
    "A vs B",
    "size",
    "statistic",
    "verdict",
    "expected",
    "mean A vs B (n): delta",
    "interval",
    "level",
    "seeds/arm for 80%",
]


def _num(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:+.3f}" if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def verdict_section(decided: Decided, growth: list[Any] | None = None) -> list[str]:
    """study.md's section: the verdict table, rank flips, the A/A self-test, where the rest is;
    `growth`: the descriptive growth claims (launch.verdicts.growth_claims Verdicts) of a study
    without claims of its own, when the report has no section of its own for them."""
    lines = [
        SECTION,
        "",
        "Each claim decided by SCIENCE.md 22 (launch/verdicts/decide.py): Welch (jackknife SE for "
        "loss_at_best_lr) or the exact permutation test (trained_range), Holm at alpha 0.05 over "
        "the claims that can be tested, margins 0.1 nats and 1 grid step; 'A lower' means A's "
        "statistic is lower. Every number, the rule and the exploratory per-point differences: "
        "[verdicts.md](verdicts.md) and verdicts.json.",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
        *("| " + " | ".join(r) + " |" for r in verdict_rows(decided)),
        "",
    ]
    flips = [f for f in decided.flips if f.flipped]
    if flips:
        lines += [
            f"Rank flip: {f.a} vs {f.b} [{f.size}] at "
            f"{', '.join(f'{int(k * 100)}%' for k in f.flipped)} of training."
            for f in flips
        ] + [""]
    elif decided.flips and all(f.note for f in decided.flips):
        lines += [f"Rank flips: not computed ({decided.flips[0].note}).", ""]
    else:
        lines += ["Rank flips (25/50/75/100 % of training): none beyond the margin.", ""]
    if decided.aa:
        worst = max(decided.aa, key=lambda r: max(r.fpr, r.fpr_gaussian))
        ok = all(r.passed for r in decided.aa)
        lines += [
            f"A/A self-test (22.6, B {worst.replicates}, {len(decided.aa)} cells x seed counts): "
            f"{'pass' if ok else 'FAIL'}; the highest false-positive rate {worst.fpr:.4f} "
            f"(Gaussian {worst.fpr_gaussian:.4f}) at {worst.recipe} [{worst.size}] n {worst.n}, "
            f"threshold {worst.threshold:.4f}.",
            "",
        ]
    if growth:
        lines += [
            "Growth claims (descriptive: a per-grid-point rule, not a SCIENCE.md 22 verdict; "
            "launch/verdicts/growth_claims.py):",
            "",
            "| claim | outcome | why | numbers |",
            "|---|---|---|---|",
            *(f"| {v.claim} | {v.word} | {v.why} | {v.numbers} |" for v in growth),
            "",
        ]
    return lines


def _read_csv(path: Path) -> list[dict[str, str]]:
    """A table the study wrote (sensitivity.csv, sensitivity_grid.csv), through the one reader."""
    return [row.cells for row in read_table(path, path.name).rows]


RESULTS_CSV = "results.csv"
RESULT_COLUMNS = [
    "recipe", "size", "lr", "seed", "eval_loss", "status", "l0", *FRACTIONS.values(), "setup",
    *METRICS,
]  # fmt: skip


def write_results_csv(rows: list[dict[str, Any]], out: Path) -> Path:
    """DIR/results.csv: the study's runs as the table `normlab verdicts` reads (and
    --report-only prefers): l_0 per run and the eval loss at 25/50/75 % for the rank flips."""
    return write_runs(results_of(rows), out / RESULTS_CSV)


def write_runs(runs: list[Run], path: Path) -> Path:
    """The runs as a results table (RESULT_COLUMNS; an unknown value is an empty cell)."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(RESULT_COLUMNS)
        for r in runs:
            at = [repr(r.at[f]) if f in r.at else "" for f in FRACTIONS]
            loss = "" if math.isnan(r.eval_loss) else repr(r.eval_loss)
            l0 = "" if math.isnan(r.l0) else repr(r.l0)
            measured = [repr(r.metrics[m]) if m in r.metrics else "" for m in METRICS]
            writer.writerow(
                [r.recipe, r.size, repr(r.lr), r.seed, loss, r.status, l0, *at, r.setup, *measured]
            )
    return path


def _measured(row: dict[str, str]) -> dict[str, float]:
    """A compare.csv row's run metrics the study report reads besides the losses."""
    return {ACT_GROWTH: _float(row.get(ACT_GROWTH)), MAX_LOGIT: _float(row.get(MAX_LOGIT))}


def results_rows(planned: list[Planned], out: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The planned runs' rows from DIR/results.csv (written by the study's report), with each
    run's activation growth and max attention logit from DIR/compare.csv where it has the run
    (results.csv holds the losses only; the ladder fits the max logit)."""
    from normlab.launch.verdicts.results_table import read_results

    runs = {(r.recipe, r.size, r.lr, r.seed): r for r in read_results(out / RESULTS_CSV)}
    compare = out / "compare.csv"
    table = {r["run"]: r for r in _read_csv(compare)} if compare.is_file() else {}
    rows, notes = [], []
    for p in planned:
        name = Path(str(p.cfg.run_dir)).name
        r = runs.get((p.recipe, p.size, float(p.lr), p.seed))
        if r is None:
            notes.append(f"{name}: not in {RESULTS_CSV} (not run)")
            continue
        measured = table.get(name, {})
        rows.append(
            {"recipe": p.recipe, "size": p.size, "lr": p.lr, "seed": p.seed,
             "eval_loss": r.eval_loss, "status": r.status, "init_loss": r.l0, "at": r.at,
             "metrics": r.metrics, **_measured(measured)}
        )  # fmt: skip
    return rows, notes


def committed_rows(planned: list[Planned], out: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The planned runs' rows from DIR/compare.csv (matched by run name), l_0 from
    DIR/sensitivity.csv where it has one; notes for what is missing."""
    table = read_compare(out / "compare.csv")[1]
    l0 = {}
    if (out / "sensitivity.csv").is_file():
        found = _read_csv(out / "sensitivity.csv")
        l0 = {(r["recipe"], r["size"]): r.get("init_loss") for r in found}
    rows, notes = [], []
    for p in planned:
        name = Path(str(p.cfg.run_dir)).name
        row = table.get(name)
        if row is None:
            notes.append(f"{name}: not in compare.csv (not run)")
            continue
        rows.append(
            {
                "recipe": p.recipe,
                "size": p.size,
                "lr": p.lr,
                "seed": p.seed,
                "eval_loss": _float(row.get("eval_loss")),
                "status": row.get("status"),
                "init_loss": _float(l0.get((p.recipe, p.size))),
                **_measured(row),
            }
        )
    if not l0 and any(status_of(r["status"]) != "completed" for r in rows):
        notes.append("l_0 unknown (no sensitivity.csv): the failed runs cannot be counted")
    return rows, notes


def protocol_csv(
    rows: list[dict[str, Any]], margin: float, plateau: float | None, out: Path
) -> list[Any] | None:
    """sensitivity.csv regenerated from the rows (l_0 known), and the loss columns of
    sensitivity_grid.csv (see `_regrid`). Returns the curves; None when l_0 is unknown."""
    from normlab.launch.lr_sensitivity.curves import SUMMARY_COLUMNS, Point, curves, summary_row

    if any(math.isnan(r["init_loss"]) for r in rows):
        return None
    points = [
        Point(
            r["recipe"],
            r["size"],
            float(r["lr"]),
            int(r["seed"]),
            r["eval_loss"],
            r["init_loss"],
            failed=status_of(r["status"]) != "completed" or not math.isfinite(r["eval_loss"]),
            extra=_figure_metrics(r),
        )
        for r in rows
    ]
    found = curves(points, margin, plateau)
    with (out / "sensitivity.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(summary_row(c) for c in found)
    if (out / "sensitivity_grid.csv").is_file():
        _regrid(found, out / "sensitivity_grid.csv")
    return found


def _figure_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A row's per-run metrics for the curves: results.csv's (METRICS), the max logit from
    compare.csv where results.csv does not carry it."""
    extra = dict(row.get("metrics") or {})
    known = math.isfinite(extra.get(MAX_LOGIT, math.nan))
    if not known and math.isfinite(row.get(MAX_LOGIT, math.nan)):
        extra[MAX_LOGIT] = row[MAX_LOGIT]
    return extra


def carries_metrics(rows: list[dict[str, Any]]) -> bool:
    """Whether every row carries every METRICS value (measured or nan), so lr_logits.png can be
    redrawn from the table without mixing runs that have them with runs that do not."""
    return bool(rows) and all(set(METRICS) <= set(r.get("metrics") or {}) for r in rows)


def _regrid(found: list[Any], path: Path) -> None:
    """sensitivity_grid.csv's per-point loss columns (seeds, mean, sd, min, max, failed) from the
    curves; the run metrics the results table does not carry (max logit, log Z, ...) are kept
    where a point's seeds are those they were measured on, and left empty where seeds were added
    (a merge), so no column mixes seeds."""
    from normlab.launch.lr_sensitivity.curves import grid_rows

    old = {(r["recipe"], r["size"], r["lr"]): r for r in _read_csv(path)}
    columns = read_table(path, path.name).header
    rows = []
    for c in found:
        for row in grid_rows(c):
            before = old.get((row["recipe"], row["size"], row["lr"]), {})
            same = before.get("seeds") == row["seeds"]
            rows.append({k: before.get(k, "") if same else "" for k in columns} | row)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, columns, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_verdicts(decided: Decided, out: Path) -> None:
    """verdicts.md (no timings: rebuilt files must match byte for byte) and verdicts.json."""
    (out / "verdicts.md").write_text(decided.markdown(timed=False))
    (out / "verdicts.json").write_text(decided.json())


def print_decided(decided: Decided, console: Console, seconds: float) -> None:
    for text in decided.lines():
        console.print(text, highlight=False, markup=False)
    console.print(
        f"decided {len(decided.verdicts)} claims in {seconds:.2f} s (A/A self-test "
        f"{decided.aa_seconds:.2f} s of it)",
        highlight=False,
    )


__all__ = ["aa_line", "decide_study", "verdict_section"]
