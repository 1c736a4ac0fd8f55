"""Per-domain validation in reports: a run trained on a `data.sources` mixture logs `eval/<name>`
for each source beside the weighted `eval_loss`. These helpers give compare's table and the
study's table one column per domain (the union over the runs shown, in first-seen order)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from normlab.launch.rundir.runs import Run

PREFIX = "eval/"


def domain_values(run: Run) -> dict[str, float]:
    """`eval/<name>` of the run's last evaluation that has them ({} for a single-source run)."""
    for row in reversed(run.evals):
        found = {k: v for k, v in row.items() if k.startswith(PREFIX)}
        if found:
            return found
    return {}


def domain_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Every `eval/<name>` key in the summary rows, in first-seen order."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update((k, None) for k in row if k.startswith(PREFIX))
    return list(keys)


def domain_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(key, header, format) of compare's per-domain columns."""
    return [(k, f"eval {k.removeprefix(PREFIX)}", ".4f") for k in domain_keys(rows)]


def domain_stats(rows: list[dict[str, Any]]) -> list[tuple[str, str, Callable[[dict], float]]]:
    """(key, header, reader) of the study's per-domain statistics (inf: diverged or missing)."""

    def reader(key: str) -> Callable[[dict], float]:
        def read(row: dict[str, Any]) -> float:
            value = row.get(key)
            if row.get("status") == "diverged" or value is None or not math.isfinite(value):
                return math.inf
            return float(value)

        return read

    return [(k, f"eval {k.removeprefix(PREFIX)}", reader(k)) for k in domain_keys(rows)]
