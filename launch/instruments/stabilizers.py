"""What the attention stabilizers do (SCIENCE.md 12-14), and the baselines they are judged by.

On log steps (the training micro-batches of that step, like the other instruments; forward hooks
are armed only then) it logs, per block i:
- `first_token_share/i`: mean over batch, heads and query positions t >= 1 of P[t, 0], the
  attention the first token draws (the "attention sink" gating is reported to remove);
- `massive_act/i`: max |x| / median |x| of the block's output stream (massive activations);
- with a gate, `gate_mean/i` and `gate_hist/i/bK` (10 bins on [0, 1], shares summing to 1);
- with sinks, `sink_mass/i` (the probability left on the sink, mean over heads and rows) and
  `sink_logit/i/hj` (the learned s_h);
- with an attention cap c, `attn_cap_share/i`: the share of unmasked logits with |S| >= c;
and for the output cap c: `final_cap_share` (|z| >= c) and `final_cap_ratio` (max |z| / c).
P is read from the attention's probe (launch/instruments/attention_probe.py): recomputed from the
tapped q, k in fp32 once per log-step forward for every instrument that reads it (an O(T^2)
product on log steps only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.attention_probe import Reader, Subscription, subscribe
from normlab.launch.instruments.common import (
    attention_of,
    block_key,
    blocks,
    is_log_step,
    unwrap,
)
from normlab.model.attention_cores import SoftCap, future_mask
from normlab.model.gating import NoGate
from torch import nn
from torch.utils.hooks import RemovableHandle

BINS = 10
FIRST_TOKEN, MASSIVE = "first_token_share", "massive_act"
GATE_MEAN, GATE_HIST = "gate_mean", "gate_hist"
SINK_MASS, SINK_LOGIT, ATTN_CAP = "sink_mass", "sink_logit", "attn_cap_share"
FINAL_CAP_SHARE, FINAL_CAP_RATIO = "final_cap_share", "final_cap_ratio"


def lower_median(a: torch.Tensor) -> torch.Tensor:
    """`torch.median` of a flat tensor (the lower of the two middle values), as a 0-d tensor of
    its device: on the CPU by numpy's introselect (O(n), several times faster than torch's
    there), elsewhere by torch (no host copy), and by torch inside a compiled graph (numpy's
    partition would break it)."""
    if a.device.type != "cpu" or torch.compiler.is_compiling():
        return a.median()
    middle = (a.numel() - 1) // 2
    return torch.as_tensor(np.partition(a.numpy(), middle)[middle])


class AttentionStabilizers(Callback):
    """Gate, sink, cap and attention-sink statistics on log steps (keys in the module doc)."""

    name = "attention_stabilizers"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._handles: list[RemovableHandle | Subscription] = []
        self._sums: dict[str, torch.Tensor] = {}  # key -> running [sum, count]
        self._maxes: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer: TrainerView) -> None:
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    # --- accumulation ---------------------------------------------------------------------
    def _mean(self, key: str, total: torch.Tensor, count: float) -> None:
        pair = torch.stack([total.detach().double(), total.new_tensor(count).double()])
        self._sums[key] = self._sums[key] + pair if key in self._sums else pair

    def _max(self, key: str, value: torch.Tensor) -> None:
        value = value.detach().double()
        self._maxes[key] = torch.maximum(self._maxes[key], value) if key in self._maxes else value

    # --- hooks ----------------------------------------------------------------------------
    def _arm(self, trainer: TrainerView) -> None:
        model = unwrap(trainer.engine.model)
        for i, block in enumerate(blocks(trainer)):
            att = attention_of(block)
            self._handles.append(subscribe(att, self._attention_reader(att.core, i), weights=True))
            if not isinstance(att.gate, NoGate):
                self._handles.append(att.gate.register_forward_hook(self._gate_hook(i)))
            self._handles.append(block.register_forward_hook(self._block_hook(i)))
        if isinstance(model.final_cap, SoftCap):
            self._handles.append(model.final_cap.register_forward_hook(self._final_hook))

    def _attention_reader(self, core: nn.Module, i: int) -> Reader:
        """Block i's attention statistics from the probe's shared S and P (B, H, T, T)."""

        def read(q: torch.Tensor, k: torch.Tensor, s: Any, p: Any) -> None:
            B, H, T, _ = p.shape
            self._mean(block_key(FIRST_TOKEN, i), p[:, :, 1:, 0].sum(), B * H * (T - 1))
            if hasattr(core, "sinks"):
                self._mean(block_key(SINK_MASS, i), (1 - p.sum(-1)).sum(), B * H * T)
            if core.cap is not None:
                seen = ~future_mask(T, s.device)
                hit = ((s.abs() >= core.cap) & seen).sum()
                causal = T * (T + 1) // 2  # unmasked (i, j): no host sync under compile
                self._mean(block_key(ATTN_CAP, i), hit.double(), B * H * causal)

        return read

    def _gate_hook(self, i: int):  # noqa: ANN202
        def hook(gate: nn.Module, args: Any, out: Any) -> None:
            if not gate.training:
                return
            with torch.no_grad():
                g = gate.gate(args[0]).float()
                self._mean(block_key(GATE_MEAN, i), g.sum(), g.numel())
                counts = torch.histc(g, bins=BINS, min=0.0, max=1.0)
                for b in range(BINS):
                    self._mean(block_key(GATE_HIST, i, f"b{b}"), counts[b], g.numel())

        return hook

    def _block_hook(self, i: int):  # noqa: ANN202
        def hook(block: nn.Module, args: Any, out: torch.Tensor) -> None:
            if not block.training:
                return
            with torch.no_grad():
                a = out.detach().abs().float().flatten()
                self._max(block_key(MASSIVE, i), a.max() / lower_median(a).clamp_min(1e-30))

        return hook

    def _final_hook(self, cap: nn.Module, args: Any, out: torch.Tensor) -> None:
        if not cap.training:
            return
        with torch.no_grad():
            z = args[0].detach()
            self._mean(FINAL_CAP_SHARE, (z.abs() >= cap.cap).sum().double(), z.numel())
            self._max(FINAL_CAP_RATIO, z.abs().max() / cap.cap)

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # --- logging --------------------------------------------------------------------------
    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._handles:
            self._disarm()
            engine = trainer.engine
            for key, pair in self._sums.items():
                total = engine.all_reduce(pair, "sum")
                metrics[key] = (total[0] / total[1].clamp_min(1)).float()
            for key, value in self._maxes.items():
                metrics[key] = engine.all_reduce(value, "max").float()
            for i, block in enumerate(blocks(trainer)):
                sinks = getattr(attention_of(block).core, "sinks", None)
                whole = [] if sinks is None else engine.storage.full(sinks).float()
                for h, value in enumerate(whole):
                    metrics[block_key(SINK_LOGIT, i, f"h{h}")] = value
            self._sums, self._maxes = {}, {}
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        self._disarm()
