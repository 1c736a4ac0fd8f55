"""Per-head maximum attention logit (SCIENCE.md section 7) and QK-Norm gain norms.

The model computes neither quantity itself: on log steps this instrument hooks each attention
from outside. Mode `exact` (default): a reader of the attention's probe (a forward hook on
`Attention.qk_tap`: q, k after QK-Norm, µP's q multiplier and RoPE; launch/instruments/
attention_probe.py) takes the exact max of q k^T / sqrt(d_head) (causal mask respected) beside
the fused SDPA call: from the logits the probe recomputed for the entropy or stabilizer
instruments when they are on, else streamed (`model.attention.causal_max_logits`).
Mode `lse_bound`: a forward pre-hook on `Attention.core` asks it for bounds (`bounds=True`), so
it runs a fused kernel that also returns each row's log-sum-exp, and a forward hook on the core
logs the cheap bound
lse_i - log(n_i) <= max_j s_ij <= lse_i instead (`max_logit_lower/...`, `max_logit_upper/...`):
no T x T work beyond the attention itself. The hooks fold every training micro-batch into a
running max, reduced with MAX across ranks, and are removed after the log step: unlogged steps
(and evaluation passes) run the plain fused path only.
"""

from __future__ import annotations

from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.attention_probe import Subscription, max_logits, subscribe
from normlab.launch.instruments.common import (
    MAX_LOGIT,
    MAX_LOGIT_LOWER,
    MAX_LOGIT_UPPER,
    QK_GAIN,
    attention_of,
    block_key,
    blocks,
    is_log_step,
)
from normlab.launch.instruments.gradients import local_parts, sum_squares
from normlab.model.attention import Attention
from torch import nn
from torch.utils.hooks import RemovableHandle

# mode -> the metric kinds it logs, in the order its hooks fold them (the core's (lower, upper))
MODES = {"exact": (MAX_LOGIT,), "lse_bound": (MAX_LOGIT_LOWER, MAX_LOGIT_UPPER)}


class AttentionLogits(Callback):
    """Logs `max_logit/i/hj` per head, `max_logit/i` per block and `max_logit` over the model."""

    name = "attention_logits"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        self.mode = checked_settings(self.name, settings).mode
        self._handles: list[RemovableHandle | Subscription] = []
        self._best: torch.Tensor | None = None  # (kinds, blocks, heads): [max] or [lower, upper]

    def on_train_start(self, trainer: TrainerView) -> None:
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    def _arm(self, trainer: TrainerView) -> None:
        atts = [attention_of(b) for b in blocks(trainer)]
        device = atts[0].q_proj.weight.device
        shape = (len(MODES[self.mode]), len(atts), atts[0].n_heads)
        self._best = torch.full(shape, float("-inf"), device=device)
        for i, att in enumerate(atts):
            self._handles += self._hooks(att, self._best[:, i])

    def _hooks(self, att: Attention, best: torch.Tensor) -> list[RemovableHandle | Subscription]:
        """Hook one attention to fold a training forward's values into `best` (kinds, heads),
        this block's slice: the hooks hold the slice, not the block index, so per-block compiled
        blocks share one graph."""
        if self.mode == "exact":  # from the shared S when another reader made it
            row = best[0]

            def read(q: torch.Tensor, k: torch.Tensor, s: Any, p: Any) -> None:
                row.copy_(torch.maximum(row, max_logits(q, k, s)))

            return [subscribe(att, read, weights=False)]

        def ask(core: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
            return (args, {**kwargs, "bounds": True}) if core.training else None

        def fold(core: nn.Module, args: Any, out: tuple[torch.Tensor, Any]) -> None:
            if core.training:  # evaluation passes are not the training step's logits
                for slot, value in enumerate(out[1]):  # the bounds: (lower, upper)
                    best[slot].copy_(torch.maximum(best[slot], value))

        return [
            att.core.register_forward_pre_hook(ask, with_kwargs=True),
            att.core.register_forward_hook(fold),
        ]

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._handles:
            self._disarm()
            all_best = trainer.engine.all_reduce(self._best, "max")
            for kind, best in zip(MODES[self.mode], all_best, strict=True):
                per_block = best.amax(dim=1)
                for i in range(best.shape[0]):
                    for h in range(best.shape[1]):
                        metrics[block_key(kind, i, f"h{h}")] = best[i, h]
                    metrics[block_key(kind, i)] = per_block[i]
                metrics[kind] = per_block.amax()
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        self._disarm()


class QKGains(Callback):
    """Logs `qk_gain/i/q` and `qk_gain/i/k`: the L2 norm of each QK-Norm gain (absent without
    QK-Norm). Growing gains are how QK-Norm lets logits grow again (SCIENCE.md section 7)."""

    name = "qk_gains"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)

    def on_train_start(self, trainer: TrainerView) -> None:
        self._gains: list[tuple[str, torch.Tensor]] = []
        for i, block in enumerate(blocks(trainer)):
            att = attention_of(block)
            for sub, norm in (("q", att.q_norm), ("k", att.k_norm)):
                if getattr(norm, "weight", None) is not None:
                    self._gains.append((block_key(QK_GAIN, i, sub), norm.weight))

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if not self._gains or not is_log_step(trainer, step):
            return
        parts = local_parts(trainer, [w for _, w in self._gains], "param")
        sq = sum_squares(trainer, [[part] for part in parts])
        for (key, _), value in zip(self._gains, sq.sqrt(), strict=True):
            metrics[key] = value
