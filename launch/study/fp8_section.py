"""study.md's FP8 section (issue 33 item 3): what the fp8 instrument (launch/instruments/fp8.py)
saw, per recipe and grid point, seed by seed.

Each cell is compare's column for one run (launch/report/fp8_columns.py): the value at the last
logged step, the largest over the converted layers (underflow, beyond 448, input amax) or over the
blocks (kurtosis), because FP8 breaks at its worst layer. Seeds are not averaged: a share that is
zero on one seed and 0.6 on the other is the finding, and a mean would hide it. Built from
DIR/compare.csv, so the study's report and `--report-only` (which rebuilds from the committed
compare.csv) write the same lines.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.launch.report.compare_csv import read_compare
from normlab.launch.report.fp8_columns import FP8_COLUMNS
from normlab.launch.verdicts.growth_claims import point_label, point_of

if TYPE_CHECKING:
    from normlab.launch.study.plan import Planned

HEAD = "## FP8 casts and outliers (instruments.fp8)"


def _cell(value: str | None, fmt: str) -> str:
    try:
        x = float(value) if value not in (None, "") else math.nan
    except ValueError:
        return "-"
    return "-" if math.isnan(x) else format(x, fmt)


def fp8_section(planned: list[Planned], compare_csv: Path) -> list[str]:
    """The section's lines (none when no run of the study logged an FP8 statistic)."""
    if not compare_csv.is_file():
        return []
    by_run = read_compare(compare_csv)[1]
    groups: dict[tuple[str, str], list[tuple[int, dict[str, str]]]] = {}
    for p in planned:
        row = by_run.get(Path(str(p.cfg.run_dir)).name)
        if row is not None:
            size = None if p.size == "-" else p.size
            point = point_label(point_of({"size": size, "lr": float(p.lr)}))
            groups.setdefault((p.recipe, point), []).append((p.seed, row))
    rows = [
        (recipe, point, seeds)
        for (recipe, point), seeds in groups.items()
        if any(_cell(r.get(k), ".3g") != "-" for _, r in seeds for k in FP8_COLUMNS)
    ]
    if not rows:
        return []
    names = [label for label, _ in FP8_COLUMNS.values()]
    lines = [
        HEAD,
        "",
        "Per seed (in the seeds' order), at the last logged step: the largest value over the "
        "converted linear layers (underflow: the share of nonzero elements cast to zero; >448: "
        "the share beyond e4m3's largest normal at unit scale; the input amax) and over the "
        "blocks (kurtosis of the SwiGLU product and of the block outputs; 3 for a Gaussian). '-': "
        "not logged (a bf16 arm has no casts, but its kurtosis is measured). From compare.csv.",
        "",
        "| recipe | grid point | seeds | " + " | ".join(names) + " |",
        "|" + "---|" * (3 + len(names)),
    ]
    for recipe, point, seeds in rows:
        cells = [
            ", ".join(_cell(r.get(key), fmt) for _, r in seeds)
            for key, (_, fmt) in FP8_COLUMNS.items()
        ]
        ids = ",".join(str(s) for s, _ in seeds)
        lines.append(f"| {recipe} | {point} | {ids} | " + " | ".join(cells) + " |")
    return [*lines, ""]
