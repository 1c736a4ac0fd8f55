"""Automatic fp16 clamping wherever the model produces fp16 values (SCIENCE.md section 9; HF T5).

fp16 tops out at 65504. Like T5, each fp16 tensor is clamped to +-(finfo.max - 1000) (64512 after
rounding) when any element is inf, else to +-finfo.max, chosen with `torch.where` so no Python
branch depends on the data: the step saturates and goes on. Where fp16 values appear depends on the
mode:
- fp16 autocast (single engine): the linear layers compute in fp16 while the residual stream, the
  norms and the loss stay fp32. The fp16 values are the outputs of every linear layer (q/k/v/o,
  the MLP projections, the head), the branch outputs F(.) and the SwiGLU product entering
  `down_proj`, so the clamps sit on the inputs and outputs of every linear layer and on every
  branch output. A branch that overflows would otherwise add inf to the fp32 stream.
- fp16 parameters (DeepSpeed fp16, FSDP2 fp16 whose shards compute in fp16, a `.half()` model):
  everything is fp16, the residual stream included, so the clamps also sit on every residual
  wrapper (`blocks.i.attn`, `blocks.i.mlp`), block output and norm.
A hook on a tensor that is not fp16 returns at once (a dtype test, not a data-dependent branch);
on finite fp16 values the clamp is the identity, so a run that never overflows is bit-identical
with and without the hooks. `counts[i]` adds one for each hooked tensor of block i that held an
inf, in training passes only (`counts[-1]`: embedding norm, final norm and head), as a device
tensor, once per forward: the recomputation of a checkpointed block
(engine.activation_checkpointing) is not counted again. Clamping removes inf from an add; it
cannot repair a NaN already made (inf - inf).

This is not the loss scaler's job: the scaler guards the backward pass (an inf or NaN gradient
skips that whole update and halves the scale); a clamp acts in the forward pass and the update
goes ahead with the saturated values.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.engines.recompute import recomputing
from normlab.launch.instruments.common import (
    FP16_CLAMPS,
    block_key,
    is_log_step,
    unwrap,
)
from torch import nn
from torch.utils.hooks import RemovableHandle

FP16_MAX = torch.finfo(torch.float16).max


def clamp_fp16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x clamped into fp16's finite range, whether x held an inf) with T5's clamp value."""
    has_inf = torch.isinf(x).any()
    limit = torch.where(has_inf, FP16_MAX - 1000, FP16_MAX).to(x.dtype)
    return torch.clamp(x, min=-limit, max=limit), has_inf


def _is_norm(module: nn.Module) -> bool:
    """LayerNorm/RMSNorm of model.norms or model.kernels (they carry the fused patterns)."""
    return hasattr(module, "norm_add") and hasattr(module, "weight")


def _outputs_in_block(block: nn.Module) -> Iterator[nn.Module]:
    """Every module of a block whose output can be fp16: linears, branches, wrappers, norms,
    the block (a fused Pre-LN block skips its wrappers' forward, not its branches')."""
    yield block
    for wrapper in (block.attn, block.mlp):
        yield wrapper
        yield wrapper.branch
    for module in block.modules():
        if isinstance(module, nn.Linear) or _is_norm(module):
            yield module


class ClampHooks:
    """Installs the clamps on a Transformer; `counts[i]` for block i, `counts[-1]` for the
    embedding norm, final norm and head."""

    def __init__(self, model: nn.Module) -> None:
        model = unwrap(model)
        n = len(model.blocks)
        self.counts = torch.zeros(n + 1, device=next(model.parameters()).device)
        self.handles: list[RemovableHandle] = []
        for i, block in enumerate(model.blocks):
            for module in dict.fromkeys(_outputs_in_block(block)):  # each module once
                self._install(module, i)
        for module in (model.embed_norm, model.final_norm, model.head):
            if _is_norm(module) or isinstance(module, nn.Linear):
                self._install(module, n)

    def _install(self, module: nn.Module, slot: int) -> None:
        self.handles.append(module.register_forward_hook(self._output_hook(slot)))
        if isinstance(module, nn.Linear):  # e.g. the SwiGLU product entering down_proj
            self.handles.append(module.register_forward_pre_hook(self._input_hook(slot)))

    @staticmethod
    def _clamp(module: nn.Module, x: Any, count: torch.Tensor) -> torch.Tensor | None:
        """Clamp x; add to `count`, the 0-d view of this slot's counter (a tensor rather than
        an index, so per-block compiled blocks share one graph)."""
        if not torch.is_tensor(x) or x.dtype != torch.float16:
            return None  # a dtype test, not a data-dependent branch
        clamped, fired = clamp_fp16(x)
        # evaluation passes are clamped too, but not counted; nor is the recomputation of a
        # checkpointed block inside the backward (its forward already counted these tensors)
        if module.training and not recomputing():
            count += fired
        return clamped

    def _output_hook(self, slot: int):  # noqa: ANN202 (a forward hook)
        count = self.counts[slot]

        def hook(module: nn.Module, args: Any, out: Any) -> Any:
            return self._clamp(module, out, count)

        return hook

    def _input_hook(self, slot: int):  # noqa: ANN202 (a forward pre-hook)
        count = self.counts[slot]

        def hook(module: nn.Module, args: tuple[Any, ...]) -> Any:
            clamped = self._clamp(module, args[0], count) if args else None
            return None if clamped is None else (clamped, *args[1:])

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class FP16Clamp(Callback):
    """mode 'auto' (default): on when the model computes in fp16 (precision.dtype fp16, i.e. fp16
    autocast, or fp16 parameters), off in fp32/bf16; 'on' or 'off' force it. Logs `fp16_clamps/i`
    and their total `fp16_clamps` (cumulative over the run's training passes) while installed."""

    name = "fp16_clamp"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        self.mode = checked_settings(self.name, settings).mode
        self.hooks: ClampHooks | None = None
        self._saved: list[float] | None = None

    def active_for(self, trainer: TrainerView) -> bool:
        if self.mode != "auto":
            return self.mode == "on"
        model = unwrap(trainer.engine.model)
        fp16_params = any(p.dtype == torch.float16 for p in model.parameters())
        return trainer.cfg.precision.dtype == "fp16" or fp16_params

    def on_train_start(self, trainer: TrainerView) -> None:
        if not self.active_for(trainer):
            return
        self.hooks = ClampHooks(trainer.engine.model)
        if self._saved is not None and len(self._saved) == len(self.hooks.counts):
            self.hooks.counts += torch.tensor(self._saved, device=self.hooks.counts.device)
        if trainer.engine.is_main:
            trainer.console.print("fp16: clamping fp16 activations (instruments.fp16_clamp)")

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self.hooks is None or not is_log_step(trainer, step):
            return
        counts = trainer.engine.all_reduce(self.hooks.counts.clone(), "sum")
        for i in range(len(counts) - 1):
            metrics[block_key(FP16_CLAMPS, i)] = counts[i]
        metrics[FP16_CLAMPS] = counts.sum()

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        if self.hooks is not None:
            self.hooks.remove()

    def state_dict(self) -> dict[str, Any]:
        return {"counts": self.hooks.counts.tolist() if self.hooks is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._saved = state.get("counts")
