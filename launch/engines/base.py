"""The seam between the trainer and a parallelism backend.

The trainer loop never touches torch.distributed, wrappers or loss scaling directly: it asks its
Engine. `single` runs one process (CPU or one GPU); FSDP2 and DeepSpeed engines implement the same
methods and are listed by name in `launch.registry.ENGINES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from normlab.launch.config import EngineSection, PrecisionSection, RunConfig
from normlab.launch.engines.storage import OptimizerFactory, ParamStorage
from normlab.model import ModelConfig
from normlab.model.loss import LMLoss
from torch import nn

StepVeto = Callable[[torch.Tensor], bool]
ReduceOp = Literal["sum", "mean", "max", "min"]


@dataclass(frozen=True)
class RunFacts:
    """What an engine needs from the rest of the run, besides its own section and the precision."""

    device: str  # training.device
    seed: int  # training.seed: every rank draws the same initial weights from it
    grad_accum: int  # training.grad_accum: micro-batches per optimizer step
    micro_batch: int  # data.batch_size: sequences per micro-batch and rank (DeepSpeed's config)
    grad_clip: float  # optim.grad_clip (DeepSpeed clips inside its own step)
    optimizer: str  # optim.name (DeepSpeed checks its config against Muon)
    async_checkpoint: bool = False  # checkpoint.async: saves talk over their own process group

    @classmethod
    def of(cls, cfg: RunConfig) -> RunFacts:
        t = cfg.training
        return cls(t.device, t.seed, t.grad_accum, cfg.data.batch_size, cfg.optim.grad_clip,
                   cfg.optim.name, cfg.checkpoint.async_)  # fmt: skip


class Engine(ABC):
    """One training backend. Methods are called by every rank; `is_main` ranks write logs.

    An engine sees its own section (engine:), the precision, the few run facts it needs and the
    training objective, not the whole run config; `Engine.for_run(cfg)` picks them out."""

    name: str = "base"

    def __init__(
        self, section: EngineSection, precision: PrecisionSection, run: RunFacts, loss: LMLoss
    ) -> None:
        self.section, self.precision, self.run, self.loss = section, precision, run, loss
        # where each parameter lives (Muon's self-check, QK-Clip and the instruments ask here);
        # an engine whose weights are not DTensors replaces it in setup()
        self.storage: ParamStorage = ParamStorage(self.wrap_like_model)

    @classmethod
    def for_run(cls, cfg: RunConfig) -> Engine:
        """This engine for run config `cfg` (its sections, facts and objective)."""
        return cls(cfg.engine, cfg.precision, RunFacts.of(cfg), LMLoss(cfg.optim.z_loss))

    # --- construction -------------------------------------------------------------------------
    @abstractmethod
    def setup(self, model_cfg: ModelConfig, build_optimizer: OptimizerFactory) -> None:
        """Build the model (initialised identically on every rank), wrap it, build the optimizer."""

    # Each engine sets these three in setup(); the accessors below are shared.
    _module: nn.Module
    _optimizer: torch.optim.Optimizer
    _device: torch.device

    @property
    def model(self) -> nn.Module:
        """The local (possibly wrapped) module; hooks of instruments attach to its submodules."""
        return self._module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @property
    def device(self) -> torch.device:
        return self._device

    def wrap_like_model(self, module: nn.Module) -> nn.Module:
        """Wrap a small probe module on this engine's device exactly as the model's parameters are
        (sharded, for a sharding engine): `storage.probe_step` runs the real optimizer on it."""
        return module

    # --- one optimizer step -------------------------------------------------------------------
    @abstractmethod
    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one micro-batch; the gradient is divided by grad_accum.

        Returns this micro-batch's loss (detached, on device, not divided).
        """

    @abstractmethod
    def clip_and_step(
        self, max_norm: float, veto: StepVeto | None = None
    ) -> tuple[torch.Tensor, bool]:
        """Unscale and clip the gradients (max_norm 0: no clipping), then step the optimizer unless
        `veto(grad_norm)` says to skip. Returns (global grad L2 norm before clipping, skipped)."""

    @abstractmethod
    def zero_grad(self) -> None: ...

    @abstractmethod
    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits of one batch already on the device (with the engine's wrapping and autocast)."""

    def _loss_and_parts(
        self, inputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Move one batch to the device, forward; (cross-entropy + z-loss, {"ce", "z"}) in fp32."""
        logits = self._forward(inputs.to(self._device, non_blocking=True))
        targets = targets.to(self._device, non_blocking=True)
        return self.loss(logits, targets)

    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Training objective of one micro-batch; its parts are kept for `pop_loss_parts`."""
        loss, parts = self._loss_and_parts(inputs, targets)
        self.__dict__.setdefault("_step_parts", []).append(parts)
        return loss

    def pop_loss_parts(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """This step's cross-entropy `ce` and z-loss `z` (means over its micro-batches and all
        ranks, device tensors); `loss` is the step's objective as forward_backward reported it.
        Without z-loss the objective is the cross-entropy: no extra reduction."""
        parts, self._step_parts = self.__dict__.get("_step_parts", []), []
        if not parts or "z" not in parts[0]:
            return {"ce": loss}
        mean = torch.stack([torch.stack([p["ce"], p["z"]]) for p in parts]).mean(dim=0)
        ce, z = self.all_reduce(mean, "mean")
        return {"ce": ce, "z": z}

    @torch.no_grad()
    def eval_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of one batch (no z-loss) without gradients, in eval mode."""
        self._module.eval()
        try:
            return self._loss_and_parts(inputs, targets)[1]["ce"].detach()
        finally:
            self._module.train()

    # --- checkpoints --------------------------------------------------------------------------
    @abstractmethod
    def save(self, ckpt_dir: Path, extra_state: dict[str, Any]) -> None:
        """Write model, optimizer, engine state and this rank's `extra_state` into ckpt_dir."""

    def save_async(self, ckpt_dir: Path, extra_state: dict[str, Any]) -> Future[Any]:
        """Like `save`, but return once the state is staged; the future completes when every
        rank's files are written. Only engines that support checkpoint.async implement it."""
        raise NotImplementedError(f"engine {self.name} has no asynchronous save")

    @abstractmethod
    def load(self, ckpt_dir: Path) -> dict[str, Any]:
        """Restore what `save` wrote; return this rank's extra_state. Raises CheckpointError."""

    # --- process group ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        """Reduce across ranks (identity for one process); returns the reduced tensor."""
        return tensor

    def barrier(self) -> None:  # noqa: B027 (a no-op for one process)
        """Wait for every rank."""

    def shutdown(self) -> None:  # noqa: B027 (nothing to release for one process)
        """Release the process group and devices."""
