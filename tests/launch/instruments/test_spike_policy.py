"""Spike policy through the real trainer: bad steps are skipped (weights untouched), more than
max_bad_steps in a row roll back to the last good checkpoint together with the policy's windows
saved there, every skip and rollback is counted and printed; non-finite values with no checkpoint
stop the run as diverged.
(Long synthetic scenarios: test_spike_policy_scenarios.py.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from normlab.launch.callbacks import Callback
from normlab.launch.config import load_config
from normlab.launch.instruments import SpikePolicy
from normlab.launch.instruments.policy import last_checkpoint_before
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.trainer import Trainer
from rich.console import Console

from tests.conftest import REPO, tiny_overrides

PRE = REPO / "recipes" / "pre.yaml"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))


class Inject(Callback):
    """Corrupts the gradients on chosen steps and records the weights after each step."""

    name = "inject"

    def __init__(self, nan_steps: set[int], big_steps: set[int]) -> None:
        self.nan_steps, self.big_steps = nan_steps, big_steps
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_after_backward(self, trainer, step: int) -> None:  # noqa: ANN001
        for p in trainer.engine.model.parameters():
            if step in self.nan_steps:
                p.grad.fill_(math.nan)
            elif step in self.big_steps:
                p.grad.mul_(1e6)

    def on_step_end(self, trainer, step: int, metrics: dict) -> None:  # noqa: ANN001
        self.weights[step] = {k: v.clone() for k, v in trainer.engine.model.state_dict().items()}


def _trainer(data: Path, run: Path, inject: Inject, **kw: object) -> tuple[Trainer, Console]:
    overrides = tiny_overrides(data, run, training__steps=10, **kw) + [
        "instruments.spike_policy.window=3",
        "instruments.spike_policy.k=6.0",
        "instruments.spike_policy.max_bad_steps=3",
    ]
    console = Console(record=True, width=200)
    cfg = load_config(REPO / "recipes" / "pre.yaml", overrides)
    return Trainer(cfg, callbacks=[inject], console=console), console


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_skip_then_rollback_then_spike_skip(tiny_data: Path, tmp_path: Path) -> None:
    inject = Inject(nan_steps={5, 6, 7, 8}, big_steps={9})
    trainer, console = _trainer(tiny_data, tmp_path / "run", inject, checkpoint__every=3)
    assert trainer.run() == 0  # NaN gradients on skipped steps do not end the run
    w = inject.weights
    assert all(same(w[s], w[4]) for s in (5, 6, 7))  # skipped (max_bad_steps 3): untouched
    assert same(w[8], w[3]) and not same(w[4], w[3])  # the 4th bad step rolls back to step 3
    assert same(w[9], w[8]) and not same(w[10], w[9])  # a 1e6x gradient spike is skipped too
    rows = {r["step"]: r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r}
    assert [rows[s]["skipped"] for s in range(1, 11)] == [0, 0, 0, 0, 1, 1, 1, 1, 1, 0]
    assert rows[6]["skipped_steps"] == 2 and rows[10]["skipped_steps"] == 5
    assert rows[7]["rollbacks"] == 0 and rows[8]["rollbacks"] == 1 and rows[10]["rollbacks"] == 1
    text = console.export_text()
    for step in (5, 6, 7, 8, 9):
        assert f"skipped step {step}:" in text
    assert "rolled back to step_00000003" in text and "steps 4..8 are skipped" in text
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"


def test_no_checkpoint_and_non_finite_stops_as_diverged(tiny_data: Path, tmp_path: Path) -> None:
    inject = Inject(nan_steps={2, 3, 4, 5}, big_steps=set())
    trainer, console = _trainer(
        tiny_data, tmp_path / "run", inject, checkpoint__every=0, training__log_every=6
    )
    assert trainer.run() == 1
    # steps 1..4 were pending (log every 6) when step 5 stopped the run: they are on record
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [4] and rows[0]["skipped_steps"] == 3
    text = console.export_text()
    assert "4 bad steps in a row (steps 2..5) with non-finite values" in text
    assert "no checkpoint before step 2" in text
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_step"] == 5
    assert "no checkpoint before step 2" in summary["message"]


def test_rollback_restores_the_windows_saved_with_the_checkpoint(
    tiny_data: Path, tmp_path: Path
) -> None:
    inject = Inject(nan_steps={5, 6, 7, 8}, big_steps=set())
    trainer, _ = _trainer(tiny_data, tmp_path / "run", inject, checkpoint__every=3)
    saved: dict[int, list[float]] = {}
    policy = next(cb for cb in trainer.callbacks if isinstance(cb, SpikePolicy))
    original = policy.state_dict

    def spy() -> dict:
        state = original()
        saved[len(saved)] = list(state["windows"]["loss"])
        return state

    policy.state_dict = spy  # type: ignore[method-assign]
    windows_after: dict[int, list[float]] = {}

    class Watch(Callback):
        def on_step_end(self, trainer, step: int, metrics: dict) -> None:  # noqa: ANN001
            windows_after[step] = list(policy.windows["loss"])

    trainer.callbacks.append(Watch())
    assert trainer.run() == 0
    # rolled back at step 8 to step_00000003: the windows are those saved at step 3
    assert windows_after[8] == saved[0] and windows_after[7] != saved[0]


def test_judge_one_sided_window_and_fp16_grad_norm() -> None:
    policy = SpikePolicy({"window": 4, "k": 2.0})
    for v in (1.0, 1.2, 0.8, 1.0):
        policy.windows["loss"].append(v)
        policy.windows["grad_norm"].append(v)
    # window mean 1, population std sqrt(0.02) = 0.1414: 1.3 is 2.12 std above, 0.7 below
    assert "std above" in policy.judge({"loss": 1.3, "grad_norm": 1.0}, fp16=False)
    assert policy.judge({"loss": 0.7, "grad_norm": 1.0}, fp16=False) is None
    assert policy.judge({"loss": 1.0, "grad_norm": math.inf}, fp16=True) is None
    assert "non-finite grad_norm" in policy.judge({"loss": 1.0, "grad_norm": math.inf}, False)
    assert "non-finite loss" in policy.judge({"loss": math.nan, "grad_norm": 1.0}, fp16=True)


def test_last_checkpoint_before() -> None:
    dirs = [Path(f"step_{s:08d}") for s in (2, 4, 6)]
    assert last_checkpoint_before(dirs, 5) == Path("step_00000004")
    assert last_checkpoint_before(dirs, 4) == Path("step_00000002")
    assert last_checkpoint_before(dirs, 2) is None


def test_rollback_keeps_the_recipe_values_of_a_forced_resume(
    tiny_data: Path, tmp_path: Path
) -> None:
    """A rollback target saved before `--force optim.lr=...` must not bring its old optimizer
    values back: the rollback restores like a resume (launch.rundir.resume)."""
    run = tmp_path / "run"
    over = tiny_overrides(tiny_data, run, checkpoint__every=4, schedule__kind="constant")
    assert Trainer(load_config(PRE, [*over, "training.steps=4", "optim.lr=1e-3"])).run() == 0
    inject = Inject(nan_steps={6, 7, 8, 9}, big_steps=set())
    settings = [f"instruments.spike_policy.{k}" for k in ("window=3", "k=6.0", "max_bad_steps=3")]
    cfg = load_config(PRE, [*over, "training.steps=10", "optim.lr=5e-4", *settings])
    console = Console(record=True, width=200)
    trainer = Trainer(cfg, force=True, callbacks=[inject], console=console)
    assert trainer.run() == 0
    assert "rolled back to step_00000004" in console.export_text()
    rows = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}
    assert rows[8]["rollbacks"] == 0 and rows[9]["rollbacks"] == 1
    assert [rows[s]["lr"] for s in (9, 10)] == [5e-4, 5e-4]  # constant schedule after warm-up
    assert all(g["lr"] == 5e-4 for g in trainer.engine.optimizer.param_groups)


@pytest.mark.parametrize(("window", "first"), [(3, 3), (30, 20), (200, 100), (1000, 500)])
def test_judging_needs_half_a_window_and_at_least_20_values(window: int, first: int) -> None:
    """OLMo-core's SkipStepOptimizer: no verdict before max(20, window // 2) values (a window
    shorter than 20 must be full)."""
    policy = SpikePolicy({"window": window, "k": 2.0})
    for n in range(window + 1):  # n good values in the window
        judged = policy.judge({"loss": 100.0, "grad_norm": 1.0}, fp16=False) is not None
        assert judged == (n >= first), n
        policy.windows["loss"].append(1.0 + 0.01 * (n % 2))
        policy.windows["grad_norm"].append(1.0)
