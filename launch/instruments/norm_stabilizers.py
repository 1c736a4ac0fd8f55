"""What the norm-side stabilizers do (SCIENCE.md 15-16).

On log steps it logs, per block i and sub-layer s (attn, mlp):
- with a residual scale, `residual_scale/i/s`: mean |λ| of that sub-layer's LayerScale diagonal
  (or |α| of its SkipInit scalar);
- with DyT/Derf, `pointwise_alpha/i/s` (the learned α), for Derf `pointwise_shift/i/s` (the
  learned s), and `saturation/i/s`: the share of elements with |f(αx + s)| >= 0.9 over the
  training micro-batches of that step (forward hooks on the layers, armed only then); the final
  layer logs `pointwise_alpha/final`, `pointwise_shift/final`, `saturation/final`.
Saturation is the point-wise function before the affine g, b: tanh for DyT, erf for Derf.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import (
    block_key,
    blocks,
    is_log_step,
    unwrap,
)
from normlab.model.norms import POINTWISE
from normlab.model.placements import BranchScale
from torch import nn
from torch.utils.hooks import RemovableHandle

RESIDUAL_SCALE, ALPHA, SHIFT, SATURATION = (
    "residual_scale",
    "pointwise_alpha",
    "pointwise_shift",
    "saturation",
)
SATURATED = 0.9  # |f| at or above counts as saturated (a choice: SCIENCE.md 16)
SUBLAYERS = ("attn", "mlp")


def pointwise_layers(model: nn.Module) -> Iterator[tuple[Callable[[str], str], nn.Module]]:
    """(key maker, layer) for every DyT/Derf layer of the stream: kind -> 'kind/03/attn' in
    block 3's attention sub-layer, 'kind/final' for the final layer."""
    kinds = tuple(POINTWISE.values())
    for i, block in enumerate(unwrap(model).blocks):
        for sub in SUBLAYERS:
            for child in getattr(block, sub).children():
                if isinstance(child, kinds):
                    yield partial(_block_key, block=i, sub=sub), child
    if isinstance(unwrap(model).final_norm, kinds):
        yield "{}/final".format, unwrap(model).final_norm


def _block_key(kind: str, block: int, sub: str) -> str:
    return block_key(kind, block, sub)


class NormStabilizers(Callback):
    """Residual-scale magnitudes, DyT/Derf α (and s) and saturation share (keys in the doc)."""

    name = "norm_stabilizers"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._handles: list[RemovableHandle] = []
        self._sums: dict[str, torch.Tensor] = {}  # key -> [saturated, elements]
        self._armed = False  # a log step is under way (a model without DyT/Derf has no hooks)

    def on_train_start(self, trainer: TrainerView) -> None:
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    def _arm(self, trainer: TrainerView) -> None:
        self._armed = True
        for key, layer in pointwise_layers(trainer.engine.model):
            self._handles.append(layer.register_forward_hook(self._hook(key(SATURATION))))

    def _hook(self, key: str):  # noqa: ANN202 (a forward hook)
        def hook(layer: nn.Module, args: Any, out: Any) -> None:
            if not layer.training:
                return
            with torch.no_grad():
                f = layer.squash(args[0].detach())
                hit = (f.abs() >= SATURATED).sum().double()
                pair = torch.stack([hit, hit.new_tensor(float(f.numel()))])
                self._sums[key] = self._sums[key] + pair if key in self._sums else pair

        return hook

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._armed = [], False

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._armed:
            self._disarm()
            for key, pair in self._sums.items():
                total = trainer.engine.all_reduce(pair, "sum")
                metrics[key] = (total[0] / total[1].clamp_min(1)).float()
            self._sums = {}
            metrics.update(parameter_stats(trainer))
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        self._disarm()


def parameter_stats(trainer: TrainerView) -> dict[str, torch.Tensor]:
    """mean |λ| per sub-layer, and each DyT/Derf α and s (gathered where sharded)."""
    out: dict[str, torch.Tensor] = {}
    storage = trainer.engine.storage
    for i, block in enumerate(blocks(trainer)):
        for sub in SUBLAYERS:
            scale = getattr(getattr(block, sub), "scale", None)
            if isinstance(scale, BranchScale):
                lam = storage.full(scale.weight).float()
                out[block_key(RESIDUAL_SCALE, i, sub)] = lam.abs().mean()
    for key, layer in pointwise_layers(trainer.engine.model):
        for kind, pname in ((ALPHA, "alpha"), (SHIFT, "shift")):
            p = getattr(layer, pname, None)
            if p is not None:
                out[key(kind)] = storage.full(p).float().reshape(())
    return out
