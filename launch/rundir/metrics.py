"""Per-run metrics: metrics.jsonl (one object per log step), TensorBoard event files and,
with logging.wandb, a Weights & Biases run (launch/rundir/wandb_logger.py)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from normlab.launch.config import LoggingSection

JSONL = "metrics.jsonl"


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop the rows logged after `last_step` (a killed run logs past its last checkpoint) and a
    last line cut short, keeping every other line as written. Read by the one metrics reader
    (rundir/runfiles.py): damage anywhere else is refused, naming the line, before anything is
    rewritten (a resume never silently deletes a user's rows)."""
    from normlab.launch.rundir.runfiles import numbered_metrics

    rows = numbered_metrics(path)
    if not rows:
        if path.is_file() and path.stat().st_size:  # only a line cut short: nothing to keep
            path.write_text("")
        return
    lines = path.read_text(encoding="utf-8").splitlines()  # UTF-8 checked by the reader
    keep = [lines[number - 1] for number, row in rows if row["step"] <= last_step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(ln + "\n" for ln in keep))
    os.replace(tmp, path)


def last_rows(path: Path, n: int) -> list[dict[str, Any]]:
    """The last n training rows (those with a loss) of a metrics.jsonl, read through the one
    metrics reader (rundir/runfiles.py: a damaged file is one line naming it)."""
    return [row for row in read_jsonl(path) if "loss" in row][-n:] if n > 0 else []


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete row of a metrics file ([] when absent), checked by the one metrics reader
    (rundir/runfiles.read_metrics): a line cut short at the end is left out, damage refused."""
    from normlab.launch.rundir.runfiles import read_metrics

    return read_metrics(Path(path))


class MetricsWriter:
    """Writes scalars to JSONL, TensorBoard and (logging.wandb) Weights & Biases; on resume
    continues after `resume_step`. `run_config` is the resolved recipe W&B records."""

    def __init__(
        self,
        run_dir: Path,
        cfg: LoggingSection,
        resume_step: int | None,
        run_config: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self._jsonl = None
        self._tb = None
        self.wandb = None
        if cfg.wandb is not None and cfg.wandb.mode != "disabled":
            from normlab.launch.rundir.wandb_logger import WandbLogger

            self.wandb = WandbLogger(run_dir, cfg.wandb, run_config or {}, name)
        if cfg.jsonl:
            path = run_dir / JSONL
            if resume_step is not None:
                truncate_jsonl(path, resume_step)
            self._jsonl = path.open("a")
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge)

    def log(self, step: int, scalars: dict[str, float], prefix: str = "train") -> None:
        if self._jsonl is not None:
            row = {"step": step, **{k: _json_float(v) for k, v in scalars.items()}}
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in scalars.items():  # a key with its own group (eval/<source>) keeps it
                self._tb.add_scalar(key if "/" in key else f"{prefix}/{key}", value, step)
            self._tb.flush()
        if self.wandb is not None:
            self.wandb.log(step, scalars, prefix)

    def summary(self, summary: dict[str, Any]) -> None:
        """summary.json's fields, for the loggers that keep a run summary (W&B)."""
        if self.wandb is not None:
            self.wandb.summary(summary)

    def close(self, exit_code: int = 0) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self.wandb is not None:
            self.wandb.close(exit_code)


def _json_float(v: float) -> float | str:
    """JSON has no NaN/inf: write them as strings so the file stays valid JSON."""
    return v if math.isfinite(v) else str(v)
