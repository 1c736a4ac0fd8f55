"""AdamW state per block, on log steps only (SCIENCE.md 23.2 precursors; issue 32 item 2).

For the AdamW parameters of block i (Muon's matrices carry no second moment and are left out),
with the bias-corrected moments m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t) after the step:

- `adam_update_rms/ii`: RMS over the block's coordinates of m_hat / (sqrt(v_hat) + eps), the Adam
  update per unit learning rate (near 1: sign-like updates; Molybog et al. 2023);
- `adam_m_norm/ii`, `adam_v_norm/ii`: ||m|| and ||sqrt(v)|| (Marin #1368: the first moment doubles
  while the second stays flat; `normlab warnings` scores their rise against the trailing median);
- `eps_floor/ii`: the share of coordinates with sqrt(v_hat) < 10 eps (Wortsman et al. 2023: the
  epsilon floor against a shrinking gradient RMS);
- `grad_mom_cos/ii`: cos(g_t, m_{t-1}) between the step's raw gradient and the first moment
  before the step (the alignment Marin conjectures before update-norm spikes);
- `head_norm`: ||W_head||_F of the output head (Marin's retro: lm_head norm growth).

Nothing is computed or copied on steps that do not log. Every engine hands over this rank's part
of each parameter's gradient and moments through `engine.storage` (FSDP2 shards, the fragments of
DeepSpeed ZeRO's flat fp32 state), whose sums are added across ranks in one collective.
"""

from __future__ import annotations

from typing import Any

import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.engines.storage import AdamPart
from normlab.launch.instruments.common import (
    block_key,
    blocks,
    is_log_step,
    unwrap,
)
from normlab.launch.metric_keys import (
    ADAM_M_NORM,
    ADAM_UPDATE_RMS,
    ADAM_V_NORM,
    EPS_FLOOR,
    GRAD_MOM_COS,
    HEAD_NORM,
)

FLOOR = 10.0  # sqrt(v_hat) < FLOOR * eps counts as on the epsilon floor
# per block sums: u^2, coordinates, m^2, v, floor count, g.m_prev, g^2, m_prev^2
N_SUMS = 8


class AdamState(Callback):
    """Adam's state per block on log steps: update RMS, moment norms, the epsilon-floor share,
    gradient-momentum alignment and the head norm (SCIENCE.md 23.2)."""

    name = "adam_state"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        checked_settings(self.name, settings)
        self._align: torch.Tensor | None = None

    def on_train_start(self, trainer: TrainerView) -> None:
        self._params = [list(b.parameters()) for b in blocks(trainer)]

    @staticmethod
    def _state(trainer: TrainerView, p: torch.nn.Parameter) -> AdamPart | None:
        return trainer.engine.storage.adam_state(trainer.engine.optimizer, p)

    def on_after_backward(self, trainer: TrainerView, step: int) -> None:
        if not is_log_step(trainer, step):
            return
        sums = torch.zeros(2, 3, len(self._params), device=trainer.engine.device)
        storage = trainer.engine.storage
        for i, params in enumerate(self._params):
            rows: tuple[list, list] = ([], [])  # (g, m) pairs of this block: sharded, replicated
            for p, (g, _) in zip(params, storage.local(params, "grad"), strict=True):
                found = self._state(trainer, p)
                if found is None or g is None:
                    continue
                m = found.m.reshape(-1)
                g = g.reshape(-1)[: m.numel()]  # ZeRO-3: the last rank's padding cut
                rows[0 if found.sharded else 1].append((g, m))
            for row, pairs in enumerate(rows):
                if pairs:
                    sums[row, :, i] = _alignment_sums(pairs)
        self._align = sums  # reduced with the rest on step end (one collective)

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._align is None:
            return
        n = len(self._params)
        sums = torch.zeros(2, N_SUMS, n, device=trainer.engine.device)
        sums[:, 5:8] = self._align
        self._align = None
        for i, params in enumerate(self._params):
            rows: tuple[list, list] = ([], [])  # this block's states: sharded, replicated
            for p in params:
                found = self._state(trainer, p)
                if found is not None:
                    rows[0 if found.sharded else 1].append(found)
            for row, parts in enumerate(rows):
                if parts:
                    sums[row, :5, i] = _moment_sums(parts)
        total = trainer.engine.all_reduce(sums[0], "sum") + sums[1]
        u2, count, m2, v, floor, gm, g2, mp2 = total
        have = count > 0
        rms, share = (u2 / count.clamp_min(1)).sqrt(), floor / count.clamp_min(1)
        cos = gm / (g2.sqrt() * mp2.sqrt()).clamp_min(1e-30)
        for i in range(n):
            if have[i]:  # a block all under Muon has no Adam state
                metrics[block_key(ADAM_UPDATE_RMS, i)] = rms[i]
                metrics[block_key(ADAM_M_NORM, i)] = m2[i].sqrt()
                metrics[block_key(ADAM_V_NORM, i)] = v[i].sqrt()
                metrics[block_key(EPS_FLOOR, i)] = share[i]
                metrics[block_key(GRAD_MOM_COS, i)] = cos[i]
        metrics[HEAD_NORM] = head_norm(trainer)


def _alignment_sums(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """(sum g.m_prev, sum g^2, sum m_prev^2) over (gradient, first moment) pairs of flat parts:
    one concatenation each and three dot products in fp32, not three reductions per part."""
    g = torch.cat([gp.float() for gp, _ in pairs])
    m = torch.cat([mp.float() for _, mp in pairs])
    return torch.stack([g @ m, g @ g, m @ m])


def _moment_sums(parts: list[AdamPart]) -> torch.Tensor:
    """(sum u^2, coordinates, sum m^2, sum v, floor count) over the parts' local states, in a
    few fused (foreach) ops over all of them; each part has its own step, betas and eps."""
    ms = [part.m.float() for part in parts]
    vs = [part.v.float() for part in parts]
    bc1 = [1 - part.betas[0] ** part.step for part in parts]
    bc2 = [1 - part.betas[1] ** part.step for part in parts]
    roots = torch._foreach_div(vs, bc2)  # sqrt(v_hat)
    torch._foreach_sqrt_(roots)
    # floor: count of sqrt(v_hat) < FLOOR eps, as the nonzeros of min(sqrt(v_hat) - FLOOR eps, 0)
    below = torch._foreach_sub(roots, [FLOOR * part.eps for part in parts])
    torch._foreach_clamp_max_(below, 0.0)
    floor = torch.stack(torch._foreach_norm(below, 0)).sum()
    del below
    torch._foreach_add_(roots, [part.eps for part in parts])  # sqrt(v_hat) + eps
    u = torch._foreach_div(ms, bc1)
    torch._foreach_div_(u, roots)
    u2 = torch.stack(torch._foreach_norm(u, 2)).square().sum()
    m2 = torch.stack(torch._foreach_norm(ms, 2)).square().sum()
    v_sum = torch.stack(torch._foreach_norm(vs, 1)).sum()  # v >= 0: its sum is its L1 norm
    count = float(sum(m.numel() for m in ms))
    return torch.stack([u2, u2.new_tensor(count), m2, v_sum, floor.to(u2.dtype)])


def head_norm(trainer: TrainerView) -> torch.Tensor:
    """||W_head||_F, its shards summed across ranks."""
    w = unwrap(trainer.engine.model).head.weight  # type: ignore[union-attr]
    assert isinstance(w, torch.nn.Parameter)
    ((part, sharded),) = trainer.engine.storage.local([w], "param")
    assert part is not None
    sq = part.detach().float().square().sum()
    if sharded:
        sq = trainer.engine.all_reduce(sq.reshape(1), "sum")[0]
    return sq.sqrt()
