"""One run directory as data: its config, metric rows and summary, tolerant to a run still in
progress (a half-written last line, no summary yet) or one that diverged (NaN written as strings).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.launch.errors import NormlabError
from normlab.launch.metric_keys import PRE_NORM, RESID, parse_block_key
from normlab.launch.rundir.directory import CONFIG, SUMMARY
from normlab.launch.rundir.metrics import JSONL
from normlab.launch.rundir.runfiles import read_config, read_metrics, read_summary


class NotARunError(NormlabError):
    """A directory given to compare holds no normlab run."""


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    train: list[dict[str, float]] = field(default_factory=list)  # rows with a train loss
    evals: list[dict[str, float]] = field(default_factory=list)  # rows with eval_loss

    @property
    def label(self) -> str:
        return self.path.name

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric over the logged train steps that carry it."""
        pts = [(int(r["step"]), r[key]) for r in self.train if key in r]
        return [s for s, _ in pts], [v for _, v in pts]

    def blocks(self, kind: str, row: dict[str, float]) -> list[float]:
        """Per-block values of `kind` (e.g. resid_rms) in one row, ordered by depth."""
        found = {}
        for key, value in row.items():
            parsed = parse_block_key(key)
            if parsed and parsed[0] == kind and parsed[2] is None:
                found[parsed[1]] = value
        return [found[i] for i in sorted(found)]

    def stream_rms(self, row: dict[str, float]) -> list[float]:
        """The residual stream's RMS at each block's end, before any closing norm: `pre_norm_rms`
        for post-norm blocks (their output is ~1 by construction), `resid_rms` for the others."""
        found: dict[int, dict[str, float]] = {}
        for key, value in row.items():
            parsed = parse_block_key(key)
            if parsed and parsed[0] in (RESID, PRE_NORM) and parsed[2] is None:
                found.setdefault(parsed[1], {})[parsed[0]] = value
        return [found[i].get(PRE_NORM, found[i].get(RESID, math.nan)) for i in sorted(found)]


def _float(v: Any) -> Any:
    """JSONL writes non-finite floats as 'nan'/'inf' strings; read them back as floats."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def load_run(path: str | Path) -> Run:
    """Read a run directory; NotARunError when it is not one."""
    p = Path(path)
    if not p.is_dir():
        raise NotARunError(f"{p} is not a directory")
    if not (p / CONFIG).is_file():
        raise NotARunError(f"{p} is not a normlab run (no {CONFIG}); pass run directories")
    config = read_config(p / CONFIG)  # each reader names a damaged file (summary.json is
    summary = read_summary(p / SUMMARY)  # replaced atomically: a broken one is damage)
    rows = [{k: _float(v) for k, v in r.items()} for r in read_metrics(p / JSONL)]
    return Run(
        path=p,
        config=config,
        summary=summary,
        train=[r for r in rows if "loss" in r],
        evals=[r for r in rows if "eval_loss" in r],
    )


def finite(values: list[float]) -> list[float]:
    return [v for v in values if isinstance(v, int | float) and math.isfinite(v)]


def last_logged(
    run: Run,
    kinds: Iterable[str],
    kind_of: Callable[[str], str | None],
    reduce: Callable[[str, list[float]], float],
) -> dict[str, Any]:
    """{kind: reduce(kind, its values) or None} from the last train row holding a key of any of
    `kinds` (`kind_of` maps a metric key to its kind, None for none): compare's instrument
    columns read the last logged step this way."""
    out: dict[str, Any] = dict.fromkeys(kinds)
    for row in reversed(run.train):
        per_kind: dict[str, list[float]] = {}
        for key, value in row.items():
            kind = kind_of(key)
            if kind in out:
                per_kind.setdefault(kind, []).append(float(value))
        if per_kind:
            return out | {kind: reduce(kind, values) for kind, values in per_kind.items()}
    return out
