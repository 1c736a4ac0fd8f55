"""FP8 training (precision.fp8) applied from outside the model, like compile and activation
checkpointing: torchao's `convert_to_float8_training` swaps the hidden `nn.Linear` layers for
`Float8Linear` (SCIENCE.md 24). The parameters keep their names, shapes and dtype (the optimizer,
Muon included, QK-Clip, checkpoints and `export` see the high-precision weights as trained); the
forward casts input and weight to float8 e4m3 with dynamic scales and the backward casts the
output gradient (e5m2 for tensorwise, e4m3 for rowwise).

Which layers: every `nn.Linear` but those whose dotted name holds a pattern of
`precision.fp8.keep` as whole parts (default `head`: the output layer stays in high precision, as
torchtitan's default filter and DeepSeek-V3 keep it; the embedding is no linear layer). A pattern
that matches no layer is an error (a typo would otherwise silently convert everything).

Emulation (`emulate: auto` on CPU): torchao casts to float8 with the real scales and multiplies
in fp32, so the quantisation error is reproduced and the speed is not. The hardware path needs
`torch._scaled_mm`, i.e. a GPU of compute capability 8.9 or more (Ada, Hopper, Blackwell).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from normlab.launch.errors import ConfigError
from torch import nn

if TYPE_CHECKING:
    from normlab.launch.config import RunConfig
    from normlab.launch.config.schema import FP8Section

MIN_CAPABILITY = (8, 9)  # torch._scaled_mm: Ada (8.9) and Hopper (9.0) and newer
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def matches(name: str, pattern: str) -> bool:
    """Whether `pattern` ('head', 'down_proj', 'blocks.0') occurs in `name` as whole parts."""
    return f".{pattern.strip('.')}." in f".{name}."


def fp8_targets(
    module: nn.Module, keep: list[str], skip_small: str | None = None
) -> tuple[list[str], dict[str, int]]:
    """(names of the linear layers FP8 converts, layers each keep-pattern matched);
    `skip_small`: the recipe whose small-GEMM filter also leaves layers out (`pays_in_fp8`)."""
    linears = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    hits = {p: sum(matches(n, p) for n in linears) for p in keep}
    targets = [n for n in linears if not any(matches(n, p) for p in keep)]
    if skip_small is not None:
        targets = [n for n in targets if pays_in_fp8(module.get_submodule(n), skip_small)]
    return targets, hits


def section_targets(module: nn.Module, section: FP8Section) -> tuple[list[str], dict[str, int]]:
    """fp8_targets with the section's keep patterns and its small_gemms choice."""
    skip = section.recipe if section.small_gemms == "skip" else None
    return fp8_targets(module, section.keep, skip)


def pays_in_fp8(layer: nn.Module, recipe: str) -> bool:
    """Whether torchao's auto filter converts this linear layer for `recipe`: dimensions
    divisible by 16 and above the sizes below which torchao's H100 tables measured float8
    slower than bf16 (tensorwise: not K <= 4096 with N <= 1024; rowwise: N > 2048, K > 1024,
    not N <= 4096 with K <= 2048). torchtitan exposes the same filter as auto_filter_small_kn.
    rowwise_with_gw_hp, which torchao's filter does not cover, is judged as rowwise."""
    from torchao.float8 import _auto_filter_for_recipe

    name = "rowwise" if recipe == "rowwise_with_gw_hp" else recipe
    return bool(_auto_filter_for_recipe(name, filter_fqns=[])(layer, ""))


# torchtitan's float8 guide: FP8 "only benefits large GEMMs", rule of thumb K, N > 4096 (layers
# below it are filtered there); on one H200 the 125m and 1b presets (at most 768 x 2048 and
# 2048 x 8192) trained at 0.44-0.78x of bf16's step rate (benchmarks/results/gpu_h200_2026-12-04)
LARGE_GEMM = 4096


def small_gemm_note(module: nn.Module, section: FP8Section) -> str | None:
    """A note when no layer FP8 converts has both dimensions of at least LARGE_GEMM: FP8's casts
    then cost more than its matmuls save (None when one has, or FP8 is off)."""
    shapes = [
        (m.in_features, m.out_features)
        for m in map(module.get_submodule, section_targets(module, section)[0])
        if isinstance(m, nn.Linear)  # every one is (fp8_targets names linear layers): for typing
    ]
    if not shapes or any(min(s) >= LARGE_GEMM for s in shapes):
        return None
    k, n = max(shapes, key=lambda s: (min(s), max(s)))
    return (
        f"precision.fp8: the largest converted layer is {k} x {n}; FP8 pays for GEMMs of about "
        f"{LARGE_GEMM} x {LARGE_GEMM} and up (torchtitan's float8 guide), and on one H200 the "
        "125m and 1b presets trained slower than in bf16 (benchmarks/results/gpu_h200_2026-12-04):"
        " expect little or none"
    )


def emulated(section: FP8Section, device_type: str) -> bool:
    if section.emulate == "auto":
        return device_type != "cuda"
    return section.emulate in ("on", True)


def check_fp8(cfg: RunConfig, device_type: str, local: bool = True) -> None:
    """Everything precision.fp8 would refuse, before anything is written: torchao installed,
    the device (a CPU only emulated; a GPU below SM 8.9 only emulated), layers matched."""
    fp8 = cfg.precision.fp8
    if fp8 is None:
        return
    from normlab.launch.extras import require

    require("torchao", "precision.fp8")
    emulate = emulated(fp8, device_type)
    if device_type == "cpu" and not emulate:
        raise ConfigError(
            "precision.fp8.emulate 'off' needs a CUDA GPU of compute capability 8.9+; on CPU "
            "FP8 is emulated: allowed emulate: auto or on"
        )
    if local and device_type == "cuda" and not emulate:
        capability = torch.cuda.get_device_capability()
        if tuple(capability) < MIN_CAPABILITY:
            raise ConfigError(
                f"precision.fp8 needs a GPU of compute capability 8.9+ for FP8 matmuls (this one "
                f"is {capability[0]}.{capability[1]}); set precision.fp8.emulate: on to emulate "
                "it (no speed-up), or remove precision.fp8"
            )
    from normlab.launch.engines.construct import build_on_meta

    model, _ = build_on_meta(cfg.model_config())
    targets, hits = section_targets(model, fp8)
    unmatched = [p for p, n in hits.items() if n == 0]
    if unmatched:
        example = ", ".join(repr(n) for n in [*targets[:1], "head"])
        raise ConfigError(
            f"precision.fp8.keep pattern {unmatched[0]!r} matches no linear layer; a pattern is "
            f"whole dotted parts of a layer name ({example}, 'down_proj', 'blocks.0')"
        )
    if not targets:
        why = (
            "precision.fp8.small_gemms 'skip' leaves out every layer torchao's filter judges "
            "too small for FP8 to pay, and precision.fp8.keep the rest"
            if fp8.small_gemms == "skip"
            else "precision.fp8.keep keeps every linear layer"
        )
        raise ConfigError(f"{why}: nothing runs in FP8")
    if not emulate:
        shapes = {n: tuple(model.get_submodule(n).weight.shape) for n in targets}  # type: ignore[arg-type]
        odd = [n for n in targets if any(d % 16 for d in shapes[n])]
        if odd:
            raise ConfigError(
                f"precision.fp8: {odd[0]} has a dimension not divisible by 16, which FP8 "
                "matmuls need; add it to precision.fp8.keep or change model.d_model / d_ff"
            )


def float8_config(section: FP8Section, device_type: str, fsdp: bool, smooth: bool) -> Any:
    """torchao's Float8LinearConfig for the recipe, emulated or not; FP8 all-gather only where
    torchao supports it (FSDP2, tensorwise) and not with Smooth-SwiGLU (its rescaled W3 is
    computed from the gathered high-precision weight)."""
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(section.recipe)
    gather = fsdp and section.fsdp_float8_all_gather and section.recipe == "tensorwise"
    return dataclasses.replace(
        config,
        emulate=emulated(section, device_type),
        enable_fsdp_float8_all_gather=gather and not smooth,
    )


def convert_fp8(
    module: nn.Module,
    fp8: FP8Section | None,
    device_type: str,
    *,
    fsdp: bool = False,
    smooth: bool = False,
) -> int:
    """Swap the target linear layers of `module` (on meta or materialised) for torchao's
    Float8Linear (`smooth`: the model has Smooth-SwiGLU); returns how many were converted."""
    if fp8 is None:
        return 0
    from torchao.float8 import convert_to_float8_training

    targets = set(section_targets(module, fp8)[0])
    convert_to_float8_training(
        module,
        module_filter_fn=lambda _m, name: name in targets,
        config=float8_config(fp8, device_type, fsdp, smooth),
    )
    if device_type != "cuda":  # Float8Linear casts under CUDA autocast itself: no hook there
        for _, layer in float8_linears(module):
            layer.register_forward_pre_hook(_autocast_input)
    return len(targets)


def _autocast_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Cast the input to the autocast dtype on any device: Float8Linear does it for CUDA
    autocast only, so under CPU bf16 autocast its operands (fp32 norm output, bf16 output
    gradient) would not share a dtype in the high-precision weight-gradient matmul."""
    x = args[0]
    kind = x.device.type
    if not torch.is_autocast_enabled(kind):
        return None
    return (x.to(torch.get_autocast_dtype(kind)), *args[1:])


def float8_linears(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, layer) of every converted layer (empty without torchao or FP8)."""
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return []
    return [(n, m) for n, m in module.named_modules() if isinstance(m, Float8Linear)]
