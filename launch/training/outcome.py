"""How a run ended, in words and in summary.json: the summary's fields, the divergence line."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from normlab.launch.metric_keys import GRAD

if TYPE_CHECKING:
    from normlab.launch.config import RunConfig


class SummarisedRun(Protocol):
    """What summary.json needs of a trainer (the rest it reads where the trainer has it)."""

    cfg: RunConfig
    step: int
    stats: dict[str, Any]


def summary_of(name: str, status: str, step: int, stats: dict[str, Any], **extra: Any) -> dict:
    """summary.json: status, the last completed step, losses and throughput so far."""
    return {
        "name": name,
        "status": status,
        "steps": step,
        "final_loss": stats["loss"],
        "min_loss": stats["min_loss"] if math.isfinite(stats["min_loss"]) else None,
        "eval_loss": stats["eval_loss"],
        "eval_by_source": stats.get("eval_by_source"),  # mixtures: each source's eval loss
        "tokens_per_s": stats["tokens"] / stats["train_s"] if stats["train_s"] > 0 else None,
        "train_s": round(stats["train_s"], 3),
        **extra,
    }


def divergence_message(row: dict[str, float], last_checkpoint: Path | None) -> str:
    """The line printed (and kept in summary.json) when a step's loss or grad norm is not finite."""
    kept = (
        f"last good checkpoint kept: {last_checkpoint}"
        if last_checkpoint
        else "no checkpoint was saved"
    )
    key = "loss" if not math.isfinite(row["loss"]) else GRAD
    return (
        f"non-finite {key} ({row[key]}) at step {int(row['step'])}: stopping; {kept}. "
        "Lower optim.lr or lengthen schedule.warmup_steps"
    )


def fresh_stats() -> dict[str, Any]:
    """The statistics a run starts with (a checkpoint carries them on)."""
    return {"min_loss": math.inf, "loss": None, "eval_loss": None, "tokens": 0, "train_s": 0.0}


def run_summary(trainer: SummarisedRun, status: str, **extra: Any) -> dict[str, Any]:
    """summary.json of a trainer now: the stats, tokens per step and per source, the throughput
    (MFU) and, passed on to the metrics loggers (W&B), the same dict."""
    extra.setdefault("tokens_per_step", getattr(trainer, "tokens_per_step", None))  # compare
    extra.setdefault("ranks", trainer.stats.get("ranks"))  # [[first step, ranks], ...]
    if hasattr(trainer, "loader"):
        extra = {"tokens_by_source": trainer.loader.tokens_seen(), **extra}
    summary = summary_of(trainer.cfg.name, status, trainer.step, trainer.stats, **extra)
    if hasattr(trainer, "throughput"):
        summary.update(trainer.throughput.summary(summary["tokens_per_s"]))
    events = logged_events(trainer)
    if events is not None:
        summary["events"] = [e.to_dict() for e in events]
    if getattr(trainer, "metrics", None) is not None:
        trainer.metrics.summary(summary)
    return summary


def logged_events(trainer: Any) -> list[Any] | None:
    """The run's events so far (SCIENCE.md 23.1) from its metrics.jsonl, on the rank that writes
    it; None where no file is written (logging.jsonl off, other ranks)."""
    from normlab.launch.rundir.metrics import JSONL, read_jsonl
    from normlab.launch.warning.events import run_events

    path = Path(getattr(trainer, "run_dir", "")) / JSONL
    if getattr(trainer, "metrics", None) is None or not trainer.cfg.logging.jsonl:
        return None
    return run_events(read_jsonl(path) if path.is_file() else [], trainer.cfg.to_dict())
