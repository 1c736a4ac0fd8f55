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
            for p, (g, _) in zip(params, storage.local(params, "grad"), strict=True):
                found = self._state(trainer, p)
                if found is None or g is None:
                    continue
                m = found.m.float().flatten()
                g = g.float().flatten()[: m.numel()]  # ZeRO-3: the last rank's padding cut
                row = 0 if found.sharded else 1
                sums[row, :, i] += torch.stack([(g * m).sum(), g.square().sum(), m.square().sum()])
        self._align = sums  # reduced with the rest on step end (one collective)

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if self._align is None:
            return
        n = len(self._params)
        sums = torch.zeros(2, N_SUMS, n, device=trainer.engine.device)
        sums[:, 5:8] = self._align
        self._align = None
        for i, params in enumerate(self._params):
            for p in params:
                found = self._state(trainer, p)
                if found is not None:
                    sums[0 if found.sharded else 1, :5, i] += _moment_sums(found)
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


def _moment_sums(part: AdamPart) -> torch.Tensor:
    """(sum u^2, coordinates, sum m^2, sum v, floor count) of one parameter's local state."""
    b1, b2 = part.betas
    t, eps = part.step, part.eps
    m, v = part.m.float(), part.v.float()
    root = (v / (1 - b2**t)).sqrt()
    u = (m / (1 - b1**t)) / (root + eps)
    floor = (root < FLOOR * eps).sum()
    return torch.stack(
        [u.square().sum(), torch.tensor(float(m.numel()), device=m.device),
         m.square().sum(), v.sum(), floor.float()]
    )  # fmt: skip


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
