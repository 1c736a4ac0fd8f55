"""`normlab warnings` on synthetic runs whose precursor leads the event by a known number of steps:
tuned on seeds {0, 1}, reported on the others, against the loss baseline."""

import json
import math

import numpy as np
import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.warning.evaluate import RunData, evaluate
from normlab.launch.warning.scoring import RunAlarms, score

STEPS, LEAD = 600, 30


def synthetic(seed: int, event: int | None) -> tuple[list[int], list[float], list[float]]:
    """Loss and grad norm with log-normal noise; with an event, the grad norm jumps x10 from
    event - LEAD on and the loss x3 from the event on."""
    rng = np.random.default_rng(seed + (1000 if event is None else 0))
    steps = list(range(1, STEPS + 1))
    loss = 3.0 * np.exp(rng.normal(0, 0.02, STEPS))
    grad = np.exp(rng.normal(0, 0.05, STEPS))
    if event is not None:
        grad[event - LEAD - 1 :] *= 10.0  # z about 46: caught by every k up to 30
        loss[event - 1 :] *= 3.0
    return steps, loss.tolist(), grad.tolist()


def run_data(seed: int, event: int | None) -> RunData:
    steps, loss, grad = synthetic(seed, event)
    d = RunData(
        f"r{seed}{'e' if event else 'h'}", seed, STEPS, 10, event, "divergence" if event else None
    )
    d.series = {"loss": [(steps, loss)], "grad_norm": [(steps, grad)]}
    return d


def test_a_precursor_with_a_known_lead_beats_the_loss():
    runs = [run_data(s, 400 + 10 * s) for s in range(10)] + [run_data(s, None) for s in range(10)]
    results, tuning, held = evaluate(runs)
    assert len(tuning) == 4 and len(held) == 16
    by = {r.signal.name: r for r in results}
    grad, loss = by["grad_norm"].row(), by["loss"].row()
    assert grad["events"] == 8 and grad["lead_median"] == LEAD  # the first alarm: the jump
    assert grad["recall@10"] == 1.0 and loss["recall@1"] == 0.0  # the loss alarms at t_E only
    assert grad["recall@50"] == 0.0
    assert by["grad_norm"].mcnemar_p == pytest.approx(2 * 0.5**8)  # 8 discordant pairs
    assert by["grad_norm"].beats_loss
    lo, hi = grad["recall@10_ci"]
    assert lo == pytest.approx(0.6756, abs=1e-4) and hi == 1.0  # Wilson, 8 of 8


def test_the_tuned_threshold_keeps_false_alarms_within_budget_on_tuning_seeds():
    runs = [run_data(s, 400) for s in range(4)] + [run_data(s, None) for s in range(4)]
    _, tuning, _ = evaluate(runs)
    results, _, _ = evaluate(runs)
    for r in results:
        s = r.tuned.tune
        assert s.false_per_1000 <= 1.0 or not r.tuned.met_budget
        again = score(
            [
                RunAlarms(d.name, d.steps, d.event, d.alarms(r.signal, r.tuned.k, r.tuned.level))
                for d in tuning
            ]
        )
        assert again == s


def test_command_writes_report_and_says_when_nothing_beats_the_loss(tmp_path):
    root = tmp_path / "study"
    for seed in range(4):
        for event in (450, None):
            steps, loss, _ = synthetic(seed, event)  # no grad-norm precursor: loss only
            run = root / f"s{seed}{'e' if event else 'h'}"
            run.mkdir(parents=True)
            cfg = {
                "name": "x",
                "training": {"seed": seed, "steps": STEPS},
                "schedule": {"warmup_steps": 10},
            }
            (run / "config.yaml").write_text(yaml.safe_dump(cfg))
            rows = [
                {"step": s, "loss": v, "grad_norm": 1.0 + 0.01 * (s % 5)}
                for s, v in zip(steps, loss, strict=True)
            ]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["warnings", str(root), "--out", str(out)]) == 0
    data = json.loads((out / "warnings.json").read_text())
    assert len(data["held_out_runs"]) == 4 and "No signal warns earlier" in data["conclusion"]
    assert (out / "recall_vs_false_alarms.png").stat().st_size > 0
    md = (out / "warnings.md").read_text()
    assert "| loss |" in md and "2 with an event" in md
    loss = next(s for s in data["signals"] if s["signal"] == "loss")
    assert loss["events"] == 2 and not math.isnan(loss["false_per_1000"])
