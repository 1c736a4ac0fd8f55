"""Automatic fp16 clamping of block and norm outputs (SCIENCE.md section 9; HF T5).

fp16 tops out at 65504, and Pre-LN's residual stream grows with depth. Like T5, each fp16 output is
clamped to +-(finfo.max - 1000) (64512 after rounding) when any element is inf, else to
+-finfo.max, chosen with `torch.where` so no Python branch depends on the data. The hooks sit on
every residual wrapper (`blocks.i.attn`, `blocks.i.mlp`: the stream after each sub-layer), on each
block's output (a fused Pre-LN block skips its wrappers) and on every norm module; the per-block
counter adds one for each hooked output that held an inf, as a device tensor. Clamping removes
inf from an add; it cannot repair a NaN already made (inf - inf).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from launch.errors import ConfigError
from launch.instruments.common import FP16_CLAMPS, block_key, is_log_step, settings_of, unwrap
from launch.training.callbacks import Callback

if TYPE_CHECKING:
    from launch.training.trainer import Trainer

FP16_MAX = torch.finfo(torch.float16).max


def clamp_fp16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x clamped into fp16's finite range, whether x held an inf) with T5's clamp value."""
    has_inf = torch.isinf(x).any()
    limit = torch.where(has_inf, FP16_MAX - 1000, FP16_MAX).to(x.dtype)
    return torch.clamp(x, min=-limit, max=limit), has_inf


def _is_norm(module: nn.Module) -> bool:
    """LayerNorm/RMSNorm of model.norms or model.kernels (they carry the fused patterns)."""
    return hasattr(module, "norm_add") and hasattr(module, "weight")


class ClampHooks:
    """Installs the clamps on a Transformer; `counts[i]` for block i, `counts[-1]` for the
    embedding and final norms."""

    def __init__(self, model: nn.Module) -> None:
        model = unwrap(model)
        n = len(model.blocks)
        self.counts = torch.zeros(n + 1, device=next(model.parameters()).device)
        self.handles: list[RemovableHandle] = []
        for i, block in enumerate(model.blocks):
            # the wrappers (skipped by a fused Pre-LN block) and the block output itself
            targets = [block.attn, block.mlp, block] + [m for m in block.modules() if _is_norm(m)]
            for module in targets:
                self.handles.append(module.register_forward_hook(self._hook(i)))
        for module in (model.embed_norm, model.final_norm):
            if _is_norm(module):
                self.handles.append(module.register_forward_hook(self._hook(n)))

    def _hook(self, slot: int):  # noqa: ANN202 (a forward hook)
        def hook(module: nn.Module, args: Any, out: Any) -> Any:
            if not torch.is_tensor(out) or out.dtype != torch.float16:
                return None  # a dtype test, not a data-dependent branch
            clamped, fired = clamp_fp16(out)
            self.counts[slot] += fired
            return clamped

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class FP16Clamp(Callback):
    """mode 'auto' (default): on when the model computes in fp16 (precision.dtype fp16, i.e. fp16
    autocast, or fp16 parameters), off in fp32/bf16; 'on' or 'off' force it. Logs `fp16_clamps/i`
    and their total `fp16_clamps` (cumulative over the run) while installed."""

    name = "fp16_clamp"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        self.mode = settings_of(settings, {"mode": "auto"}, self.name)["mode"]
        if self.mode not in ("auto", "on", "off"):
            raise ConfigError(
                f"instruments.fp16_clamp.mode must be 'auto', 'on' or 'off', got {self.mode!r}"
            )
        self.hooks: ClampHooks | None = None
        self._saved: list[float] | None = None

    def active_for(self, trainer: Trainer) -> bool:
        if self.mode != "auto":
            return self.mode == "on"
        model = unwrap(trainer.engine.model)
        fp16_params = any(p.dtype == torch.float16 for p in model.parameters())
        return trainer.cfg.precision.dtype == "fp16" or fp16_params

    def on_train_start(self, trainer: Trainer) -> None:
        if not self.active_for(trainer):
            return
        self.hooks = ClampHooks(trainer.engine.model)
        if self._saved is not None and len(self._saved) == len(self.hooks.counts):
            self.hooks.counts += torch.tensor(self._saved, device=self.hooks.counts.device)
        if trainer.engine.is_main:
            trainer.console.print("fp16: clamping block and norm outputs (instruments.fp16_clamp)")

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if self.hooks is None or not is_log_step(trainer, step):
            return
        counts = trainer.engine.all_reduce(self.hooks.counts.clone(), "sum")
        for i in range(len(counts) - 1):
            metrics[block_key(FP16_CLAMPS, i)] = counts[i]
        metrics[FP16_CLAMPS] = counts.sum()

    def on_train_end(self, trainer: Trainer, status: str) -> None:
        if self.hooks is not None:
            self.hooks.remove()

    def state_dict(self) -> dict[str, Any]:
        return {"counts": self.hooks.counts.tolist() if self.hooks is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._saved = state.get("counts")
