"""Evaluation during training: each source's validation split separately, the eval loss their
weighted mean (the mixture's weights); one source is the plain eval loss."""

from __future__ import annotations

from typing import Any

import torch


def measure_eval(engine: Any, loader: Any, batches: int) -> tuple[float, list[float]]:
    """(eval loss, per-source losses) over `batches` validation batches of every source, averaged
    over ranks. Records nothing (the init_loss instrument measures the loss at step 0 with it)."""
    means = [
        torch.stack([engine.eval_loss(x, y) for x, y in loader.iter_eval(i, batches)]).mean()
        for i in range(len(loader.names))
    ]
    per_source = engine.all_reduce(torch.stack(means), "mean").tolist()
    return float(sum(p * v for p, v in zip(loader.p, per_source, strict=True))), per_source


def evaluate(trainer: Any, step: int) -> None:
    """The eval of `step`: stats, `eval_loss` and `eval/<source>` in the metrics, one line."""
    loader = trainer.loader
    value, per_source = trainer.measure_eval()
    trainer.stats["eval_loss"] = value
    scalars = {"eval_loss": value}
    if len(per_source) > 1:
        trainer.stats["eval_by_source"] = dict(zip(loader.names, per_source, strict=True))
        scalars |= {f"eval/{k}": v for k, v in trainer.stats["eval_by_source"].items()}
    if trainer.metrics is not None:
        trainer.metrics.log(step, scalars, prefix="eval")
    loss = trainer.stats["loss"]  # of the last log step: none yet when eval comes first
    shown = f"loss {loss:.4f}, " if loss is not None else ""
    where = f"{trainer.cfg.name} step {step}/{trainer.cfg.training.steps}"
    trainer.display.message(f"{where}: {shown}eval loss {value:.4f}")
