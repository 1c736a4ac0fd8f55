"""FP8 instruments (SCIENCE.md 24): what the float8 casts of precision.fp8 do to each converted
linear layer, and the activation kurtosis that precedes FP8 divergence (FOG, Fishman et al.).

Per converted layer `blocks.i.<...>.<name>`, over the training micro-batches of a log step:
- `fp8_in_amax/i/<name>`, `fp8_w_amax/i/<name>`: max |x| of the input and of the weight;
- `fp8_in_scale/i/<name>`, `fp8_w_scale/i/<name>`: the smallest scale torchao multiplies by
  before the e4m3 cast (torchao's own `tensor_to_scale` with the layer's recipe: one scale per
  tensor for tensorwise, per row and rounded down to a power of two for rowwise; the smallest is
  the row holding the amax);
- `fp8_in_under/i/<name>`, `fp8_w_under/i/<name>`: the share of nonzero elements whose scaled
  e4m3 cast is zero (underflow);
- `fp8_in_over/i/<name>`, `fp8_w_over/i/<name>`: the share of elements beyond e4m3's largest
  value, 448, at unit scale. Dynamic scaling maps each amax to 448, so the scaled cast never
  saturates; this share says how much of the tensor an unscaled (or stale, delayed) cast would
  clip, i.e. how far the tensor has left e4m3's range.
`fp8_under` and `fp8_over` are the largest shares over the layers.

Per block, at the input of the down projection (the SwiGLU product; with Smooth-SwiGLU the
smoothed product that is cast) and at the block output, the two estimators of
launch/instruments/outlier_kurtosis.py (docs/SCIENCE.md 24, normlab's outlier kurtosis; FOG
monitors kurtosis [2nd]):
`kurtosis_swiglu/i`, `kurtosis_resid/i`, the element kurtosis mean(x^4) / mean(x^2)^2 over all
entries, raw (3 for a zero-mean Gaussian), and `neuron_kurtosis_swiglu/i`,
`neuron_kurtosis_resid/i`, He et al.'s neuron-norm kurtosis (1 when every neuron has the same
RMS). The block-output pair equals instruments.kurtosis's `kurtosis/i`, `neuron_kurtosis/i`.

Hooks exist only during log steps (armed at the end of the step before): other steps run none.
The sums stay on the device until the trainer's one copy per log step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.engines.fp8 import E4M3_MAX, float8_linears
from normlab.launch.engines.recompute import recomputing
from normlab.launch.instruments.common import block_key, is_log_step, unwrap
from normlab.launch.instruments.outlier_kurtosis import (
    moment_row,
    outlier_hook,
    report_outlier_kurtosis,
)
from normlab.launch.metric_keys import (
    ELEMENT_KURTOSIS_RESID,
    ELEMENT_KURTOSIS_SWIGLU,
    FP8_IN_AMAX,
    FP8_IN_OVER,
    FP8_IN_SCALE,
    FP8_IN_UNDER,
    FP8_OVER,
    FP8_UNDER,
    FP8_W_AMAX,
    FP8_W_OVER,
    FP8_W_SCALE,
    FP8_W_UNDER,
    NEURON_KURTOSIS_RESID,
    NEURON_KURTOSIS_SWIGLU,
)
from torch import nn
from torch.utils.hooks import RemovableHandle

# per layer: amax, scale (reduced by max and min), under count, over count, elements (summed)
IN_AMAX, IN_SCALE, W_AMAX, W_SCALE = 0, 1, 2, 3
IN_UNDER, IN_OVER, IN_N, W_UNDER, W_OVER, W_N = 0, 1, 2, 3, 4, 5


@torch.no_grad()
def cast_stats(x: torch.Tensor, cast: Any, axiswise_dim: int, pow2: bool) -> torch.Tensor:
    """[amax, smallest scale, underflow count, unit-scale overflow count, elements] of x cast
    to float8 as torchao casts it (`cast`: the layer's CastConfig)."""
    from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated

    x = x.detach()
    scale = tensor_to_scale(
        x,
        cast.target_dtype,
        scaling_granularity=cast.scaling_granularity,
        axiswise_dim=axiswise_dim,
        round_scales_to_power_of_2=pow2,
    )
    q = to_fp8_saturated(x.float() * scale, cast.target_dtype)
    under = ((q.float() == 0) & (x != 0)).sum()
    over = (x.abs() > E4M3_MAX).sum()
    n = torch.tensor(x.numel(), device=x.device, dtype=torch.float64)
    return torch.stack([x.abs().amax().float(), scale.amin().float(), under, over, n]).double()


def _weight(layer: nn.Module) -> torch.Tensor:
    """The high-precision weight the layer casts (unwrapping torchao's FSDP float8 wrappers)."""
    w: Any = layer.weight
    w = getattr(w, "_tensor", w)  # WeightWithDynamicFloat8CastTensor
    if hasattr(w, "_data") and hasattr(w, "_scale"):  # already float8 (float8 all-gather)
        w = w.to_original_precision()
    return w


class FP8Stats(Callback):
    """The FP8 cast statistics of every converted layer and the activation kurtosis, on log
    steps. Without precision.fp8 only the kurtosis is logged."""

    name = "fp8"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._handles: list[RemovableHandle] = []
        self._layers: list[tuple[int, str, nn.Module]] = []
        self._swiglu_blocks: list[int] = []  # the blocks whose down projection is hooked

    def on_train_start(self, trainer: TrainerView) -> None:
        model = unwrap(trainer.engine.model)
        self._layers = []
        for name, layer in float8_linears(model):
            parts = name.split(".")
            if parts[0] == "blocks":
                self._layers.append((int(parts[1]), parts[-1], layer))
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    def _arm(self, trainer: TrainerView) -> None:
        model: Any = unwrap(trainer.engine.model)  # a Transformer (blocks, mlp.branch)
        device = next(model.parameters()).device
        n = len(self._layers)
        self._extreme = torch.zeros(n, 4, device=device, dtype=torch.float64)
        self._extreme[:, [IN_SCALE, W_SCALE]] = float("inf")
        self._counts = torch.zeros(n, 6, device=device, dtype=torch.float64)
        down = getattr(model.blocks[0].mlp.branch, "down_proj", None)
        d_ff = down.in_features if down is not None else 0
        rows = [moment_row(w, device) for w in (d_ff, model.config.d_model)]
        self._swiglu, self._resid = (torch.stack([r] * len(model.blocks)) for r in rows)
        for j, (_, _, layer) in enumerate(self._layers):
            self._handles.append(layer.register_forward_pre_hook(self._cast_hook(j)))
        self._swiglu_blocks = []
        for i, block in enumerate(model.blocks):
            down = getattr(block.mlp.branch, "down_proj", None)
            if down is not None and hasattr(block.mlp.branch, "gate_proj"):  # SwiGLU
                self._swiglu_blocks.append(i)
                hook = outlier_hook(self._swiglu[i], pre=True)
                self._handles.append(down.register_forward_pre_hook(hook))
            self._handles.append(block.register_forward_hook(outlier_hook(self._resid[i])))

    def _cast_hook(self, j: int) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        extreme, counts = self._extreme[j], self._counts[j]

        def hook(layer: nn.Module, args: tuple[Any, ...]) -> None:
            if not layer.training or recomputing():
                return
            c: Any = layer.config  # torchao's Float8LinearConfig
            pow2 = c.round_scales_to_power_of_2
            x = args[0]
            if torch.is_autocast_enabled(x.device.type):  # as the layer will cast it
                x = x.to(torch.get_autocast_dtype(x.device.type))
            xs = cast_stats(x, c.cast_config_input, -1, pow2)
            ws = cast_stats(_weight(layer).t(), c.cast_config_weight, 0, pow2)
            extreme[[IN_AMAX, W_AMAX]] = torch.maximum(
                extreme[[IN_AMAX, W_AMAX]], torch.stack([xs[0], ws[0]])
            )
            extreme[[IN_SCALE, W_SCALE]] = torch.minimum(
                extreme[[IN_SCALE, W_SCALE]], torch.stack([xs[1], ws[1]])
            )
            counts.add_(torch.cat([xs[2:], ws[2:]]))

        return hook

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._handles:
            self._disarm()
            self._report(trainer, metrics)
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def _report(self, trainer: TrainerView, metrics: dict[str, Any]) -> None:
        engine = trainer.engine
        if self._layers:
            amax = engine.all_reduce(self._extreme[:, [IN_AMAX, W_AMAX]].contiguous(), "max")
            scale = engine.all_reduce(self._extreme[:, [IN_SCALE, W_SCALE]].contiguous(), "min")
            counts = engine.all_reduce(self._counts.clone(), "sum")
            n_in, n_w = counts[:, IN_N].clamp_min(1), counts[:, W_N].clamp_min(1)
            shares = {
                FP8_IN_UNDER: counts[:, IN_UNDER] / n_in,
                FP8_IN_OVER: counts[:, IN_OVER] / n_in,
                FP8_W_UNDER: counts[:, W_UNDER] / n_w,
                FP8_W_OVER: counts[:, W_OVER] / n_w,
            }
            values = {
                FP8_IN_AMAX: amax[:, 0],
                FP8_W_AMAX: amax[:, 1],
                FP8_IN_SCALE: scale[:, 0],
                FP8_W_SCALE: scale[:, 1],
                **shares,
            }
            for j, (block, sub, _) in enumerate(self._layers):
                for kind, column in values.items():
                    metrics[block_key(kind, block, sub)] = column[j].float()
            under = torch.stack([shares[FP8_IN_UNDER], shares[FP8_W_UNDER]])
            over = torch.stack([shares[FP8_IN_OVER], shares[FP8_W_OVER]])
            metrics[FP8_UNDER], metrics[FP8_OVER] = under.amax().float(), over.amax().float()
        swiglu = engine.all_reduce(self._swiglu.clone(), "sum")
        resid = engine.all_reduce(self._resid.clone(), "sum")
        report_outlier_kurtosis(
            metrics, swiglu, ELEMENT_KURTOSIS_SWIGLU, NEURON_KURTOSIS_SWIGLU, self._swiglu_blocks
        )
        report_outlier_kurtosis(metrics, resid, ELEMENT_KURTOSIS_RESID, NEURON_KURTOSIS_RESID)

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        self._disarm()
