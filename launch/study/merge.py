"""`normlab study STUDY --report-only --out DIR --merge MORE [MORE ...]`: runs of the same study
made later (more seeds with `--seeds 2,3 --out MORE`, or on another machine) joined to DIR's
tables, after which the report is rebuilt from all of them (launch.study.rebuild).

DIR's runs are its results.csv or, for a study committed before results.csv existed, its
compare.csv with l_0 from sensitivity.csv (the rows `--report-only` reads there). Each MORE is a
study directory whose report wrote results.csv and compare.csv. A run is keyed by (recipe, size, lr,
seed) in results.csv and by its run name in compare.csv: found twice with the same values it is
kept once, so a merge can be repeated; with different values the merge is refused with one line
naming the run. DIR's tables are written only after every source has been read and checked, each
through a temporary file and a rename, so a refused or interrupted merge leaves them as they were.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.launch.errors import ConfigError
from normlab.launch.study.results_table import Run, read_results
from normlab.launch.study.study_verdicts import (
    RESULTS_CSV,
    committed_rows,
    results_of,
    write_runs,
)

if TYPE_CHECKING:
    from normlab.launch.study.spec import StudySpec

COMPARE_CSV = "compare.csv"
Key = tuple[str, str, float, int]


def merge_runs(spec: StudySpec, out: Path, sources: list[Path]) -> list[str]:
    """Join the runs of `sources` into `out`'s results.csv and compare.csv; returns one line per
    source saying what it added. ConfigError (nothing written) for a missing table or a run whose
    values differ between two tables."""
    runs = _base_runs(spec, out)
    table = _read_compare(out / COMPARE_CSV) if (out / COMPARE_CSV).is_file() else ([], {})
    lines = []
    for src in sources:
        if src.resolve() == out.resolve():
            raise ConfigError(f"--merge {src}: that is --out itself")
        new = read_results(src / RESULTS_CSV)  # ConfigError names a missing or malformed table
        added = _join_runs(runs, new, src)
        if (src / COMPARE_CSV).is_file():
            _join_compare(table, _read_compare(src / COMPARE_CSV), src)
        seeds = sorted({r.seed for r in new})
        lines.append(f"{src}: {added} of {len(new)} runs added (seeds {seeds})")
    _write_atomic(
        out / RESULTS_CSV, lambda path: write_runs(sorted(runs.values(), key=_order), path)
    )
    if table[0]:
        _write_atomic(out / COMPARE_CSV, lambda path: _write_compare(table, path))
    return lines


def _base_runs(spec: StudySpec, out: Path) -> dict[Key, Run]:
    if (out / RESULTS_CSV).is_file():
        found = read_results(out / RESULTS_CSV)
    elif (out / COMPARE_CSV).is_file():
        from normlab.launch.study.plan import plan

        found = results_of(committed_rows(plan(spec, out), out)[0])
    else:
        raise ConfigError(
            f"--merge: {out} has neither {RESULTS_CSV} nor {COMPARE_CSV}: nothing to merge into"
        )
    return {_key(r): r for r in found}


def _key(run: Run) -> Key:
    return (run.recipe, run.size, run.lr, run.seed)


def _order(run: Run) -> tuple:
    return (run.recipe, run.size, run.seed, run.lr)


def _same_run(a: Run, b: Run) -> bool:
    def same(x: float, y: float) -> bool:
        return (math.isnan(x) and math.isnan(y)) or x == y

    return a.status == b.status and same(a.eval_loss, b.eval_loss) and same(a.l0, b.l0)


def _join_runs(runs: dict[Key, Run], new: list[Run], src: Path) -> int:
    added = 0
    for run in new:
        old = runs.get(_key(run))
        if old is None:
            runs[_key(run)] = run
            added += 1
        elif not _same_run(old, run):
            raise ConfigError(
                f"--merge {src}: recipe {run.recipe} size {run.size} lr {run.lr:g} seed "
                f"{run.seed} is already in {RESULTS_CSV} with other values (eval_loss "
                f"{old.eval_loss:.6g}, {old.status} there; {run.eval_loss:.6g}, {run.status} here)"
            )
    return added


CompareTable = tuple[list[str], dict[str, dict[str, str]]]  # (columns, run name -> row)


def _read_compare(path: Path) -> CompareTable:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        columns = list(reader.fieldnames or [])
    if "run" not in columns:
        raise ConfigError(f"--merge: {path} has no column run (header row)")
    return columns, {r["run"]: r for r in rows}


def _join_compare(table: CompareTable, new: CompareTable, src: Path) -> None:
    columns, rows = table
    columns += [c for c in new[0] if c not in columns]
    for name, row in new[1].items():
        old = rows.get(name)
        if old is None:
            rows[name] = row
            continue
        differ = [c for c in row if c in old and old[c] != row[c] and c != "tokens_per_s"]
        if differ:
            raise ConfigError(
                f"--merge {src}: run {name} is already in {COMPARE_CSV} with another "
                f"{differ[0]} ({old[differ[0]]!r} there, {row[differ[0]]!r} here)"
            )


def _write_compare(table: CompareTable, path: Path) -> None:
    columns, rows = table
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, restval="")  # \r\n rows, as compare writes them
    writer.writeheader()
    for row in rows.values():
        writer.writerow(row)
    path.write_text(buffer.getvalue(), newline="")


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)`, then rename over `path`: a reader never sees half a table."""
    tmp = path.with_name(f".{path.name}.merge-tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
