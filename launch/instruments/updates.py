"""Update-norm spikes per block: how far a step's update jumps above that block's recent updates.

For block i at step t the update norm is u_t = ||W_after - W_before||, the L2 norm over all of
the block's parameters, measured every step (an update spike often comes before the loss spike
it causes, and lasts one step: a log-step sample would miss it). Its spike ratio is

    r_t = u_t / median(u_{t-w}, ..., u_{t-1})

over the previous `window` applied updates of that block (normlab's definition; the median, not
the mean, so that one spike does not raise the bar for the next ones). Step t is an update spike
of block i when r_t >= `threshold`. A step whose update is zero (skipped by the spike policy or
the fp16 loss scaler) or non-finite is no update: it is neither scored nor enters the window.
Scoring starts once the window is full; a run shorter than twice the window uses steps // 2.
A step at which the spike policy rolled back (its `rollbacks` count rose) moved the weights by a
restore, not an update: it is not scored either.

Logged on log steps, per block: `update_norm/ii` (this step's u_t), `update_spikes/ii` (spikes
so far), `update_ratio_max/ii` (the largest r_t so far); and `update_spike_steps` (steps at
which some block spiked). The norms stay on the device between log steps (one host copy per log
step); keeping W_before costs one fused copy of the blocks' parameters per step into buffers kept
from step to step (no allocation), and the norms a few fused ops. Sharded engines hand
over their local parts (launch.instruments.gradients): shards summed, replicas counted once.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np
import torch
from normlab.launch.callbacks import Callback, TrainerView
from normlab.launch.config.instruments import checked_settings
from normlab.launch.instruments.common import (
    ROLLBACKS,
    UPDATE_NORM,
    UPDATE_RATIO_MAX,
    UPDATE_SPIKE_STEPS,
    UPDATE_SPIKES,
    block_key,
    blocks,
    is_log_step,
)
from normlab.launch.instruments.gradients import flat_parts, grouped_sum_squares, local_parts
from normlab.launch.instruments.spikes import run_window


def _flat(
    trainer: TrainerView, params: list[list[torch.nn.Parameter]]
) -> tuple[list[torch.Tensor], list[int]]:
    """This rank's parameter tensors of every block and the row of each (`flat_parts`)."""
    return flat_parts([local_parts(trainer, ps, "param") for ps in params])


class BlockUpdateSpikes:
    """The spike ratios of one block's update norms, fed one step at a time (host floats)."""

    def __init__(self, window: int, threshold: float) -> None:
        self.window, self.threshold = window, threshold
        self.history: deque[float] = deque(maxlen=window)
        self.spikes = 0
        self.ratio_max = math.nan

    def update(self, norm: float) -> bool:
        """Score one step's update norm; True when it is a spike."""
        if not (math.isfinite(norm) and norm > 0):
            return False
        spike = False
        if len(self.history) == self.window:
            median = float(np.median(self.history))
            ratio = norm / median if median > 0 else math.inf
            self.ratio_max = ratio if math.isnan(self.ratio_max) else max(self.ratio_max, ratio)
            spike = ratio >= self.threshold
            self.spikes += spike
        self.history.append(norm)
        return spike

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "spikes": self.spikes, "ratio_max": self.ratio_max}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        self.history.extend(float(v) for v in state["history"])
        self.spikes, self.ratio_max = int(state["spikes"]), float(state["ratio_max"])


class UpdateSpikes(Callback):
    """Logs per-block update norms, update-spike counts and the largest spike ratio."""

    name = "update_spikes"

    def __init__(self, settings: dict[str, Any] | bool | None = None) -> None:
        s = checked_settings(self.name, settings)
        self.window, self.threshold = s.window, s.threshold
        self.blocks: list[BlockUpdateSpikes] = []
        self.spike_steps = 0
        self.restored: dict[str, Any] | None = None
        self._before: list[torch.Tensor] = []  # W_before, copied into the same buffers each step
        self._rows: torch.Tensor | None = None  # the block row of each buffer (_flat)
        self._armed = False
        self._pending: list[torch.Tensor] = []
        self._last: list[float] = []
        self._rollbacks = 0.0

    def on_train_start(self, trainer: TrainerView) -> None:
        self._params = [list(b.parameters()) for b in blocks(trainer)]
        window = run_window(self.window, trainer.cfg.training.steps)
        if self.restored is not None:  # a resumed run keeps the window it started with
            window = int(self.restored["window"])
        self.blocks = [BlockUpdateSpikes(window, self.threshold) for _ in self._params]
        if self.restored is not None:
            for block, state in zip(self.blocks, self.restored["blocks"], strict=True):
                block.load_state_dict(state)
            self.spike_steps = int(self.restored["spike_steps"])

    def on_after_backward(self, trainer: TrainerView, step: int) -> None:
        tensors, rows = _flat(trainer, self._params)
        if [t.shape for t in self._before] != [t.shape for t in tensors]:
            self._before = [torch.empty_like(t) for t in tensors]
            self._rows = torch.tensor(rows, device=trainer.engine.device)
        if tensors:  # foreach ops refuse empty lists
            torch._foreach_copy_(self._before, tensors)  # one fused copy, no allocation per step
        self._armed = True

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any]) -> None:
        if not self._armed or self._rows is None:
            return
        self._armed = False
        now, _ = _flat(trainer, self._params)
        # ||W_after - W_before|| per part in a few fused ops, summed per block: shards across
        # the ranks, replicas counted once (gradients.grouped_sum_squares)
        if now:  # foreach ops refuse empty lists (a rank may hold no part of the blocks)
            torch._foreach_sub_(self._before, now)  # W_before - W_after, in the buffers
        norms = grouped_sum_squares(trainer, self._before, self._rows, len(self._params)).sqrt()
        rollbacks = float(metrics.get(ROLLBACKS, self._rollbacks))
        if rollbacks != self._rollbacks:  # the policy restored a checkpoint this step
            norms = torch.full_like(norms, math.nan)
            self._rollbacks = rollbacks
        self._pending.append(norms)
        if is_log_step(trainer, step):
            self._flush()
            for i, block in enumerate(self.blocks):
                metrics[block_key(UPDATE_NORM, i)] = self._last[i]
                metrics[block_key(UPDATE_SPIKES, i)] = float(block.spikes)
                if not math.isnan(block.ratio_max):
                    metrics[block_key(UPDATE_RATIO_MAX, i)] = block.ratio_max
            metrics[UPDATE_SPIKE_STEPS] = float(self.spike_steps)

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = torch.stack([t.to(self._pending[0].device) for t in self._pending]).tolist()
        self._pending = []
        for norms in rows:
            flags = [block.update(v) for block, v in zip(self.blocks, norms, strict=True)]
            self.spike_steps += any(flags)
        self._last = rows[-1]

    def state_dict(self) -> dict[str, Any]:
        self._flush()  # a checkpoint step need not be a log step
        return {
            "window": self.blocks[0].window if self.blocks else self.window,
            "blocks": [b.state_dict() for b in self.blocks],
            "spike_steps": self.spike_steps,
            "rollbacks": self._rollbacks,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = state
        self._pending = []
        self._rollbacks = float(state.get("rollbacks", 0.0))
