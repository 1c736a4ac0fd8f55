"""Small results tables for the verdict tests."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
HEADER = ["recipe", "size", "lr", "seed", "eval_loss", "status", "l0"]


def rows_of(
    recipe: str,
    losses: np.ndarray,
    lrs=LRS,
    size: str = "",
    l0: float = 10.0,
    status: dict | None = None,
) -> list[dict]:
    """One row per (seed, lr) of a (seeds, lrs) loss matrix; status {(seed, i): 'diverged'}."""
    status = status or {}
    rows = []
    for s, curve in enumerate(np.asarray(losses, dtype=float)):
        for i, (lr, loss) in enumerate(zip(lrs, curve, strict=True)):
            rows.append(
                {
                    "recipe": recipe,
                    "size": size,
                    "lr": lr,
                    "seed": s,
                    "eval_loss": loss,
                    "status": status.get((s, i), "completed"),
                    "l0": l0,
                }
            )
    return rows


def write_table(path: Path, rows: list[dict], header: list[str] | None = None) -> Path:
    header = header or list(rows[0])
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path
