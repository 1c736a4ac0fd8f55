"""The LR-sensitivity protocol over a study's runs: points read from the run directories, the
per-curve table (terminal and study.md). The formula lives in launch.lr_sensitivity.curves.

A run counts at its final eval loss only when its status is 'completed'
(launch.lr_sensitivity.curves `counts_as_l0`; the verdicts of launch.verdicts.growth_claims use the
same rule). A curve that did not train (its best loss not <= plateau - TRAINED_MARGIN) is marked
'did not train', its stable range is empty with the reason, and it has no rank: the ranking by LR
sensitivity holds only curves that trained (a curve flat at the plateau is not insensitive)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from normlab.launch.lr_sensitivity.curves import (
    DID_NOT_TRAIN,
    PROTOCOL_LRS,
    Curve,
    Point,
    counts_as_l0,
    curves,
    ranking,
    summary_row,
)
from normlab.launch.metric_keys import (
    GRAD_RMS,
    HEAD_MEAN_NORM,
    INIT_LOSS,
    LOGIT_MEAN,
    LOGZ_MAX,
    LOGZ_MEAN,
    LOGZ_MIN,
    MAX_LOGIT,
)
from normlab.launch.rundir.metrics import JSONL, read_jsonl
from normlab.launch.rundir.runs import Run, finite
from normlab.launch.stats.separation import TRAINED_MARGIN
from rich.console import Console
from rich.table import Table


class GridRun(Protocol):
    """Where a run sits on the grid (a study's planned run has these)."""

    recipe: str
    size: Any
    lr: float
    seed: int


LOGITS_FIGURE = "![max attention logit and output log Z against learning rate](lr_logits.png)"


def init_loss_of(run: Run) -> float | None:
    """The step-0 `init_loss` the init_loss instrument logged (None: not measured)."""
    path = run.path / JSONL
    if not path.is_file():
        return None
    for row in read_jsonl(path):
        if isinstance(row, dict) and INIT_LOSS in row:
            value = row[INIT_LOSS]
            return float(value) if isinstance(value, int | float) else math.nan
    return None


def _series(run: Run, key: str) -> list[float]:
    return finite([r.get(key) for r in run.train])


def run_metrics(run: Run) -> dict[str, float]:
    """What the run's instruments measured, as the figures read it (results_table.METRICS;
    nan: not measured): max attention logit over training, log Z, mean logit, ..."""
    logits = _series(run, MAX_LOGIT)
    logz, logz_min, logz_max, logit_mean, head_mean, grad_rms = (
        _series(run, k)
        for k in (LOGZ_MEAN, LOGZ_MIN, LOGZ_MAX, LOGIT_MEAN, HEAD_MEAN_NORM, GRAD_RMS)
    )
    return {
        MAX_LOGIT: max(logits) if logits else math.nan,
        "logz_mean_final": logz[-1] if logz else math.nan,
        LOGZ_MIN: min(logz_min) if logz_min else math.nan,
        LOGZ_MAX: max(logz_max) if logz_max else math.nan,
        "logit_mean_final": logit_mean[-1] if logit_mean else math.nan,
        "head_mean_norm_final": head_mean[-1] if head_mean else math.nan,
        "grad_rms_final": grad_rms[-1] if grad_rms else math.nan,
    }


def run_point(p: GridRun, run: Run) -> Point:
    status = run.summary.get("status")
    last = run.evals[-1]["eval_loss"] if run.evals else None
    return Point(
        recipe=p.recipe,
        size=p.size,
        lr=p.lr,
        seed=p.seed,
        loss=float(last) if isinstance(last, int | float) else None,
        init_loss=init_loss_of(run),
        failed=counts_as_l0(status, float(last) if isinstance(last, int | float) else None),
        extra=run_metrics(run),
    )


def protocol_curves(
    planned: Sequence[GridRun],
    runs: list[Run],
    margin: float,
    plateau: float | None = None,
    left_out: list[str] | None = None,
) -> list[Curve]:
    """The curves of the study's runs; curves with no finite l_0 go to `left_out` as notes."""
    points = [run_point(p, r) for p, r in zip(planned, runs, strict=True)]
    return curves(points, margin, plateau, left_out)


HEAD = [
    ("recipe", "recipe"),
    ("size", "size"),
    ("lr_sensitivity", "LR sensitivity"),
    ("rank", "rank (curves that trained)"),
    ("per_seed", "per seed (mean +- sd)"),
    ("best_loss", "best loss"),
    ("best_lr", "best lr"),
    ("stable", "stable lr range"),
    ("trained", "trains at (lr)"),
    ("init_loss", "l_0 (measured)"),
    ("failed", "failed runs"),
    ("seeds", "seeds"),
]


def ranks(found: list[Curve]) -> dict[int, int]:
    """id(curve) -> its rank by LR sensitivity among the curves of its size that trained."""
    out: dict[int, int] = {}
    for size in dict.fromkeys(c.size for c in found):
        for i, c in enumerate(ranking([c for c in found if c.size == size]), start=1):
            out[id(c)] = i
    return out


def by_size(found: list[Curve]) -> Iterator[tuple[str, list[Curve]]]:
    """Per size, in first-seen order: the prefix a summary line starts with ('' for a study
    without sizes) and that size's curves."""
    for size in dict.fromkeys(c.size for c in found):
        yield (f"size {size}: " if size != "-" else ""), [c for c in found if c.size == size]


def ranking_lines(found: list[Curve]) -> list[str]:
    """One line per size: the curves that trained by LR sensitivity, then those left out."""
    lines = []
    for where, mine in by_size(found):
        ranked = ranking(mine)
        out = [c.recipe for c in mine if c.trained is False]
        text = " < ".join(f"{c.recipe} ({c.sensitivity:.3f})" for c in ranked) or "none"
        lines.append(
            f"{where}ranked by LR sensitivity (curves that trained): {text}"
            + (f"; {DID_NOT_TRAIN}, not ranked: {', '.join(out)}" if out else "")
        )
    return lines


def at_grid_edge(c: Curve) -> str | None:
    """'smallest' or 'largest' when the curve's best lr is an end of its grid of >= 3 rates
    (None otherwise, and for a curve that did not train). There the grid does not bracket the
    optimum: the loss at the best lr bounds the tuned loss from above, and a comparison "at each
    recipe's own best lr" holds on this grid only."""
    if len(c.points) < 3 or c.trained is False:
        return None
    best = c.best.lr
    return "smallest" if best == c.points[0].lr else "largest" if best == c.points[-1].lr else None


def edge_lines(found: list[Curve]) -> list[str]:
    """One line per size naming the curves whose best lr is an end of the grid."""
    lines = []
    for where, mine in by_size(found):
        edged = [(c, at_grid_edge(c)) for c in mine]
        named = [f"{c.recipe} ({c.best.lr:g}, the {end})" for c, end in edged if end]
        if named:
            lines.append(
                f"{where}best lr at an end of the grid, so the grid does not bracket the optimum "
                "and the loss there bounds the tuned loss from above (extend optim.lr past it): "
                + ", ".join(named)
            )
    return lines


def _cells(c: Curve, rank: int | None = None) -> dict[str, str]:
    row: dict[str, Any] = summary_row(c)
    sd = row["lr_sensitivity_seed_sd"]
    per_seed = f"{row['lr_sensitivity_seed_mean']}" + (f" +- {sd}" if sd != "" else "")
    return {
        "rank": str(rank)
        if rank is not None
        else ("-, " + DID_NOT_TRAIN if c.trained is False else "-"),
        "recipe": c.recipe,
        "size": c.size,
        "lr_sensitivity": f"{c.sensitivity:.3f}",
        "per_seed": per_seed,
        "best_loss": f"{c.best.mean:.3f} +- {c.best.sd:.3f}",
        "best_lr": row["best_lr"],
        "stable": (
            f"{row['stable_lr_low']} .. {row['stable_lr_high']}"
            if row["stable_lr_low"] != ""
            else f"none ({c.range_note})"
        ),
        "trained": (
            f"{row['trained_lr_low']} .. {row['trained_lr_high']}"
            if row["trained_lr_low"] != ""
            else ("nowhere" if c.plateau is not None else "-")
        ),
        "init_loss": f"{c.init_loss:.3f}",
        "failed": f"{row['failed_runs']}/{row['runs']}",
        "seeds": row["seeds"],
    }


def row_cells(c: Curve, rank: int | None = None) -> list[str]:
    """The curve's cells in the order of HEAD."""
    cells = _cells(c, rank)
    return [cells[key] for key, _ in HEAD]


def notes_of(found: list[Curve], left_out: list[str] | None = None) -> list[str]:
    """Every curve's notes (non-finite l_0) and the curves left out, one line each."""
    return [
        *(left_out or []),
        *(f"{c.recipe} at size {c.size}: {n}" for c in found for n in c.notes),
    ]


def summary_lines(found: list[Curve], left_out: list[str] | None = None) -> list[str]:
    """What follows the table: the ranking, the grid-edge curves, the notes."""
    return [*ranking_lines(found), *edge_lines(found), *notes_of(found, left_out)]


def print_sensitivity(
    found: list[Curve], console: Console, left_out: list[str] | None = None
) -> None:
    table = Table(title="LR sensitivity (SCIENCE.md 19): mean over the grid of min(l, l_0) - l*")
    for _, header in HEAD:
        table.add_column(header, justify="left" if header in ("recipe", "size") else "right")
    order = ranks(found)
    for c in found:
        table.add_row(*row_cells(c, order.get(id(c))))
    console.print(table)
    for line in summary_lines(found, left_out):
        console.print(line, highlight=False)


def sensitivity_markdown(
    found: list[Curve], margin: float, left_out: list[str] | None = None
) -> list[str]:
    """study.md's section; `margin`: the protocol's stable-range margin (nats)."""
    lrs = sorted({p.lr for c in found for p in c.points})
    order = ranks(found)
    grid = ", ".join(f"{v:g}" for v in lrs)
    same = tuple(lrs) == PROTOCOL_LRS
    note = (
        "normlab's 7-point protocol grid"
        if same
        else (
            f"not the protocol's 7-point grid {', '.join(f'{v:g}' for v in PROTOCOL_LRS)}: values "
            "compare only between studies on the same grid"
        )
    )
    lines = [
        "## LR sensitivity (SCIENCE.md 19)",
        "",
        f"Learning rates {grid} ({note}). Per grid point each seed's final eval loss is capped "
        "at l_0, the eval loss of the initialised model measured before step 0 (a diverged, failed "
        "or stopped run counts as l_0, in the verdicts too); the curve is the mean over seeds. "
        "LR sensitivity = mean "
        "over the grid - l* (the curve's minimum); 'per seed': the same from each seed's own "
        f"curve. Stable range: the widest run of grid points within {margin} "
        "nats of l* (none for a curve that trained nowhere). Trains at: the widest run of grid "
        f"points where every seed ended {TRAINED_MARGIN} nats below the data's unigram plateau"
        + (f" ({found[0].plateau:.3f})" if found and found[0].plateau is not None else "")
        + " (LR sensitivity is relative to each curve's own best: a curve that trains nowhere "
        f"is flat, so it is marked '{DID_NOT_TRAIN}' and not ranked). Raw values: "
        "[sensitivity.csv](sensitivity.csv), [sensitivity_grid.csv](sensitivity_grid.csv).",
        "",
        "| " + " | ".join(h for _, h in HEAD) + " |",
        "|" + "---|" * len(HEAD),
        *("| " + " | ".join(row_cells(c, order.get(id(c)))) + " |" for c in found),
        "",
        *(f"- {line}" for line in summary_lines(found, left_out)),
        "",
        "![final loss against learning rate](lr_loss.png)",
        "",
        LOGITS_FIGURE,
        "",
    ]
    return lines
