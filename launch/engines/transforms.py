"""The model transforms every engine applies, in one order (torchtitan's): FP8 conversion, then
activation checkpointing, then compile; sharding (FSDP2, ZeRO) wraps the result afterwards.

Each engine calls `apply_transforms` once on the model it built (on the meta device or
partitioned), before its weights are drawn: torch.compile traces lazily at the first forward, so
compiling before materialisation compiles the materialised weights."""

from __future__ import annotations

from typing import cast

import torch
from normlab.launch.config import EngineSection, FP8Section
from normlab.launch.engines.fp8 import convert_fp8
from normlab.launch.engines.recompute import apply_activation_checkpointing
from normlab.model import Transformer
from torch import nn


def apply_transforms(
    module: Transformer,
    section: EngineSection,
    fp8: FP8Section | None,
    device_type: str,
    *,
    smooth: bool = False,
    fsdp: bool = False,
    whole_model: bool = False,
) -> nn.Module:
    """FP8 (precision.fp8: torchao's Float8Linear; `smooth`: Smooth-SwiGLU; `fsdp`: its float8
    all-gather), then engine.activation_checkpointing (each block recomputed in the backward),
    then engine.compile: of each block (sharded engines: one graph per block, as FSDP2 wraps
    them), or of the whole model (`whole_model`, one process). Returns the module to call:
    `module` itself, or its compiled wrapper."""
    convert_fp8(module, fp8, device_type, fsdp=fsdp, smooth=smooth)
    if section.activation_checkpointing:
        apply_activation_checkpointing(module, compiled=section.compile)
    if not section.compile:
        return module
    guard_hooks()
    if whole_model:
        # torch.compile of a Module returns an OptimizedModule (a Module); its stub says Callable
        return cast(nn.Module, torch.compile(module, backend=section.compile_backend))
    for block in module.blocks:
        block.compile(backend=section.compile_backend)
    return module


def guard_hooks() -> None:
    """Make compiled code see forward hooks added or removed after it was traced.

    Dynamo skips guards on nn.Module hooks by default (`skip_nnmodule_hook_guards`): a graph
    traced without hooks then never runs the hooks the instruments arm for a log step (they log
    zeros and -inf), and one traced with them armed runs them on every step, with the tensors of
    the first arm. With the guards on, the first log step compiles one more variant (hooks
    present; new hook closures reuse it) and every step runs the variant that matches its hooks,
    as eager would (tests/launch/instruments/test_off_log_steps.py)."""
    torch._dynamo.config.skip_nnmodule_hook_guards = False
