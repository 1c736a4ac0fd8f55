"""The files of a run directory read as possibly damaged (by a crash, a full disk or a person):
each reader returns plain data or raises DamagedFile, one line naming the file and what is wrong.

What a live or crashed run leaves behind is no damage: a metrics.jsonl whose last line is cut
short, a summary.json not written yet. Bytes that are not UTF-8, a line that is not a JSON object
before the last one, a config that is not a mapping, values of the wrong type are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from normlab.launch import json_file as jf
from normlab.launch.config.loader import StrictLoader, coerce, key_of, type_hints, yaml_problem
from normlab.launch.config.schema import RunConfig
from normlab.launch.errors import ConfigError, NormlabError

FIX = "fix or move it"
# summary.json field -> (the check its value passes, what it must be); None is "not measured yet"
# where the field allows it
SUMMARY_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (lambda v: v is None or isinstance(v, str), "str or null"),
    "status": (lambda v: isinstance(v, str), "str"),
    "steps": (jf.count, "int >= 0"),
    "final_loss": (lambda v: v is None or jf.loss(v), "a loss >= 0 (nan: diverged) or null"),
    "min_loss": (lambda v: v is None or jf.loss(v), "a loss >= 0 (nan: diverged) or null"),
    "eval_loss": (lambda v: v is None or jf.loss(v), "a loss >= 0 (nan: diverged) or null"),
    "tokens_per_s": (lambda v: v is None or jf.nonnegative(v), "a number >= 0 or null"),
    "train_s": (jf.nonnegative, "a number >= 0"),
    "tokens_per_step": (lambda v: v is None or jf.count(v), "int >= 0 or null"),
    "events": (lambda v: isinstance(v, list), "a list of {kind, step}"),  # SCIENCE.md 23.1
}
LOSS_KEYS = ("loss", "eval_loss")  # metrics.jsonl keys (and eval_loss/<source>) that are losses
SECTIONS = [f.name for f in dataclasses.fields(RunConfig) if f.name not in ("name", "run_dir")]


class DamagedFile(NormlabError):
    """A file of a run directory cannot be read as what normlab wrote there."""


def _text(path: Path) -> str:
    return jf.text_of(path, "run file", lambda message: DamagedFile(f"{message}; {FIX}"))


def read_config(path: Path) -> dict[str, Any]:
    """config.yaml as a mapping whose sections are mappings."""
    try:
        data = yaml.load(_text(path), Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
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
    if not jf.count(steps):
        raise DamagedFile(f"{path}: training.steps is {steps!r}, not a step count; {FIX}")
    lr = (data.get("optim") or {}).get("lr")
    if lr is not None and not (jf.nonnegative(lr) and lr > 0):
        raise DamagedFile(f"{path}: optim.lr is {lr!r}, expected a positive number; {FIX}")
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
    """summary.json ({} when the run has not written one), every known field type- and
    range-checked (steps whole and >= 0, losses >= 0, times and rates >= 0)."""
    if not path.is_file():
        return {}
    data = jf.read_json(path, "summary", DamagedFile, FIX)
    if not isinstance(data, dict):
        raise DamagedFile(f"{path} holds {_kind(data)}, not a summary mapping; {FIX}")
    for key, (ok, want) in SUMMARY_FIELDS.items():
        if key in data and not ok(data[key]):
            raise DamagedFile(f"{path}: '{key}' is {data[key]!r}, expected {want}; {FIX}")
    for i, event in enumerate(data.get("events") or [], start=1):
        if not (isinstance(event, dict) and isinstance(event.get("kind"), str)) or not jf.count(
            event.get("step")
        ):
            raise DamagedFile(
                f"{path}: events[{i}] is {event!r}, expected {{kind: str, step: int >= 0}}; {FIX}"
            )
    return data


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every row of metrics.jsonl ([] when absent); a last line cut short by a crash is left out.
    Each row is a JSON object naming no key twice, whose `step` is an integer >= 0, whose values
    are numbers (or the 'nan'/'inf' strings non-finite values are written as) and whose losses
    are >= 0 or non-finite. A step may appear on several rows: eval rows share the train row's
    step, and a spike-policy rollback logs the steps it runs again."""
    return [row for _, row in numbered_metrics(path)]


def numbered_metrics(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """read_metrics with each row's line number in the file (1 = the first line)."""
    if not path.is_file():
        return []
    return [
        (number, _check_row(path, number, row))
        for number, row in jf.read_json_lines(path, "metrics file", DamagedFile, FIX)
    ]


def _check_row(path: Path, number: int, row: Any) -> dict[str, Any]:
    where = f"{path} is damaged: line {number}"
    if not isinstance(row, dict):
        raise DamagedFile(f"{where} holds {_kind(row)}, not a metrics row; {FIX}")
    if not jf.count(row.get("step")):
        raise DamagedFile(
            f"{where} has step {row.get('step')!r}, not a step number (an integer >= 0); {FIX}"
        )
    for key, value in row.items():
        if value is None or key == "step":
            continue
        if not jf.is_number(value):
            raise DamagedFile(f"{where}: '{key}' is {value!r}, not a number; {FIX}")
        if key.split("/")[0] in LOSS_KEYS and not jf.loss(value):
            raise DamagedFile(f"{where}: '{key}' is {value!r}, expected a loss >= 0; {FIX}")
    return row


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {str(value)[:40]}"
