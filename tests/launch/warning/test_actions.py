"""What the online actions did, set against the unprotected twins (launch/warning/actions.py):
each outcome and table cell checked against values written out by hand."""

import math
import statistics

from normlab.launch.warning.actions import final_loss, outcome, table
from normlab.launch.warning.scoring import wilson


def _cfg(lr: float, seed: int, action: str) -> dict:
    return {
        "optim": {"lr": lr},
        "training": {"seed": seed},
        "instruments": {"early_warning": {"action": action}},
    }


def _rows(losses: list[float], alarms_from: int | None = None, restores: int = 0) -> list[dict]:
    out = []
    for step, loss in enumerate(losses, start=1):
        row = {"step": step, "loss": loss}
        fired = alarms_from is not None and step >= alarms_from
        row["early_warning/alarms"] = 1.0 if fired else 0.0
        row["early_warning/rollbacks"] = float(restores if fired else 0)
        row["early_warning/lr_scale"] = 0.5 if fired else 1.0
        out.append(row)
    return out


def test_final_loss_is_the_median_of_the_last_11_finite_losses():
    losses = [float(x) for x in range(1, 31)] + [math.nan]
    assert final_loss([{"loss": v} for v in losses]) == statistics.median(range(20, 31))
    assert final_loss([{"loss": math.nan}]) is None


def test_a_saved_run_and_a_lost_one_against_their_twins():
    twin = ({"events": [{"kind": "nonfinite", "step": 40}]}, _rows([6.0] * 39 + [math.nan]))
    saved = outcome(_cfg(0.05, 2, "backoff"), {"events": []}, _rows([6.0] * 60, 25, 1), twin)
    assert saved.first_alarm == 25 and saved.fired_first and saved.saved
    assert (saved.restores, saved.lr_scale, saved.final_loss) == (1, 0.5, 6.0)
    lost = outcome(
        _cfg(0.05, 3, "backoff"),
        {"events": [{"kind": "nonfinite", "step": 45}]},
        _rows([6.0] * 44 + [math.nan], 42),
        ({"events": [{"kind": "nonfinite", "step": 41}]}, _rows([6.0] * 41)),
    )
    assert lost.first_alarm == 42 and not lost.fired_first and not lost.saved
    healthy = outcome(_cfg(0.02, 2, "backoff"), {}, _rows([5.5] * 60, 30), ({}, _rows([5.5] * 60)))
    assert not healthy.saved and not healthy.fired_first and healthy.alarms == 1

    text = table([saved, lost, healthy])
    row05 = next(line for line in text.splitlines() if line.startswith("| 0.05 "))
    lo, hi = wilson(1, 2)
    assert row05 == (
        f"| 0.05 | backoff | 2 (2, 3) | 2, 40.5 | 1/2 (15) | 1/2 [{lo:.2f}, {hi:.2f}] | - | "
        "0.5, 0.5 | 6 (6) |"
    )
    row02 = next(line for line in text.splitlines() if line.startswith("| 0.02 "))
    assert "| 0 | - | - | 1 in 1 runs |" in row02
    every = next(line for line in text.splitlines() if line.startswith("| all "))
    assert every.startswith("| all | backoff | 3 (2, 3) | 2, 40.5 | 1/2 (15) |")
    assert "| 1 in 1 runs |" in every
