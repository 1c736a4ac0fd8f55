"""QK-Clip (Kimi K2 report, 2025, section 2.1 and Algorithm 1; SCIENCE.md section 7).

Every training step, a forward hook on each attention's `qk_tap` (q, k as the logits see them:
after QK-Norm, µP's q multiplier and RoPE) computes the exact per-head maximum pre-softmax logit
of its forward pass (`model.attention.causal_max_logits`: causal mask respected, streamed over
query blocks so no T x T matrix is kept); the model itself computes none. The maxima of every
micro-batch are folded together and MAX-reduced across data-parallel ranks into S_max (blocks,
heads). After the optimizer step, each head with S_max > tau gets gamma = tau / S_max:

- MHA: W_q^h *= gamma^alpha, W_k^h *= gamma^(1 - alpha) (rows of the projection and its bias);
- GQA (a key head shared by several query heads): W_q^h *= gamma, keys untouched (normlab's choice);
- QK-Norm: the gains are the last scale before the logit, so they are clipped instead: the `flat`
  gain slice of each head, or, for the `head` axis's single shared gain, the smallest gamma.

Heads under tau are multiplied by exactly 1.0 (bit-identical) and no host sync is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config import OptimSection
from normlab.launch.engines.storage import scale_rows_
from normlab.launch.instruments.common import attention_of, block_key, fold_max_logits, unwrap
from normlab.launch.metric_keys import CLIP_EVENTS, CLIPS, S_MAX  # noqa: F401 (re-exported)
from normlab.model.attention import Attention, FlatQKNorm, HeadQKNorm
from torch import nn

RowScaler = Callable[[torch.Tensor, torch.Tensor], None]  # (param, factors): rows times factors


def clip_factors(s_max: torch.Tensor, tau: float) -> torch.Tensor:
    """gamma per head: tau / S_max where S_max > tau, else exactly 1."""
    return torch.where(s_max > tau, tau / s_max, torch.ones_like(s_max))


def _per_row(gamma: torch.Tensor, head_dim: int) -> torch.Tensor:
    return gamma.repeat_interleave(head_dim)  # (heads * head_dim,)


def _scale_linear_(linear: nn.Linear, rows: torch.Tensor, scale: RowScaler) -> None:
    scale(linear.weight, rows)
    if linear.bias is not None:
        scale(linear.bias, rows)


@torch.no_grad()
def qk_clip_(
    att: Attention, s_max: torch.Tensor, tau: float, alpha: float, scale: RowScaler = scale_rows_
) -> torch.Tensor:
    """Rescale one attention's q/k weights (or QK-Norm gains) after the step; returns gamma.

    `scale(param, factors)` multiplies row r of param by factors[r] wherever the engine keeps
    the weights (DTensor shards, ZeRO partitions and their fp32 master copies)."""
    gamma = clip_factors(s_max.float(), tau)
    groups = att.n_heads // att.n_kv_heads
    q_pow = 1.0 if groups > 1 else alpha  # GQA: only the query head moves
    if isinstance(att.q_norm, HeadQKNorm):
        g = gamma.min().reshape(1)
        scale(att.q_norm.weight, g.pow(q_pow).expand(att.head_dim))
        if groups == 1:
            scale(att.k_norm.weight, g.pow(1 - alpha).expand(att.head_dim))
        return gamma
    q_rows = _per_row(gamma.pow(q_pow), att.head_dim)
    k_rows = _per_row(gamma.pow(1 - alpha), att.head_dim) if groups == 1 else None
    if isinstance(att.q_norm, FlatQKNorm):
        scale(att.q_norm.weight, q_rows)
        if k_rows is not None:
            scale(att.k_norm.weight, k_rows)
    else:
        _scale_linear_(att.q_proj, q_rows, scale)
        if k_rows is not None:
            _scale_linear_(att.k_proj, k_rows, scale)
    return gamma


class QKClip(Callback):
    """Hooks S_max out of every training forward and clips after every optimizer step.

    Logs `s_max/i/hj` per head, `s_max/i` per block, `s_max` over the model, `qk_clips/i` and
    `qk_clips` (heads clipped this step) and `qk_clip_events` (clipped heads since step 1).
    """

    name = "qk_clip"

    def __init__(self, tau: float, alpha: float) -> None:
        self.tau, self.alpha = tau, alpha
        self.events = 0.0
        self._events: torch.Tensor | None = None
        self._best: torch.Tensor | None = None

    def on_train_start(self, trainer: TrainerView) -> None:
        self._atts = [attention_of(b) for b in unwrap(trainer.engine.model).blocks]
        device = self._atts[0].q_proj.weight.device
        self._best = torch.full((len(self._atts), self._atts[0].n_heads), -torch.inf, device=device)
        self._events = torch.tensor(self.events, device=device)
        for i, att in enumerate(self._atts):  # each hook holds its row of S_max, not its index
            att.qk_tap.register_forward_hook(fold_max_logits(self._best[i]))

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        assert self._best is not None and self._events is not None
        s_max = trainer.engine.all_reduce(self._best.clone(), "max")  # _best is reset below
        clipped = (s_max > self.tau).sum(dim=1).float()
        if metrics.get("skipped"):  # a vetoed step changed no weight: nothing to clip
            clipped = torch.zeros_like(clipped)
        else:
            for att, row in zip(self._atts, s_max, strict=True):
                qk_clip_(att, row, self.tau, self.alpha, trainer.engine.storage.scale_rows_)
        self._events = self._events + clipped.sum()
        for i in range(s_max.shape[0]):
            for h in range(s_max.shape[1]):
                metrics[block_key(S_MAX, i, f"h{h}")] = s_max[i, h]
            metrics[block_key(S_MAX, i)] = s_max[i].amax()
            metrics[block_key(CLIPS, i)] = clipped[i]
        metrics[S_MAX], metrics[CLIPS], metrics[CLIP_EVENTS] = (
            s_max.amax(),
            clipped.sum(),
            self._events,
        )
        self._best.fill_(-torch.inf)  # in place: the hooks hold its rows

    def state_dict(self) -> dict[str, Any]:
        return {"events": float(self._events) if self._events is not None else self.events}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.events = float(state.get("events", 0.0))


def optim_callbacks(cfg: OptimSection) -> list[Callback]:
    """Per-step work of the optimizer section beyond the step itself: QK-Clip when configured."""
    if cfg.qk_clip is None:
        return []
    return [QKClip(cfg.qk_clip.tau, cfg.qk_clip.alpha)]
