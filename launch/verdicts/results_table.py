"""A table of finished runs, from any cluster, as the verdicts (SCIENCE.md 22) read it.

CSV columns (a header row; more columns are ignored):
    recipe, lr, seed, eval_loss, status     required
    size                                    optional (missing or empty: one size, shown "-")
    l0 or init_loss                         optional: the eval loss of the initialised model
    eval_loss_25, eval_loss_50, eval_loss_75  optional: eval loss at 25/50/75 % of the steps
    setup                                   optional: a hash of what defines the experiment
                                            (launch/study/setup.py), checked by --merge
    max_logit, logz_mean_final, ...         optional (METRICS): what the run's instruments
                                            measured, for the study's lr_logits.png ("nan": not
                                            measured; empty: not carried)
status is one of completed, diverged, failed, stopped. A completed run needs an eval_loss ("nan"
or "inf" is accepted: it counts as l_0); the others may leave it empty. Every value is checked
where it is read (launch.csv_table): losses are >= 0 (nan/inf: diverged), l_0 finite and > 0
(empty/nan: unknown), lr > 0, seeds integers >= 0, a norm or RMS >= 0, and a (recipe, size,
lr, seed) is there once. A malformed table raises ConfigError naming the file, the row (1 = the
first data row), its line in the file and the column.

Cells: the runs of one (recipe, size) become a (seed, lr) matrix of capped losses
`min(l, l_0)`, where a diverged, failed or stopped run, and a non-finite loss, count as `l_0`
(SCIENCE.md 19; the same rule for every statistic). A seed missing any of the cell's grid points
is left out with a note (a seed-run is the unit, 22.2). l_0 is `--l0` when given, else the mean of
the cell's finite l0 values; when it is unknown and some run needs it, the cell cannot be decided
(a note, never an exception).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from normlab.launch import csv_table as tb
from normlab.launch.errors import ConfigError
from normlab.launch.metric_keys import LOGZ_MAX, LOGZ_MIN, MAX_LOGIT

REQUIRED = ("recipe", "lr", "seed", "eval_loss", "status")
STATUSES = ("completed", "diverged", "failed", "stopped")
FRACTIONS = {0.25: "eval_loss_25", 0.5: "eval_loss_50", 0.75: "eval_loss_75"}
NO_SIZE = "-"
# per run, what the study's figures read besides the losses (launch/lr_sensitivity/protocol.py:
# run_metrics); carried through results.csv so a merged study can redraw lr_logits.png
METRICS = (
    MAX_LOGIT,  # over training
    "logz_mean_final",
    LOGZ_MIN,
    LOGZ_MAX,  # the largest log Z of any token over training: the logits' upward divergence
    "logit_mean_final",
    "head_mean_norm_final",  # ||mean output embedding|| at the end: the drift behind the mean logit
    "grad_rms_final",
)
# the METRICS that cannot be negative (a norm, an RMS); the others are logits and log Z
MINIMA = {"head_mean_norm_final": 0.0, "grad_rms_final": 0.0}


@dataclass(frozen=True)
class Run:
    recipe: str
    size: str
    lr: float
    seed: int
    eval_loss: float  # nan: none
    status: str
    l0: float  # nan: none
    at: dict[float, float] = field(default_factory=dict)  # fraction -> eval loss (nan: none)
    metrics: dict[str, float] = field(default_factory=dict)  # METRICS it carries (nan: unmeasured)
    setup: str = ""  # launch/study/setup.py's hash of its config ("": not carried)

    @property
    def failed(self) -> bool:
        return self.status != "completed" or not math.isfinite(self.eval_loss)


@dataclass
class Cell:
    """One (recipe, size): capped losses per (seed, lr), by increasing lr."""

    recipe: str
    size: str
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    loss: np.ndarray  # (n seeds, G lrs), capped at l_0; failed runs = l_0
    failed: np.ndarray  # (n, G) bool
    l0: float  # nan: unknown
    at: dict[float, np.ndarray] = field(default_factory=dict)  # fraction -> (n, G), capped
    notes: list[str] = field(default_factory=list)
    usable: bool = True  # False: l_0 unknown but needed

    @property
    def n(self) -> int:
        return len(self.seeds)


def _parse(row: tb.Row, table: tb.Table, l0_col: str | None, at_cols: dict, metrics: list) -> Run:
    def at(column: str) -> str:
        return table.where(row, column)

    recipe = row["recipe"].strip()
    if not recipe:
        raise ConfigError(f"{at('recipe')}: empty")
    lr = tb.number(row["lr"], at("lr"), what="a positive number")
    if lr <= 0:
        raise ConfigError(f"{at('lr')}: {row['lr']!r} is not a positive number")
    seed = tb.count(row["seed"], at("seed"), "an integer seed >= 0")
    status = row["status"].strip()
    if status not in STATUSES:
        raise ConfigError(f"{at('status')}: {status!r} is not one of {', '.join(STATUSES)}")
    loss = tb.loss(row["eval_loss"], at("eval_loss"), empty=status != "completed")
    l0 = tb.loss(row[l0_col], at(l0_col), empty=True) if l0_col else math.nan  # nan: unknown
    if l0_col and (l0 == 0.0 or math.isinf(l0)):
        raise ConfigError(
            f"{at(l0_col)}: {row[l0_col].strip()!r} is not an initial loss (finite and > 0, "
            "about ln V; empty or nan: unknown)"
        )
    fractions = {f: tb.loss(row[c], at(c), empty=True) for f, c in at_cols.items()}
    # an empty cell of a completed run is a loss nobody measured (no evaluation at that step), not
    # a failure: left out, so the rank flips say "not computed" instead of comparing l_0s
    fractions = {f: v for f, v in fractions.items() if math.isfinite(v) or status != "completed"}
    size = row.get("size").strip() or NO_SIZE
    # an empty cell: not carried (a table written before the column); "nan": not measured
    measured = {
        m: tb.number(row[m], at(m), nonfinite=True, minimum=MINIMA.get(m))
        for m in metrics
        if row[m].strip()
    }
    setup = row.get("setup").strip()
    return Run(recipe, size, lr, seed, loss, status, l0, fractions, measured, setup)


def read_results(path: str | Path) -> list[Run]:
    """Every run of the CSV at `path`, each value checked where it is read (launch.csv_table:
    UTF-8, the header, the row's shape; losses >= 0, l_0 > 0 or unknown, lr > 0, seeds integers
    >= 0, a (recipe, size, lr, seed) once). ConfigError names the file, the row and the column."""
    table = tb.read_table(path, "results table", REQUIRED)
    header = table.header
    l0_col = next((c for c in ("l0", "init_loss") if c in header), None)
    at_cols = {f: c for f, c in FRACTIONS.items() if c in header}
    metrics = [m for m in METRICS if m in header]
    runs = [_parse(row, table, l0_col, at_cols, metrics) for row in table.rows]
    seen: dict[tuple, int] = {}
    for row, run in zip(table.rows, runs, strict=True):
        key = (run.recipe, run.size, run.lr, run.seed)
        if key in seen:
            raise ConfigError(
                f"{table.where(row, 'seed')}: recipe {run.recipe} size {run.size} lr {run.lr:g}"
                f" seed {run.seed} repeats row {seen[key]}"
            )
        seen[key] = row.number
    if not runs:
        raise ConfigError(f"{table.path}: no runs (the table has a header and no rows)")
    return runs


def capped(loss: float, l0: float, failed: bool) -> float:
    """min(l, l_0); a failed run or a non-finite loss is l_0 (nan when l_0 is unknown)."""
    if failed or not math.isfinite(loss):
        return l0
    return min(loss, l0) if math.isfinite(l0) else loss


def build_cells(runs: list[Run], l0: float | None = None) -> dict[tuple[str, str], Cell]:
    """(recipe, size) -> Cell, in the order the recipes first appear."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.recipe, run.size), []).append(run)
    return {key: _cell(key, group, l0) for key, group in groups.items()}


def _cell(key: tuple[str, str], runs: list[Run], l0_flag: float | None) -> Cell:
    recipe, size = key
    notes: list[str] = []
    if l0_flag is not None:
        l0 = float(l0_flag)
    else:
        finite = [r.l0 for r in runs if math.isfinite(r.l0)]
        l0 = float(np.mean(finite)) if finite else math.nan
        if any(not math.isfinite(r.l0) for r in runs) and any(math.isfinite(r.l0) for r in runs):
            notes.append("some runs have no finite l0: the cell's mean l0 stands in")
    lrs = tuple(sorted({r.lr for r in runs}))
    by = {(r.seed, r.lr): r for r in runs}
    all_seeds = sorted({r.seed for r in runs})
    seeds = [s for s in all_seeds if all((s, lr) in by for lr in lrs)]
    dropped = [s for s in all_seeds if s not in seeds]
    if dropped:
        notes.append(f"seeds {' '.join(map(str, dropped))} miss grid points: left out")
    grid = [[by[(s, lr)] for lr in lrs] for s in seeds]
    failed = np.array([[r.failed for r in row] for row in grid], dtype=bool)
    failed = failed.reshape(len(seeds), len(lrs))
    loss = np.array([[capped(r.eval_loss, l0, r.failed) for r in row] for row in grid])
    loss = loss.reshape(len(seeds), len(lrs))
    usable = True
    if not math.isfinite(l0) and failed.any():
        usable = False
        notes.append(
            f"{int(failed.sum())} runs diverged, failed or stopped and l_0 is unknown "
            "(no finite l0/init_loss): pass --l0"
        )
    at = {}
    for f in FRACTIONS:
        if runs and all(f in r.at for r in runs):
            vals = [[capped(r.at[f], l0, not math.isfinite(r.at[f])) for r in row] for row in grid]
            at[f] = np.array(vals, dtype=float).reshape(len(seeds), len(lrs))
    return Cell(recipe, size, lrs, tuple(seeds), loss, failed, l0, at, notes, usable)
