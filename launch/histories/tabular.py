"""JSONL and CSV histories: one row per logged step, a step column and metric columns.

JSONL: one JSON object per line, parsed by launch/json_file.py (the one JSON reader: UTF-8, no
key twice in a row); a value is a number, null (not logged at that step) or one of the strings
'nan', 'inf', '-inf' (how JSON writers spell a diverged value). A row may log some metrics only
(train and eval rows at the same step, as normlab's metrics.jsonl does); steps never go back,
and no metric is logged twice at one step. A last line cut short is a row the trainer is still
writing: left out. CSV goes through launch/csv_table.py (the one CSV reader): an empty cell is
"not logged". Anything else is one ConfigError line naming the file, the line and the key.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from normlab.launch import csv_table, json_file
from normlab.launch.errors import ConfigError
from normlab.launch.histories.history import Series, SeriesBuilder
from normlab.launch.histories.sources import STEP_COLUMNS

NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "NaN": math.nan,
             "Infinity": math.inf, "-Infinity": -math.inf}  # fmt: skip


def step_column(columns: list[str], override: str | None, path: Path) -> str:
    if override is not None:
        if override not in columns:
            raise ConfigError(f"{path}: --metric step={override}: no such column")
        return override
    found = next((c for c in STEP_COLUMNS if c in columns), None)
    if found is None:
        raise ConfigError(
            f"{path}: no step column (one of {', '.join(STEP_COLUMNS)}); name it with "
            "--metric step=COLUMN"
        )
    return found


def _value(value: Any, where: str, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str) and value in NONFINITE:
        return NONFINITE[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key!r} is {value!r}, not a number")
    return float(value)


def read_jsonl(path: Path, step_override: str | None = None) -> dict[str, Series]:
    """Every numeric key of a JSONL history as a Series over its step column; the lines are
    parsed by launch/json_file.py (the one JSON reader: UTF-8, no key twice in a row, a last line
    cut short by a writer left out)."""
    out = SeriesBuilder(path)
    step_key: str | None = None
    for number, row in json_file.read_json_lines(path, "history", ConfigError):
        where = f"{path}: line {number}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where} holds {type(row).__name__}, not an object of metrics")
        if step_key is None:
            step_key = step_column(list(row), step_override, path)
        raw_step = row.get(step_key)
        if not isinstance(raw_step, int) or not json_file.count(raw_step):  # bools refused too
            raise ConfigError(f"{where}: {step_key!r} is {raw_step!r}, not a step number")
        step = raw_step
        out.step(step, f"line {number}")
        for key, raw in row.items():
            if key == step_key or _text_column(key):
                continue
            value = _value(raw, where, key)  # a string where a number goes: refused
            if value is not None:
                out.add(key, step, value, f"line {number}")
    if step_key is None:
        raise ConfigError(f"{path}: the history has no rows")
    return out.result()


def _text_column(key: str) -> bool:
    """Keys that hold text by nature (W&B exports' run names, timestamps): skipped, not refused."""
    return key.startswith("_") or key in ("run", "name", "time", "timestamp", "datetime")


def read_csv(path: Path, step_override: str | None = None) -> dict[str, Series]:
    """Every numeric column of a CSV history (through csv_table) as a Series over its steps."""
    table = csv_table.read_table(path, "history")
    step_key = step_column(table.header, step_override, path)
    out = SeriesBuilder(path)
    for row in table.rows:
        step = csv_table.count(row[step_key], table.where(row, step_key), "a step number")
        out.step(step, row.where)
        for key in table.header:
            if key == step_key or _text_column(key):
                continue
            value = csv_table.number(
                row.get(key), table.where(row, key), empty=True, nonfinite=True
            )
            if row.get(key).strip():
                out.add(key, step, value, row.where)
    if not table.rows:
        raise ConfigError(f"{path}: the history has no rows")
    return out.result()
