"""The files of a run directory read as possibly damaged (by a crash, a full disk or a person):
each reader returns plain data or raises DamagedFile, one line naming the file and what is wrong.

What a live or crashed run leaves behind is no damage: a metrics.jsonl whose last line is cut
short, a summary.json not written yet. Bytes that are not UTF-8, a line that is not a JSON object
before the last one, a config that is not a mapping, values of the wrong type are.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml
from normlab.launch.config.loader import coerce, key_of, type_hints
from normlab.launch.config.schema import RunConfig
from normlab.launch.errors import ConfigError, NormlabError

FIX = "fix or move it"
# summary.json field -> the types it may hold (None: not measured yet)
SUMMARY_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str, type(None)),
    "status": (str,),
    "steps": (int,),
    "final_loss": (int, float, type(None)),
    "min_loss": (int, float, type(None)),
    "eval_loss": (int, float, type(None)),
    "tokens_per_s": (int, float, type(None)),
    "train_s": (int, float),
    "tokens_per_step": (int, type(None)),
    "events": (list,),  # SCIENCE.md 23.1: [{kind, step}]
}
NON_FINITE = {"nan", "inf", "-inf"}
SECTIONS = [
    f.name for f in dataclasses.fields(RunConfig) if f.name not in ("name", "run_dir")
]  # how metrics.jsonl writes non-finite floats


class DamagedFile(NormlabError):
    """A file of a run directory cannot be read as what normlab wrote there."""


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DamagedFile(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DamagedFile(
            f"{path} is damaged: bytes that are not UTF-8 text on line {line} "
            f"(byte {exc.start}); {FIX}"
        ) from None


def read_config(path: Path) -> dict[str, Any]:
    """config.yaml as a mapping whose sections are mappings."""
    try:
        data = yaml.safe_load(_text(path))
    except yaml.YAMLError as exc:
        from normlab.launch.config.loader import yaml_problem

        raise DamagedFile(f"{path} is not valid YAML ({yaml_problem(exc)}); {FIX}") from None
    if not isinstance(data, dict):
        raise DamagedFile(f"{path} holds {_kind(data)}, not a run config mapping; {FIX}")
    for key in SECTIONS:
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise DamagedFile(
                f"{path}: section '{key}' holds {_kind(data[key])}, not a mapping; {FIX}"
            )
    _check_types(path, data)
    steps = (data.get("training") or {}).get("steps", 0)
    if not _is_int(steps) or steps < 0:
        raise DamagedFile(f"{path}: training.steps is {steps!r}, not a step count; {FIX}")
    for key in ("name", "run_dir"):
        if not isinstance(data.get(key), str | None):
            raise DamagedFile(f"{path}: '{key}' is {data[key]!r}, not a string; {FIX}")
    return data


def _check_types(path: Path, data: dict[str, Any]) -> None:
    """Every value of a known key has its schema type (keys an older or newer normlab wrote, and
    this one does not know, are left alone: reports read runs of any version)."""
    hints = type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        section, hint = data.get(f.name), hints[f.name]
        if section is None or not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            continue
        inner = type_hints(hint)
        keys = {key_of(g): g.name for g in dataclasses.fields(hint)}
        for key, value in section.items():
            if key in keys:
                try:
                    coerce(value, inner[keys[key]], f"{f.name}.{key}")
                except ConfigError as exc:
                    raise DamagedFile(f"{path}: {exc}; {FIX}") from None


def read_summary(path: Path) -> dict[str, Any]:
    """summary.json ({} when the run has not written one), every known field type-checked."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise DamagedFile(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); {FIX}"
        ) from None
    if not isinstance(data, dict):
        raise DamagedFile(f"{path} holds {_kind(data)}, not a summary mapping; {FIX}")
    for key, types in SUMMARY_TYPES.items():
        value = data.get(key)
        if key in data and (isinstance(value, bool) or not isinstance(value, types)):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise DamagedFile(f"{path}: '{key}' is {value!r}, expected {want}; {FIX}")
    return data


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every row of metrics.jsonl ([] when absent); a last line cut short by a crash is left out.
    Each row is a JSON object whose `step` is a count and whose values are numbers (or the
    'nan'/'inf' strings non-finite values are written as)."""
    if not path.is_file():
        return []
    lines = _text(path).splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # half-written by a run that is running or was killed
            raise DamagedFile(f"{path} is damaged: line {number} is not JSON; {FIX}") from None
        rows.append(_check_row(path, number, row))
    return rows


def _check_row(path: Path, number: int, row: Any) -> dict[str, Any]:
    where = f"{path} is damaged: line {number}"
    if not isinstance(row, dict):
        raise DamagedFile(f"{where} holds {_kind(row)}, not a metrics row; {FIX}")
    if not _is_int(row.get("step")) or row["step"] < 0:
        raise DamagedFile(f"{where} has step {row.get('step')!r}, not a step number; {FIX}")
    for key, value in row.items():
        number_like = isinstance(value, int | float) or (
            isinstance(value, str) and value in NON_FINITE
        )
        if not number_like and value is not None:
            raise DamagedFile(f"{where}: '{key}' is {value!r}, not a number; {FIX}")
    return row


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {str(value)[:40]}"
