"""Attention entropy per layer on log steps (SCIENCE.md 23.2: entropy collapse accompanies
divergence, Zhai et al. 2023, arXiv 2303.06296).

For head h of block i, query row r of a sequence attends with probabilities P_r over its keys
(the causal mask respected, through the attention core's own `weights`: soft-cap and sinks
included, a sink's share left out of the keys); its entropy is H_r = -sum_j P_rj log P_rj (nats,
at most log(r + 1)). Logged: `attn_entropy/ii`, the minimum over heads of the mean of H_r over
every row of every sequence of the step (all micro-batches, all ranks). A collapse is a drop,
which `normlab warnings` scores as a falling signal.

A reader of each attention's probe (launch/instruments/attention_probe.py: one forward hook on
`qk_tap`, the q and k the logits see, armed only for log steps, recomputing P in at least fp32
once for every instrument that reads it) adds per-head sums of H_r and the row counts in place
on the device; one all-reduce on the step's end. Unlogged steps run the plain fused attention:
nothing is computed or copied.
"""

from __future__ import annotations

from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.attention_probe import Reader, Subscription, subscribe
from normlab.launch.instruments.common import attention_of, block_key, blocks, is_log_step
from normlab.launch.metric_keys import ATTN_ENTROPY


def row_entropy(p: torch.Tensor) -> torch.Tensor:
    """-sum_j p_j log p_j over the last axis (0 log 0 = 0): `entr`, one elementwise kernel."""
    return torch.special.entr(p).sum(dim=-1)


class AttentionEntropy(Callback):
    """Logs `attn_entropy/ii`: min over heads of the mean row entropy of block i's attention."""

    name = "attn_entropy"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._handles: list[Subscription] = []
        self._sums: torch.Tensor | None = None  # (blocks, 2, heads): sum of H_r, rows

    def on_train_start(self, trainer: TrainerView) -> None:
        if is_log_step(trainer, trainer.step + 1):
            self._arm(trainer)

    def _arm(self, trainer: TrainerView) -> None:
        atts = [attention_of(b) for b in blocks(trainer)]
        device = atts[0].q_proj.weight.device
        self._sums = torch.zeros(len(atts), 2, atts[0].n_heads, dtype=torch.float64, device=device)
        for i, att in enumerate(atts):
            self._handles.append(subscribe(att, self._reader(self._sums[i]), weights=True))

    @staticmethod
    def _reader(sums: torch.Tensor) -> Reader:
        """Fold one forward's per-head entropy sums into `sums` (2, heads), this block's slice."""

        def read(q: torch.Tensor, k: torch.Tensor, s: Any, p: Any) -> None:
            h = row_entropy(p)  # (B, H, T)
            rows = torch.full_like(h[0, :, 0], h.shape[0] * h.shape[2], dtype=torch.float64)
            sums.add_(torch.stack([h.double().sum(dim=(0, 2)), rows]))

        return read

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._handles and self._sums is not None:
            self._disarm()
            total = trainer.engine.all_reduce(self._sums, "sum")
            mean = (total[:, 0] / total[:, 1].clamp_min(1)).float()  # (blocks, heads)
            for i in range(mean.shape[0]):
                metrics[block_key(ATTN_ENTROPY, i)] = mean[i].min()
        if is_log_step(trainer, step + 1):
            self._arm(trainer)

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        self._disarm()
