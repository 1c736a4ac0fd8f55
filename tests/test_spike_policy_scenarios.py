"""The spike policy never freezes a run (issue 11): synthetic runs in which the loss follows the
number of updates actually applied, and checkpoints hold (applied updates, the policy's state) as
the trainer's do. Each scenario ends with applied updates close to the number of steps, or with
the run stopped as diverged and a message saying why."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from normlab.launch.instruments import SpikePolicy
from normlab.launch.training.callbacks import StopRun

Values = Callable[[int, int], tuple[float, float]]  # (step, applied updates) -> (loss, grad norm)


class SimRun:
    """A stand-in trainer whose 'model' is the count of applied updates."""

    def __init__(self, policy: SpikePolicy, ckpt_every: int, fp16: bool = False) -> None:
        self.policy, self.every = policy, ckpt_every
        self.applied = 0
        self.saved: dict[int, tuple[int, dict]] = {}
        self.messages: list[str] = []
        self.loads: list[str] = []
        self.cfg = SimpleNamespace(precision=SimpleNamespace(dtype="fp16" if fp16 else "fp32"))
        self.ckpt = SimpleNamespace(
            step_dirs=lambda: [Path(f"step_{s:08d}") for s in sorted(self.saved)],
            restore=lambda engine, path: engine.load(path),
        )
        self.engine = SimpleNamespace(
            is_main=True, all_reduce=lambda t, op="sum": t, load=self._load
        )
        self.console = SimpleNamespace(print=lambda text, **kw: self.messages.append(text))

    def _load(self, path: Path) -> dict:
        self.loads.append(path.name)
        applied, state = self.saved[int(path.name.split("_")[1])]
        self.applied = applied
        return {"callbacks": {"spike_policy": copy.deepcopy(state)}}

    def run(self, steps: int, values: Values) -> str:
        for step in range(1, steps + 1):
            loss, grad = values(step, self.applied)
            skip = self.policy.should_skip_step(self, step, torch.tensor(loss), torch.tensor(grad))
            self.applied += not skip
            try:
                self.policy.on_step_end(self, step, {})
            except StopRun as stop:
                self.stopped_at, self.reason = step, str(stop)
                return "diverged"
            if self.every and step % self.every == 0:
                self.saved[step] = (self.applied, copy.deepcopy(self.policy.state_dict()))
        return "completed"


def noise(seed: int, n: int, sigma: float) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, sigma, n + 1)


STEPS = 3000


def level_shift(at: int) -> Values:
    """Loss flat near 3; the gradient norm steps up x1.2 from step `at` for good."""
    eps = noise(0, STEPS, 0.01)
    return lambda step, applied: (3.0 + eps[step], (1.2 if step >= at else 1.0) * (1 + eps[-step]))


def falling_with_spike(*spike_at: int, length: int = 5) -> Values:
    """Loss 2 + 3 exp(-u / 1500) over u applied updates; a transient x3 spike on `length`
    batches from each of `spike_at` (the batches, not the weights, are bad)."""
    eps = noise(1, STEPS, 0.002)

    def values(step: int, applied: int) -> tuple[float, float]:
        loss = 2.0 + 3.0 * math.exp(-applied / 1500) + eps[step]
        factor = 3.0 if any(s <= step < s + length for s in spike_at) else 1.0
        return loss * factor, 1.0 * factor + eps[-step]

    return values


def policy(**kw: object) -> SpikePolicy:
    return SpikePolicy({"window": 200, "k": 7.0, "max_bad_steps": 5, **kw})


def test_permanent_level_shift_with_checkpoints_stops_as_diverged() -> None:
    sim = SimRun(policy(), ckpt_every=500)
    assert sim.run(STEPS, level_shift(at=1201)) == "diverged"
    # five bad steps, a rollback to step 1000 with its windows, five more bad: same checkpoint,
    # no good step in between
    assert sim.loads == ["step_00001000"] and sim.stopped_at == 1210
    assert "no good step in between" in sim.reason and "step_00001000" in sim.reason


@pytest.mark.parametrize("settings", [{"rollback": False}, {}])
def test_permanent_level_shift_without_checkpoint_is_accepted(settings: dict) -> None:
    sim = SimRun(policy(**settings), ckpt_every=0)
    assert sim.run(STEPS, level_shift(at=1201)) == "completed"
    assert sim.policy.skipped == 5 and sim.policy.rebaselines == 1
    assert sim.applied == STEPS - 5  # the shift is the new level after re-baselining
    assert any("accepting them as the new level" in m for m in sim.messages)


def test_transient_spike_on_falling_loss_with_old_checkpoints() -> None:
    """Checkpoints every 1000 steps, window 200: the rollback returns to a model whose loss is
    well above the last window's; that window must come back with the model."""
    sim = SimRun(policy(), ckpt_every=1000)
    assert sim.run(STEPS, falling_with_spike(1801)) == "completed"
    assert sim.loads == ["step_00001000"] and sim.policy.rollbacks == 1
    assert sim.policy.skipped == 5
    # lost: the 5 skipped steps and the 800 updates of steps 1001..1800 that the rollback undid
    assert sim.applied == STEPS - 5 - 800


def test_transient_spike_without_checkpoint_skips_only_the_spike() -> None:
    sim = SimRun(policy(), ckpt_every=0)
    assert sim.run(STEPS, falling_with_spike(1801)) == "completed"
    assert sim.policy.skipped == 5 and sim.applied == STEPS - 5


def test_more_rollbacks_than_allowed_stops_as_diverged() -> None:
    sim = SimRun(policy(max_rollbacks=2), ckpt_every=500)
    assert sim.run(STEPS, falling_with_spike(601, 1301, 2101)) == "diverged"
    assert sim.policy.rollbacks == 2 and sim.stopped_at == 2105
    assert "max_rollbacks (2)" in sim.reason


def test_non_finite_without_checkpoint_stops_as_diverged() -> None:
    sim = SimRun(policy(), ckpt_every=0)
    status = sim.run(100, lambda step, applied: (math.nan if step > 50 else 3.0, 1.0))
    assert status == "diverged" and sim.stopped_at == 55 and "non-finite" in sim.reason


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"rollback": "no"}, "spike_policy.rollback must be bool"),
        ({"window": True}, "spike_policy.window must be int"),
        ({"k": float("nan")}, "spike_policy.k must be a finite number"),
        ({"k": float("inf")}, "spike_policy.k must be a finite number"),
        ({"max_rollbacks": -1}, "max_rollbacks >= 0"),
        ({"max_rollbacks": 2.5}, "spike_policy.max_rollbacks must be int"),
        ({"max_bad": 3}, "unknown key 'instruments.spike_policy.max_bad'"),
    ],
)
def test_bad_settings_are_config_errors(settings: dict, match: str) -> None:
    from normlab.launch.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        SpikePolicy(settings)
