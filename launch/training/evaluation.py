"""Evaluation during training: each source's validation split separately, the eval loss their
weighted mean (the mixture's weights); one source is the plain eval loss.

The console's eval line carries each source's loss beside the mean ("eval loss 5.1234 (web
5.0012, code 5.4321)"); a source whose validation split holds fewer sequences than one eval
pass (training.eval_batches global batches) gets one warning line when the run starts: its
eval loss rests on fewer batches than asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from normlab.data.errors import DataError

if TYPE_CHECKING:
    from normlab.data.mixture import MixtureLoader
    from normlab.launch.engines.base import Engine
    from normlab.launch.training.trainer import Trainer


def measure_eval(engine: Engine, loader: MixtureLoader, batches: int) -> tuple[float, list[float]]:
    """(eval loss, per-source losses) over `batches` validation batches of every source, averaged
    over ranks. Records nothing (the init_loss instrument measures the loss at step 0 with it)."""
    means = [
        torch.stack([engine.eval_loss(x, y) for x, y in loader.iter_eval(i, batches)]).mean()
        for i in range(len(loader.names))
    ]
    per_source = engine.all_reduce(torch.stack(means), "mean").tolist()
    return float(sum(p * v for p, v in zip(loader.p, per_source, strict=True))), per_source


def evaluate(trainer: Trainer, step: int) -> None:
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
    trainer.display.message(f"{where}: {shown}{eval_text(value, loader.names, per_source)}")


def eval_text(value: float, names: list[str], per_source: list[float]) -> str:
    """'eval loss 5.1234', with each source's loss in brackets when there are several."""
    text = f"eval loss {value:.4f}"
    if len(per_source) > 1:
        parts = ", ".join(f"{n} {v:.4f}" for n, v in zip(names, per_source, strict=True))
        text += f" ({parts})"
    return text


def small_val_warnings(loader: MixtureLoader, batches: int) -> list[str]:
    """One line per source whose validation split is smaller than one eval pass of `batches`
    global batches (each eval then uses fewer batches than training.eval_batches asks for).
    A split too small for even one batch is left to the eval's own error."""
    need = batches * loader.global_batch
    lines = []
    for name, source in zip(loader.names, loader.sources, strict=True):
        try:
            have = source.num_sequences("val")
        except DataError:
            continue
        if have < need:
            used = have // loader.global_batch
            lines.append(
                f"warning: data source {name!r}: its validation split holds {have} sequences of "
                f"{loader.seq_len + 1} tokens, fewer than one eval pass (training.eval_batches "
                f"{batches} x global batch {loader.global_batch} = {need}): each eval uses "
                f"{used} of {batches} batches"
            )
    return lines
