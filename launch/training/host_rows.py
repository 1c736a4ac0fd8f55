"""Steps' metrics on the host: one device->host copy per boundary, the finite test, log rows.

The loop keeps each step's metrics as device tensors ("pending") and copies them to the host only
on a log, eval or checkpoint step; these functions work on the copied rows.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch
from normlab.launch.metric_keys import GRAD, Z_LOSS

if TYPE_CHECKING:
    from normlab.launch.config.schema import TrainingSection


def boundaries(
    t: TrainingSection, ckpt_every: int, step: int, stop: bool, keep_step: int | None = None
) -> tuple[bool, ...]:
    """(log, eval, checkpoint): what `step` is a boundary for; a stop logs and checkpoints, and
    so does `keep_step` (WSD: the end of the stable phase, kept to extend the run from)."""
    is_log = stop or step % t.log_every == 0 or step == t.steps
    is_eval = step == t.steps or (t.eval_every > 0 and step % t.eval_every == 0)
    is_ckpt = stop or step in (t.steps, keep_step) or (ckpt_every > 0 and step % ckpt_every == 0)
    return is_log, is_eval, is_ckpt


def to_host(records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One device->host copy for every tensor of the pending steps."""
    keys = [(i, k) for i, r in enumerate(records) for k, v in r.items() if torch.is_tensor(v)]
    values = (
        torch.stack([records[i][k].detach().float().reshape(()) for i, k in keys]).tolist()
        if keys
        else []
    )
    rows = [{k: (v if not torch.is_tensor(v) else None) for k, v in r.items()} for r in records]
    for (i, k), v in zip(keys, values, strict=True):
        rows[i][k] = v
    return rows


def host_rows(
    pending: list[dict[str, Any]], mark: float, stats: dict[str, Any], tokens_per_step: int
) -> list[dict[str, float]]:
    """The pending steps on the host, each with its share of the time since `mark` (a
    perf_counter reading); the run's `stats` count that time and the steps' tokens."""
    rows = to_host(pending)
    now = time.perf_counter()
    for row in rows:
        row["step_time"] = (now - mark) / len(rows)
    stats["train_s"] += now - mark
    stats["tokens"] += tokens_per_step * len(rows)
    return rows


def is_finite(row: dict[str, float], fp16: bool) -> bool:
    """Loss must be finite; so must the grad norm, except in fp16 where the scaler skips it.
    A step the spike policy skipped changed no weight, so its values do not stop the run."""
    if row.get("skipped"):
        return True
    if not (math.isfinite(row["loss"]) and math.isfinite(row.get(Z_LOSS, 0.0))):
        return False
    return fp16 or math.isfinite(row[GRAD])


def log_row(window: list[dict[str, float]], tokens_per_step: int) -> dict[str, float]:
    """The metrics.jsonl row for the steps since the last log: the last step's values, with the
    loss (and z-loss) and the step time averaged over the window."""
    last = window[-1]
    row = {k: v for k, v in last.items() if k != "step"}
    for key in ("loss", Z_LOSS) if Z_LOSS in last else ("loss",):
        row[key] = sum(r[key] for r in window) / len(window)
    row["step_time"] = sum(r["step_time"] for r in window) / len(window)
    row["tokens_per_s"] = tokens_per_step / row["step_time"] if row["step_time"] > 0 else 0.0
    return row
