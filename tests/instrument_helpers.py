"""A stand-in trainer for driving instrument callbacks by hand around a plain forward/backward."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from normlab.launch.engines.storage import ParamStorage
from normlab.model import ModelConfig, Transformer, lm_loss
from torch import nn


def tiny_model(**kw: Any) -> Transformer:
    values: dict[str, Any] = dict(
        n_layers=3,
        d_model=32,
        n_heads=4,
        d_ff=64,
        vocab_size=97,
        max_seq_len=16,
        placement="pre",
        norm="rmsnorm",
        mlp="swiglu",
    )
    values.update(kw)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**values))


class FakeEngine:
    def __init__(self, model: nn.Module) -> None:
        self.model, self.device, self.is_main, self.rank, self.world_size = (
            model,
            torch.device("cpu"),
            True,
            0,
            1,
        )
        self.reduced: list[str] = []
        self.storage = ParamStorage()  # one process: plain tensors

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        self.reduced.append(op)
        return tensor


def fake_trainer(model: nn.Module, log_every: int = 1, steps: int = 10, dtype: str = "fp32"):
    cfg = SimpleNamespace(
        training=SimpleNamespace(log_every=log_every, steps=steps),
        precision=SimpleNamespace(dtype=dtype),
    )
    return SimpleNamespace(cfg=cfg, step=0, engine=FakeEngine(model), console=None)


def train_step(trainer, callbacks, step: int, tokens: torch.Tensor, opt=None, max_norm=1e9):
    """One step in the trainer's callback order; returns the metrics dict."""
    model = trainer.engine.model
    model.zero_grad(set_to_none=True)
    loss, _ = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    for cb in callbacks:
        cb.on_after_backward(trainer, step)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if opt is not None:
        opt.step()
    metrics: dict[str, Any] = {"step": step, "loss": loss.detach(), "grad_norm": grad_norm}
    for cb in callbacks:
        cb.on_step_end(trainer, step, metrics)
    return metrics
