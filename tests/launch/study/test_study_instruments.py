"""The protocol's instruments against torch directly: output_logits' log Z statistics equal
torch.logsumexp over every training micro-batch of a log step (eval passes ignored), logit_mean
the mean of every logit of those micro-batches, head_mean_norm the norm of the head's mean row
(which times each hidden state is that token's mean logit), grad_rms is
the gradient norm over sqrt(parameter count); init_loss logs the eval loss before step 1."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from normlab.launch.instruments.output_logits import InitLoss, OutputLogits
from torch import nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8)])
        self.head = nn.Linear(8, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks[0](x))


def fake_trainer(model: nn.Module, step: int = 0) -> SimpleNamespace:
    engine = SimpleNamespace(model=model, all_reduce=lambda t, op="sum": t, is_main=True)
    cfg = SimpleNamespace(training=SimpleNamespace(log_every=2, steps=10, eval_batches=3))
    return SimpleNamespace(cfg=cfg, engine=engine, step=step)


def test_output_logits_match_logsumexp_over_the_step() -> None:
    torch.manual_seed(0)
    model = Model()
    trainer = fake_trainer(model, step=1)  # next step 2 is a log step
    cb = OutputLogits(True)
    cb.on_train_start(trainer)
    batches = [torch.randn(2, 5, 8) * 3 for _ in range(2)]  # two micro-batches
    outs = [model(b) for b in batches]
    model.eval()
    model(torch.randn(2, 5, 8) * 100)  # an eval pass: not counted
    model.train()
    metrics = {"grad_norm": torch.tensor(2.5)}
    cb.on_step_end(trainer, 2, metrics)
    lse = torch.cat([torch.logsumexp(o.detach(), -1).reshape(-1) for o in outs])
    assert torch.allclose(metrics["logz_mean"], lse.mean(), atol=1e-6)
    every_logit = torch.cat([o.detach().reshape(-1) for o in outs])  # same count per token
    assert torch.allclose(metrics["logit_mean"], every_logit.mean(), atol=1e-6)
    assert torch.allclose(metrics["logz_min"], lse.min()) and torch.allclose(
        metrics["logz_max"], lse.max()
    )
    mu = model.head.weight.detach().mean(0)
    assert torch.allclose(metrics["head_mean_norm"], mu.norm())
    hidden = model.blocks[0](batches[0]).detach()
    assert torch.allclose(outs[0].detach().mean(-1), hidden @ mu, atol=1e-5)  # the mean logit
    n_params = sum(p.numel() for p in model.parameters())
    assert math.isclose(float(metrics["grad_rms"]), 2.5 / math.sqrt(n_params), rel_tol=1e-6)
    metrics = {"grad_norm": torch.tensor(1.0)}
    model(batches[0])  # step 3 is not a log step: the hook is off
    cb.on_step_end(trainer, 3, metrics)
    assert "logz_mean" not in metrics and "head_mean_norm" not in metrics


def test_init_loss_is_the_trainers_eval_loss_before_step_1() -> None:
    logged = []
    trainer = SimpleNamespace(
        step=0,
        measure_eval=lambda: (8.2, [8.0, 8.4]),  # the trainer's own evaluation, nothing recorded
        metrics=SimpleNamespace(log=lambda step, row, prefix: logged.append((step, row, prefix))),
    )
    InitLoss(True).on_train_start(trainer)
    assert logged == [(0, {"init_loss": 8.2}, "eval")]
    trainer.step = 50  # resumed: measured already, nothing logged again
    InitLoss(True).on_train_start(trainer)
    assert len(logged) == 1
