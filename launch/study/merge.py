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

Before joining, launch.study.merge_checks refuses a source trained as another experiment (another
--steps or --set, another corpus): by results.csv's setup hash at each grid point, and by
compare.csv's recipe-level columns over all of them.

DIR/study.json keeps what each merge added (`merged`: runs, seeds, and the source's own time from
its study.json), and the rebuilt study.md's Setting line says it after the first run's count and
time, so the report never shows the count of the runs first trained as the count of its table.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.launch import json_file as jf
from normlab.launch.errors import ConfigError
from normlab.launch.report.compare_csv import CompareTable, read_compare
from normlab.launch.study.merge_checks import check_compare_setups, check_setups
from normlab.launch.study.run import is_number
from normlab.launch.study.study_verdicts import (
    RESULTS_CSV,
    committed_rows,
    results_of,
    write_runs,
)
from normlab.launch.verdicts.results_table import Run, read_results

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
    name_of = _point_names(spec, out)
    lines, merged = [], []
    for src in sources:
        if src.resolve() == out.resolve():
            raise ConfigError(f"--merge {src}: that is --out itself")
        new = read_results(src / RESULTS_CSV)  # ConfigError names a missing or malformed table
        check_setups(runs, new, src, out, name_of)
        more = _read_compare(src / COMPARE_CSV) if (src / COMPARE_CSV).is_file() else None
        if more is not None:
            check_compare_setups(table[1], more[1], src, out)
        added = _join_runs(runs, new, src)
        if more is not None:
            _join_compare(table, more, src)
        seeds = sorted({r.seed for r in new})
        lines.append(f"{src}: {added} of {len(new)} runs added (seeds {seeds})")
        if added:
            merged.append({"runs": added, "seeds": seeds, **_time_of(src)})
    _write_atomic(
        out / RESULTS_CSV, lambda path: write_runs(sorted(runs.values(), key=_order), path)
    )
    if table[0]:
        _write_atomic(out / COMPARE_CSV, lambda path: _write_compare(table, path))
    if merged:
        _record_merges(out / "study.json", spec.name, merged)
    return lines


def read_json(path: Path) -> dict:
    """A study's study.json through the one JSON reader ({} when absent); a damaged one is one
    ConfigError line naming it, so --merge never rewrites a record it could not read."""
    if not path.is_file():
        return {}
    found = jf.read_json(path, "study record", ConfigError, "fix or move it")
    if not isinstance(found, dict):
        raise ConfigError(f"{path}: holds {type(found).__name__}, not a study record mapping")
    return found


def _time_of(src: Path) -> dict:
    """The source study's own time (its study.json: wall_s over its invocations, jobs)."""
    record = read_json(src / "study.json")
    wall = record.get("wall_s", record.get("total_s"))
    jobs = record.get("jobs")
    found: dict = {}
    if is_number(wall):
        found["wall_s"] = float(wall)
    if isinstance(jobs, int) and not isinstance(jobs, bool):
        found["jobs"] = jobs
    return found


def _record_merges(path: Path, name: str, merged: list[dict]) -> None:
    record = read_json(path) or {"study": name}
    record["merged"] = [*record.get("merged", []), *merged]
    _write_atomic(path, lambda tmp: tmp.write_text(json.dumps(record, indent=2)))


SETTING = re.compile(r"^(Setting: .*?\d+ runs in \d+ s[^\n]*?\.)(?: Joined later[^\n]*)?$", re.M)
BASE_COUNT = re.compile(r"; (\d+) runs in \d+ s")


def setting_with_merges(text: str, record: dict) -> str:
    """study.md with its Setting line saying what `--merge` joined (study.json's `merged`):
    'Joined later with --merge: 48 runs (seeds 0 1, 917 s, 2 at a time), ...; 256 runs in all.'
    Rewritten from the first run's part each time, so a rebuild repeats it exactly."""
    merged = [m for m in record.get("merged", []) if isinstance(m, dict) and m.get("runs")]
    match = SETTING.search(text)
    if not merged or match is None:
        return text
    base = BASE_COUNT.search(match.group(1))
    parts = []
    for m in merged:
        seeds = " ".join(str(s) for s in m.get("seeds", []))
        spent = f", {m['wall_s']:.0f} s" if "wall_s" in m else ""
        jobs = f", {m['jobs']} at a time" if m.get("jobs", 1) > 1 else ""
        parts.append(f"{m['runs']} runs (seeds {seeds}{spent}{jobs})")
    total = (int(base.group(1)) if base else 0) + sum(int(m["runs"]) for m in merged)
    line = f"{match.group(1)} Joined later with `--merge`: {', '.join(parts)}; {total} runs in all."
    return text[: match.start()] + line + text[match.end() :]


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


def _point_names(spec: StudySpec, out: Path) -> Callable[[tuple[str, str, float]], str | None]:
    """(recipe, size, lr) -> a planned run directory name at that grid point; the study is
    planned on the first call (only a refusal asks), not for every merge."""

    @functools.cache
    def names() -> dict[tuple[str, str, float], str]:
        from normlab.launch.study.plan import plan

        try:
            planned = plan(spec, out)
        except ConfigError:
            return {}
        return {(p.recipe, p.size, p.lr): Path(str(p.cfg.run_dir)).name for p in planned}

    return lambda point: names().get(point)


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


def _read_compare(path: Path) -> CompareTable:
    try:
        return read_compare(path)
    except ConfigError as exc:
        raise ConfigError(f"--merge: {exc}") from None


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
