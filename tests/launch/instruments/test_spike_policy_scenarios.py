"""The spike policy never freezes a run (issue 11) and gives the same verdict for the same data with
and without checkpoints (issue 23): synthetic runs in which the loss follows the number of updates
actually applied, and checkpoints hold (applied updates, the policy's state) as the trainer's do.
Each scenario ends with applied updates counted exactly, or with the run stopped as diverged and a
message saying why."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from normlab.launch.callbacks import StopRun
from normlab.launch.instruments import SpikePolicy

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


# (checkpoint every, settings): with checkpoints, without, and with rollback switched off
CHECKPOINTS = [(500, {}), (0, {}), (500, {"rollback": False})]


@pytest.mark.parametrize(("every", "settings"), CHECKPOINTS)
def test_level_shift_is_the_new_level_with_or_without_checkpoints(
    every: int, settings: dict
) -> None:
    sim = SimRun(policy(**settings), ckpt_every=every)
    assert sim.run(STEPS, level_shift(at=1201)) == "completed"
    assert sim.policy.rebaselines == 1
    assert any("accepting them as the new level" in m for m in sim.messages)
    if every and not settings:
        # 6 bad steps (past max_bad_steps 5) roll back to step 1000; 6 more right after the
        # rollback confirm the shift: re-baselined. Lost: 12 skips + the 200 undone updates.
        assert sim.loads == ["step_00001000"] and sim.policy.skipped == 12
        assert sim.applied == STEPS - 12 - 200
        assert any("began right after a rollback" in m for m in sim.messages)
    else:
        assert sim.loads == [] and sim.policy.skipped == 6 and sim.applied == STEPS - 6


@pytest.mark.parametrize("every", [500, 0])
def test_five_step_spike_is_skipped_without_rollback(every: int) -> None:
    """max_bad_steps (5) bad steps are a passing spike: skipped, nothing undone."""
    sim = SimRun(policy(), ckpt_every=every)
    assert sim.run(STEPS, falling_with_spike(1801, length=5)) == "completed"
    assert sim.loads == [] and sim.policy.rollbacks == 0 and sim.policy.rebaselines == 0
    assert sim.policy.skipped == 5 and sim.applied == STEPS - 5


def test_long_run_of_bad_steps_rolls_back() -> None:
    """8 bad batches: the 6th rolls back to step_00001500; the last 2 are skipped after it."""
    sim = SimRun(policy(), ckpt_every=500)
    assert sim.run(STEPS, falling_with_spike(1801, length=8)) == "completed"
    assert sim.loads == ["step_00001500"] and sim.policy.rollbacks == 1
    assert sim.policy.skipped == 8 and sim.policy.rebaselines == 0
    assert sim.applied == STEPS - 8 - 300  # the updates of steps 1501..1800 are undone
    said = "rolled back to step_00001500; batches of steps 1501..1806"
    assert any(said in m for m in sim.messages)


def test_rollback_to_an_old_checkpoint_brings_its_windows_back() -> None:
    """Checkpoints every 1000 steps, window 200: the rollback returns to a model whose loss is
    well above the last window's; that window must come back with the model."""
    sim = SimRun(policy(), ckpt_every=1000)
    assert sim.run(STEPS, falling_with_spike(1801, length=8)) == "completed"
    assert sim.loads == ["step_00001000"] and sim.policy.rollbacks == 1
    assert sim.policy.skipped == 8
    assert sim.applied == STEPS - 8 - 800


def test_long_run_without_checkpoint_is_decided_on_its_values() -> None:
    """The same 8 bad batches with nothing to roll back to: finite, so the new level (the run
    completes either way); the 2 after the 6th are not judged until a window is half full."""
    sim = SimRun(policy(), ckpt_every=0)
    assert sim.run(STEPS, falling_with_spike(1801, length=8)) == "completed"
    assert sim.policy.rebaselines == 1 and sim.policy.skipped == 6 and sim.applied == STEPS - 6


@pytest.mark.parametrize("at", [100, 101])
def test_judging_starts_from_half_a_window(at: int) -> None:
    """window 200: step 101 is judged against the 100 values before it; step 100 is not."""
    sim = SimRun(policy(), ckpt_every=0)
    assert sim.run(400, falling_with_spike(at, length=1)) == "completed"
    assert sim.policy.skipped == (1 if at == 101 else 0)


def test_used_up_rollbacks_decide_as_without_a_checkpoint() -> None:
    sim = SimRun(policy(max_rollbacks=2), ckpt_every=500)
    assert sim.run(STEPS, falling_with_spike(601, 1301, 2101, length=8)) == "completed"
    assert sim.policy.rollbacks == 2 and sim.policy.rebaselines == 1
    assert any("max_rollbacks (2) are used" in m for m in sim.messages)


@pytest.mark.parametrize(("every", "stopped_at"), [(0, 56), (20, 62)])
def test_lasting_non_finite_values_stop_with_or_without_checkpoints(
    every: int, stopped_at: int
) -> None:
    """NaN from step 51 on: with no checkpoint the 6th bad step stops the run; with one, the
    rollback to step 40 is answered by 6 more NaN steps, which stop it."""
    sim = SimRun(policy(), ckpt_every=every)
    status = sim.run(100, lambda step, applied: (math.nan if step > 50 else 3.0, 1.0))
    assert status == "diverged" and sim.stopped_at == stopped_at and "non-finite" in sim.reason
    assert sim.loads == (["step_00000040"] if every else [])


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"rollback": "no"}, "spike_policy.rollback must be of type bool"),
        ({"window": True}, "spike_policy.window must be an integer"),
        ({"k": float("nan")}, "spike_policy.k must be a finite number"),
        ({"k": float("inf")}, "spike_policy.k must be a finite number"),
        ({"max_rollbacks": -1}, "max_rollbacks >= 0"),
        ({"max_rollbacks": 2.5}, "spike_policy.max_rollbacks must be an integer"),
        ({"max_bad": 3}, "unknown key 'instruments.spike_policy.max_bad'"),
    ],
)
def test_bad_settings_are_config_errors(settings: dict, match: str) -> None:
    from normlab.launch.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        SpikePolicy(settings)
