"""QK spectral entropy per block, on log steps only: normlab's stand-in (SCIENCE.md 23.2) for the
monitor of arXiv 2606.28116, whose exact decomposition is not reproduced here.

For head h with query rows W_q^h and key rows W_k^h (d_h x d; grouped-query heads share their key
head), the bilinear form of its attention logits is B_h = W_q^hT W_k^h (d x d, rank <= d_h). Its
nonzero singular values, normalised to a distribution p, give the entropy H_h = -sum p log p
(nats; log d_h when the spectrum is flat, 0 for rank one). They are computed without forming B_h:
with W_q^hT = Q_q R_q and W_k^hT = Q_k R_k (thin QR), B_h = Q_q (R_q R_k^T) Q_k^T, so the values
are those of the d_h x d_h matrix R_q R_k^T. Logged: `qk_entropy/ii`, the minimum over heads
(a collapse is a drop). QK-norm, RoPE and the 1/sqrt(d_h) scale are outside the weights and
outside this statistic.

Sharded weights (FSDP2 DTensors, ZeRO-3 partitions) are gathered through the engine's
`storage.full` on every rank, on log steps only.
"""

from __future__ import annotations

from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import (
    attention_of,
    block_key,
    blocks,
    is_log_step,
)
from normlab.launch.metric_keys import QK_ENTROPY


def spectral_entropy(wq: torch.Tensor, wk: torch.Tensor) -> torch.Tensor:
    """Entropy of the normalised singular values of wq^T wk (wq, wk: d_h x d, or batches of them
    (..., d_h, d): one batched QR and SVD for every head of a block)."""
    rq = torch.linalg.qr(wq.float().mT, mode="r").R
    rk = torch.linalg.qr(wk.float().mT, mode="r").R
    s = torch.linalg.svdvals(rq @ rk.mT)
    p = s / s.sum(-1, keepdim=True).clamp_min(1e-30)
    return torch.special.entr(p).sum(-1)


class QKSpectrum(Callback):
    """QK spectral entropy per block on log steps (min over heads): normlab's stand-in for the
    attention statistic of arXiv 2606.28116 (SCIENCE.md 23.2)."""

    name = "qk_spectrum"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if is_log_step(trainer, step):  # no_grad inside: off log steps nothing, not even that
            with torch.no_grad():
                self._log(trainer, metrics)

    def _log(self, trainer: TrainerView, metrics: dict[str, Any]) -> None:
        storage = trainer.engine.storage
        for i, block in enumerate(blocks(trainer)):
            att = attention_of(block)
            wq, wk = (storage.full(w) for w in (att.q_proj.weight, att.k_proj.weight))
            dh, group = att.head_dim, att.n_heads // (att.n_kv_heads or att.n_heads)
            q_heads = wq.reshape(att.n_heads, dh, -1)
            k_heads = wk.reshape(-1, dh, wk.shape[-1]).repeat_interleave(group, dim=0)
            metrics[block_key(QK_ENTROPY, i)] = spectral_entropy(q_heads, k_heads).min()
