"""Callbacks: the seam the stability instruments plug into.

Built from the `instruments:` section (name -> settings) through launch.registry.INSTRUMENTS; each
callback's state is saved in checkpoints under its `name`. Losses and metrics reach callbacks as
device tensors: the trainer copies them to the host only on log steps. A callback sees the trainer
through `TrainerView` (the attributes it may read), not the Trainer class, so instruments and
optimizer callbacks do not depend on the loop that calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from normlab.launch.config.loader import suggest
from normlab.launch.errors import ConfigError
from normlab.launch.registry import INSTRUMENTS, resolve

if TYPE_CHECKING:
    import torch
    from normlab.launch.config import RunConfig
    from normlab.launch.engines.base import Engine
    from normlab.launch.rundir.checkpoint import CheckpointManager
    from normlab.launch.rundir.metrics import MetricsWriter
    from rich.console import Console


class TrainerView(Protocol):
    """What a callback may read of the trainer that calls it."""

    cfg: RunConfig
    engine: Engine  # model, optimizer, all_reduce, is_main
    ckpt: CheckpointManager  # the spike policy's rollback: step_dirs() and restore()
    console: Console
    step: int  # the last completed step (on train start: 0, or the step resumed from)

    metrics: MetricsWriter | None  # rank 0 writes metrics.jsonl; None on the other ranks

    def measure_eval(self) -> tuple[float, list[float]]:
        """(eval loss, per-source losses) of the model now, recording nothing (init_loss)."""
        ...

    def skip_batches(self, steps: int) -> None:
        """Draw and drop the batches of `steps` optimizer steps (every rank its own share, as
        training would draw them): a rollback's data skip."""
        ...


class Callback:
    """Base class; every hook is optional."""

    name: str = "callback"
    reads_metrics: bool = False  # True: on_step_end runs after every other callback's (it reads
    # the metrics they add: the early warning)

    def on_train_start(self, trainer: TrainerView) -> None:
        """After the model, optimizer and (on resume) checkpoint state are in place."""

    def on_after_backward(self, trainer: TrainerView, step: int) -> None:
        """Gradients of every micro-batch are accumulated; before clipping and the step."""

    def should_skip_step(
        self, trainer: TrainerView, step: int, loss: torch.Tensor, grad_norm: torch.Tensor
    ) -> bool:
        """Veto this optimizer step (spike policy). Called only when some callback overrides it."""
        return False

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        """After the optimizer step; may add entries (tensors or floats) to `metrics`."""

    def wants_checkpoint(self) -> bool:
        """True to make this step a checkpoint step (early_warning: checkpoint on alarm); the
        answer must be the same on every rank."""
        return False

    def on_log(self, trainer: TrainerView, step: int, metrics: dict[str, float]) -> None:
        """On log steps, with host floats (the values written to metrics.jsonl)."""

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        """Once, with the final status: completed or diverged."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""


def build_callbacks(section: dict[str, Any]) -> list[Callback]:
    """One callback per entry of `instruments:`; an entry set to false/null is switched off."""
    out = []
    for name, settings in section.items():
        if name not in INSTRUMENTS:
            hint = suggest(name, list(INSTRUMENTS), "instruments.")
            raise ConfigError(f"unknown instrument 'instruments.{name}'{hint}")
        if settings is False or settings is None:
            continue
        out.append(resolve(INSTRUMENTS, name)({} if settings is True else settings))
    return out


def overrides_skip(callbacks: list[Callback]) -> bool:
    """True when some callback implements a spike policy (so the trainer asks before each step)."""
    return any(type(cb).should_skip_step is not Callback.should_skip_step for cb in callbacks)


class StopRun(Exception):
    """Raised by a callback (the spike policy) to end the run as diverged; the message says why.
    The trainer catches it, prints it, writes it to summary.json and exits with status 1."""
