"""One training history as the analyses read it: steps and named metric series.

A reader (tensorboard.py, tabular.py, normlab_run.py) returns every numeric column of a file as a
`Series` (strictly increasing steps, float values, NaN/inf kept: a diverged run logs them); the
source mapping (sources.py) then names the columns the analyses need (loss, grad_norm, lr,
eval_loss, ...) and `History` keeps those, under normlab's names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from normlab.launch.errors import ConfigError
from normlab.launch.histories.sources import LOSS, LR, resolve


@dataclass(frozen=True)
class Series:
    """(step, value) pairs of one metric; steps strictly increase."""

    steps: tuple[int, ...]
    values: tuple[float, ...]

    def at(self) -> dict[int, float]:
        return dict(zip(self.steps, self.values, strict=True))


@dataclass(frozen=True)
class History:
    """A run's logged metrics under normlab's names (`series['loss']` always there).

    `warmup_steps`: the first step at which the logged lr reaches its largest value (a linear
    warm-up of W steps peaks at step W), 0 when no lr is logged; a normlab run's own config.
    `fp16`: an infinite grad norm is a loss-scaler skip, not a failure (E1 reads the loss only).
    """

    path: Path
    kind: str  # normlab | tensorboard | jsonl | csv
    source: str  # the mapping used (sources.SOURCES), "normlab" for a normlab run
    names: dict[str, str]  # normlab name -> the column it was read from
    series: dict[str, Series]
    warmup_steps: int = 0
    fp16: bool = False
    total_steps: int | None = None  # a normlab run's configured length (None: not known)
    seed: int | None = None
    init_loss: float | None = None

    @property
    def label(self) -> str:
        return self.path.stem if self.path.is_file() else self.path.name

    @property
    def loss(self) -> Series:
        return self.series[LOSS]

    def get(self, name: str) -> Series | None:
        return self.series.get(name)


def seed_of(path: Path) -> int | None:
    """The seed a path names (`.../seed3/...`, `run_seed3.jsonl`, `..._s3`), else None."""
    parts = [*path.parts[:-1], path.stem if path.suffix in (".jsonl", ".csv") else path.name]
    for part in reversed(parts):
        found = re.search(r"seed[_=-]?(\d+)", part) or re.search(r"(?:^|[_-])s(\d+)$", part)
        if found:
            return int(found.group(1))
    return None


def lr_of(path: Path) -> float | None:
    """The learning rate a path names (`.../lr3e-4/...`, `run_lr0.01.jsonl`), else None."""
    parts = [*path.parts[:-1], path.stem if path.suffix in (".jsonl", ".csv") else path.name]
    for part in reversed(parts):
        found = re.search(r"(?:^|[_-])lr[_=-]?(\d+(?:\.\d*)?(?:e-?\d+)?)(?:$|[_-])", part)
        if found:
            return float(found.group(1))
    return None


def warmup_from_lr(lr: Series | None) -> int:
    """The step at which the logged lr first reaches its maximum (0: no lr logged)."""
    if lr is None:
        return 0
    finite = [(s, v) for s, v in zip(lr.steps, lr.values, strict=True) if math.isfinite(v)]
    if not finite:
        return 0
    top = max(v for _, v in finite)
    return next(s for s, v in finite if v >= top)


def build(
    path: Path,
    kind: str,
    columns: Mapping[str, Series],
    source: str,
    overrides: Mapping[str, str],
    fp16: bool = False,
) -> History:
    """The History of a file's `columns` named through `source`'s mapping and --metric."""
    used, names = resolve(list(columns), source, overrides, str(path))
    series = {name: columns[col] for name, col in names.items()}
    if not series[LOSS].steps:
        raise ConfigError(f"{path}: the loss ({names[LOSS]!r}) has no values")
    init = series.pop("init_loss", None)
    return History(
        path=path,
        kind=kind,
        source=used,
        names=names,
        series=series,
        warmup_steps=warmup_from_lr(series.get(LR)),
        fp16=fp16,
        seed=seed_of(path),
        init_loss=init.values[0] if init is not None and init.values else None,
    )


class SeriesBuilder:
    """Collects a file's columns row by row, refusing a step that goes back or repeats within a
    column (`where` names the row in the message)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.columns: dict[str, tuple[list[int], list[float]]] = {}
        self.last_step = -1

    def step(self, step: int, where: str) -> None:
        if step < self.last_step:
            raise ConfigError(
                f"{self.path}: {where}: step {step} comes after step {self.last_step}; a history "
                "needs steps in increasing order (one run, not several appended)"
            )
        self.last_step = step

    def add(self, column: str, step: int, value: float, where: str) -> None:
        steps, values = self.columns.setdefault(column, ([], []))
        if steps and steps[-1] == step:
            raise ConfigError(
                f"{self.path}: {where}: step {step} logs {column!r} a second time (a duplicate "
                "step)"
            )
        steps.append(step)
        values.append(value)

    def result(self) -> dict[str, Series]:
        return {c: Series(tuple(s), tuple(v)) for c, (s, v) in self.columns.items()}
