"""Start-up proof that Muon really orthogonalises, on the engine that will train.

Muon has failed silently elsewhere (SCIENCE.md section 6): DeepSpeed without a ZeRO stage ran it as
plain SGD, ZeRO-3's zero.Init switched it off, and orthogonalising a shard is not orthogonalising
the matrix. Before step 1 a probe matrix, held exactly like the model (sharded by FSDP2 over the
engine's mesh; under DeepSpeed, built the same way and stepped by a ZeRO engine of the run's
stage), goes through one step of the run's own optimizer factory with the gradient
G = U diag(1..10) V^T. A Newton-Schulz update has singular values in about [0.68, 1.14] (ratio
about 1.7); SGD keeps G's spread (ratio 10), AdamW's first step is sign(G) (ratio > 5), and
orthogonalising row shards of a wide matrix leaves singular values near 0.2. Anything outside
the band refuses the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from normlab.launch.config import OptimSection
from normlab.launch.errors import NormlabError
from normlab.launch.optim.muon import update_scale
from torch import nn

if TYPE_CHECKING:
    from normlab.launch.engines.base import Engine

SV_BAND = (0.55, 1.45)  # singular values of an orthogonalised update (scale divided out)
SV_RATIO = 2.2  # largest / smallest


class SelfCheckError(NormlabError):
    """The optimizer did not do what the recipe asked (a silent fallback caught at start-up)."""


class Probe(nn.Module):
    """One hidden matrix: the optimizer's parameter split sends it to Muon."""

    def __init__(self, rows: int, cols: int, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, cols, device=device))  # zero: no decay

    def forward(self, grad: torch.Tensor) -> torch.Tensor:
        """A loss whose gradient with respect to the weight is `grad` (engines that own the
        backward, such as DeepSpeed, get the probe's gradient this way)."""
        return (self.weight * grad).sum()


def probe_gradient(rows: int, cols: int) -> torch.Tensor:
    """U diag(linspace(1, 10)) V^T, the same on every rank (a fixed seed of its own)."""
    gen = torch.Generator().manual_seed(1234)
    k = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen))
    return u @ torch.diag(torch.linspace(1.0, 10.0, k)) @ v.T


def check_orthogonalised(
    engine: Engine, factory: Callable[[nn.Module], torch.optim.Optimizer], scale: str
) -> torch.Tensor:
    """Run the probe step; raise SelfCheckError unless the update was orthogonalised whole.

    Returns the update's singular values (scale divided out) for the tests."""
    rows = max(32, 4 * engine.world_size)  # wide, so every row shard is wide too
    device = engine.device
    after, lr = engine.storage.probe_step(
        lambda: Probe(rows, 2 * rows, device), factory, probe_gradient(rows, 2 * rows)
    )
    update = -after / (lr * update_scale(after.shape, scale))  # type: ignore[arg-type]
    sv = torch.linalg.svdvals(update)
    lo, hi = float(sv.min()), float(sv.max())
    if not (SV_BAND[0] <= lo and hi <= SV_BAND[1] and hi <= SV_RATIO * lo):
        raise SelfCheckError(
            f"Muon self-check failed on engine {engine.name}: the update of a probe matrix has "
            f"singular values in [{lo:.3g}, {hi:.3g}], not the orthogonalised band "
            f"[{SV_BAND[0]}, {SV_BAND[1]}] (the optimizer fell back to SGD/AdamW or "
            "orthogonalised shards instead of whole matrices); refusing to train"
        )
    return sv


def check_optimizer(
    engine: Engine, cfg: OptimSection, factory: Callable[[nn.Module], torch.optim.Optimizer]
) -> None:
    """Start-up self-check (before step 1): Muon must really orthogonalise on this engine."""
    if cfg.name == "muon":
        check_orthogonalised(engine, factory, cfg.muon_scale)
