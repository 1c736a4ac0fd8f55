"""compare.csv as normlab reads it back (a study's report, `--report-only`, `--merge`, the FP8
section): one reader, every value checked where it is read.

The file is what `normlab compare` writes (launch.report.table COLUMNS; an older or newer
normlab's extra columns are kept as text). Through launch.csv_table: UTF-8, a header with a `run`
column and no column twice, each run once; the losses (final, min, eval) >= 0 or nan/inf; the lr
> 0; counts (seed, steps, skipped steps, ...) whole numbers >= 0; every other numeric column a
number or nan; an empty cell is a value not measured. A bad cell is one ConfigError line naming
the file, the row, its line and the column.
"""

from __future__ import annotations

import math
from pathlib import Path

from normlab.launch import csv_table as tb
from normlab.launch.errors import ConfigError
from normlab.launch.metric_keys import MAX_LOGIT
from normlab.launch.report.table import COLUMNS

COMPARE_CSV = "compare.csv"
LOSSES = ("final_loss", "min_loss", "eval_loss")
CompareTable = tuple[list[str], dict[str, dict[str, str]]]  # (columns, run name -> row)


def _check(table: tb.Table, row: tb.Row, column: str, spec: str) -> None:
    text = row.get(column).strip()
    if not text or text == "-":
        return
    where = table.where(row, column)
    if column in LOSSES:
        tb.loss(text, where)
    elif column == "lr":
        tb.positive(text, where, "a positive learning rate")
    elif spec == "d":
        value = tb.number(text, where, minimum=0.0, what="a whole number >= 0")
        if not float(value).is_integer():
            raise ConfigError(f"{where}: {text!r} is not a whole number >= 0")
    elif spec:
        value = tb.number(text, where, nonfinite=True)
        if value == -math.inf and column != MAX_LOGIT:
            raise ConfigError(f"{where}: {text!r} is not a measurement")


def read_compare(path: str | Path) -> CompareTable:
    """(columns, run name -> cells) of a compare.csv, checked (module docstring)."""
    table = tb.read_table(path, COMPARE_CSV, ("run",), short_rows=False)  # normlab writes it whole
    specs = {key: spec for key, _, spec in COLUMNS if key in table.header}
    rows: dict[str, dict[str, str]] = {}
    first: dict[str, int] = {}
    for row in table.rows:
        name = row["run"].strip()
        if not name:
            raise ConfigError(f"{table.where(row, 'run')}: empty, a run name is needed")
        if name in rows:
            raise ConfigError(
                f"{table.where(row, 'run')}: run {name} repeats row {first[name]}"
            )
        for column, spec in specs.items():
            _check(table, row, column, spec)
        rows[name], first[name] = row.cells, row.number
    return table.header, rows
