"""The LR-sensitivity protocol's own measurements (SCIENCE.md section 19).

- `init_loss`: the held-out eval loss of the initialised model, measured before step 0 and logged
  as `init_loss` on a step-0 row (`l_0` of the protocol: a diverged run counts as this loss).
- `output_logits`: on log steps, `log Z = logsumexp(z)` of the output logits (the head's own
  output, before a `final_softcap`, which can hide their divergence) over every training
  token of the step: `logz_mean`, `logz_min`, `logz_max`, and `logit_mean`, the mean logit over
  the tokens and the vocabulary (the output-logit divergence signal: Wortsman et al.'s logits
  "become very negative"; the mean logit is the output embeddings' mean times the hidden state,
  Stollenwerk et al. 2026), `head_mean_norm`, the norm of that mean output embedding
  ||mean_v e_v|| (the drift Stollenwerk et al. name as the divergence's cause: Adam moves every
  row of a rarely-seen token the same way, and nothing in the cross-entropy pulls the mean back;
  read in the head's forward, where its full weight is visible: one process, DDP, FSDP2 and
  ZeRO-3, each tested equal to one process on 2 ranks; skipped for a partition it cannot see
  whole), and `grad_rms`, the global gradient norm over sqrt(number of
  parameters), to compare with Adam's epsilon.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import is_log_step, unwrap
from normlab.launch.metric_keys import (
    GRAD,
    GRAD_RMS,
    HEAD_MEAN_NORM,
    INIT_LOSS,
    LOGIT_MEAN,
    LOGZ_MAX,
    LOGZ_MEAN,
    LOGZ_MIN,
)
from torch import nn
from torch.utils.hooks import RemovableHandle


class InitLoss(Callback):
    """Evaluates the model before its first step (not on resume) and logs `init_loss` at step 0."""

    name = "init_loss"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)

    def on_train_start(self, trainer: TrainerView) -> None:
        if trainer.step != 0:
            return  # resumed: the value is already on the step-0 row of metrics.jsonl
        value, _ = trainer.measure_eval()  # the same eval loss as every later evaluation
        if trainer.metrics is not None:
            trainer.metrics.log(0, {INIT_LOSS: value}, prefix="eval")


class OutputLogits(Callback):
    """Logs mean / min / max of log Z and the mean logit over the step's tokens, and the global
    gradient RMS."""

    name = "output_logits"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._handle: RemovableHandle | None = None
        self._acc: torch.Tensor | None = None  # [sum log Z, count, sum mean logit, -min, max]
        self._mean_norm: torch.Tensor | None = None  # ||mean row of the head|| at the step

    def on_train_start(self, trainer: TrainerView) -> None:
        model = unwrap(trainer.engine.model)
        self._head = model.head
        # ZeRO-3 leaves each rank an empty placeholder per parameter; ds_numel is the full size
        self._numel = sum(
            getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad
        )
        if is_log_step(trainer, trainer.step + 1):
            self._arm()

    def _arm(self) -> None:
        self._acc = None
        self._mean_norm = None
        self._handle = self._head.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: Any, out: torch.Tensor) -> None:
        if not module.training:
            return  # evaluation passes are not the training step's logits
        if self._mean_norm is None:
            self._mean_norm = _mean_row_norm(module.weight.detach(), out.shape[-1])
        z = out.detach().float()
        logz = torch.logsumexp(z, dim=-1).reshape(-1)
        part = torch.stack(
            [logz.sum(), logz.new_tensor(logz.numel()), z.mean(-1).sum(), -logz.min(), logz.max()]
        )
        if self._acc is None:
            self._acc = part
        else:
            self._acc = torch.cat(
                [self._acc[:3] + part[:3], torch.maximum(self._acc[3:], part[3:])]
            )

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
            if self._acc is not None:
                engine = trainer.engine
                sums = engine.all_reduce(self._acc[:3].clone(), "sum")
                extremes = engine.all_reduce(self._acc[3:].clone(), "max")
                metrics[LOGZ_MEAN] = sums[0] / sums[1]
                metrics[LOGIT_MEAN] = sums[2] / sums[1]
                metrics[LOGZ_MIN] = -extremes[0]
                metrics[LOGZ_MAX] = extremes[1]
            if self._mean_norm is not None:
                metrics[HEAD_MEAN_NORM] = self._mean_norm
            grad = metrics.get(GRAD)
            if grad is not None:
                metrics[GRAD_RMS] = grad / math.sqrt(max(self._numel, 1))
        if is_log_step(trainer, step + 1):
            self._arm()

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _mean_row_norm(weight: torch.Tensor, vocab: int) -> torch.Tensor | None:
    """||mean_v e_v|| of a (V, d) head weight; None for a partition that is not the whole matrix
    (ZeRO-3 outside its gather). A DTensor (FSDP2, TP) has the global shape, and its row mean is
    reduced across ranks: d numbers, where storage.full would gather all V x d."""
    if weight.dim() != 2 or weight.shape[0] != vocab:
        return None
    mean = weight.float().mean(0)
    return (mean.full_tensor() if hasattr(mean, "full_tensor") else mean).norm()
